"""The layout and scalar concepts (match/algebra.py): a chain of data movement is proved to be a rearrangement
whatever ops spell it, scalar factors fold (constants and shape arithmetic of static dims), and a layout text
that does not parse is one error line with its column."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from onnxfuse.ir import Model
from onnxfuse.match.algebra import Unprovable, prove_layout, scalar_factor
from onnxfuse.patterns.layouts import LayoutError, parse_layout


def _graph(nodes, inits, out_shape=None):
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    g = oh.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m = onnx.shape_inference.infer_shapes(m)
    return Model(m, ".").graph


def _i64(*v):
    return np.asarray(v, dtype=np.int64)


def test_transpose_first_then_computed_reshape_is_the_head_split():
    """x [b, s, 64] -> Transpose [b, 64, s] -> Reshape [b, 4, 16, s] (s read from Shape) -> Transpose
    [b, 4, s, 16]: the 'b s (n d) -> b n s d' split, n = 4, d = 16, b and s the model's own dims."""
    nodes = [
        oh.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        oh.make_node("Shape", ["x"], ["sh"]),
        oh.make_node("Gather", ["sh", "one"], ["sq"], axis=0),
        oh.make_node("Concat", ["zero", "nd", "sq"], ["tgt"], axis=0),
        oh.make_node("Reshape", ["t", "tgt"], ["r"]),
        oh.make_node("Transpose", ["r"], ["y"], perm=[0, 1, 3, 2]),
    ]
    g = _graph(nodes, {"one": _i64(1), "zero": _i64(0), "nd": _i64(4, 16)})
    proof = prove_layout(g, "x", "y", frozenset(), parse_layout("b s (n d) -> b n s d"))
    assert proof.atoms == {"b": "batch", "s": "seq", "n": 4, "d": 16}
    with pytest.raises(Unprovable, match="not arranged as"):  # the same shapes, another element map
        prove_layout(g, "x", "y", frozenset(), parse_layout("b s (d n) -> b n s d"))


def test_heads_folded_into_the_batch_are_their_own_layout():
    nodes = [oh.make_node("Reshape", ["x", "s4"], ["r"]), oh.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             oh.make_node("Shape", ["x"], ["sh"]), oh.make_node("Gather", ["sh", "one"], ["sq"], axis=0),
             oh.make_node("Concat", ["minus", "sq", "d"], ["s3"], axis=0), oh.make_node("Reshape", ["t", "s3"], ["y"])]
    g = _graph(nodes, {"s4": _i64(0, 0, 4, 16), "one": _i64(1), "minus": _i64(-1), "d": _i64(16)})
    assert prove_layout(g, "x", "y", frozenset(), parse_layout("b s (n d) -> (b n) s d")).atoms["n"] == 4
    with pytest.raises(Unprovable, match="rank 3, the layout names 4"):
        prove_layout(g, "x", "y", frozenset(), parse_layout("b s (n d) -> b n s d"))


def test_a_scale_computed_from_a_static_head_size_folds():
    """Optimum's scale: 1 / Sqrt(Cast(Gather(Shape(q), -1))) with a static last dim is one number."""
    nodes = [
        oh.make_node("Reshape", ["x", "s4"], ["q"]),
        oh.make_node("Shape", ["q"], ["sh"]),
        oh.make_node("Gather", ["sh", "last"], ["d"], axis=0),
        oh.make_node("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        oh.make_node("Sqrt", ["df"], ["sd"]),
        oh.make_node("Div", ["q", "sd"], ["y"]),
    ]
    g = _graph(nodes, {"s4": _i64(0, 0, 4, 16), "last": _i64(-1).reshape(())})
    div = g.producer["y"]
    data, factor = scalar_factor(g, div, 4)
    assert data == "q" and factor == pytest.approx(1 / math.sqrt(16))


def test_a_scale_that_depends_on_a_run_time_dim_is_not_a_factor():
    nodes = [oh.make_node("Shape", ["x"], ["sh"]), oh.make_node("Gather", ["sh", "one"], ["n"], axis=0),
             oh.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT), oh.make_node("Div", ["x", "nf"], ["y"])]
    g = _graph(nodes, {"one": _i64(1).reshape(())})
    assert scalar_factor(g, g.producer["y"], 3) is None


@pytest.mark.parametrize(("text", "message"), [
    ("b s (n d) -> b n s", "axis 'd' is on one side of the layout only"),
    ("b s (n (d)) -> b n s d", "groups do not nest"),
    ("b s n d", "a layout is 'source axes -> result axes'"),
    ("b s s -> b s", "axis 's' appears twice on the source side"),
])
def test_layout_texts_that_do_not_parse(text, message):
    with pytest.raises(LayoutError, match=message):
        parse_layout(text)


def test_a_bad_layout_in_a_pattern_file_is_one_line_with_its_column(tmp_path):
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.patterns.parser import load_file

    f = tmp_path / "p.yaml"
    f.write_text('rules:\n- id: r\n  match:\n    Y: layout(Relu(X), "b s (n d) -> b n s")\n'
                 '  rewrite:\n    Y: Relu(X)\n')
    with pytest.raises(OnnxfuseError) as e:
        load_file(str(f))
    assert f"{f}:4:" in str(e.value) and "axis 'd' is on one side of the layout only" in str(e.value)
