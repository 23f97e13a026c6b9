"""onnxfuse/load/shape_values.py: the dims a Reshape target computed from Shape names, for the values a rewrite
creates (onnx's Reshape-13 inference reads only constant targets); the dims a Slice with run-time bounds does
not slice (onnx invents them all)."""

import numpy as np
import onnx.helper as oh
from conftest import make_model
from onnx import TensorProto

from onnxfuse.ir import Model
from onnxfuse.load.loader import load_model
from onnxfuse.load.shape_values import reshape_types, shape_values, slice_types
from onnxfuse.tensors import TensorType


def _model(tail):
    nodes = [oh.make_node("Shape", ["q"], ["qs"]), oh.make_node("Slice", ["qs", "m2", "m1"], ["sq"]),
             oh.make_node("Shape", ["v"], ["vs"]), oh.make_node("Gather", ["vs", "i2"], ["t0"]),
             oh.make_node("Unsqueeze", ["t0", "z"], ["tk"]), *tail]
    inits = {"m2": np.array([-2]), "m1": np.array([-1]), "i2": np.array(2), "z": np.array([0]),
             "ones": np.array([1, 1]), "keep": np.array([0, -1])}
    m = make_model(nodes, [("q", ["b", 4, 1, 16]), ("v", ["b", 4, "t", 16]), ("x", [2, 3, 8])],
                   [("y", None)], inits, opset=13)
    return Model(m, "").graph, list(m.graph.node)


def test_reshape_target_from_shapes_names_its_dims():
    g, protos = _model([oh.make_node("Concat", ["ones", "sq", "tk"], ["ms"], axis=0),
                        oh.make_node("Reshape", ["x", "ms"], ["y"])])
    assert shape_values(g, protos)["ms"] == ((1, 1, 1, "t"), False)
    assert reshape_types(g, protos, {}) == {"y": TensorType(TensorProto.FLOAT, (1, 1, 1, "t"))}


def test_reshape_zero_and_minus_one():
    g, protos = _model([oh.make_node("Reshape", ["x", "keep"], ["y"])])
    assert reshape_types(g, protos, {}) == {"y": TensorType(TensorProto.FLOAT, (2, 24))}
    g, protos = _model([oh.make_node("Reshape", ["q", "keep"], ["y"])])   # -1 of a symbolic size: unknown
    assert reshape_types(g, protos, {}) == {"y": TensorType(TensorProto.FLOAT, ("b", None))}


def test_reshape_target_not_from_shapes_claims_nothing():
    g, protos = _model([oh.make_node("Cast", ["tk"], ["c"], to=TensorProto.INT64),     # not followed
                        oh.make_node("Concat", ["ones", "sq", "c"], ["ms"], axis=0),
                        oh.make_node("Reshape", ["x", "ms"], ["y"])])
    assert "ms" not in shape_values(g, protos) and reshape_types(g, protos, {}) == {}


def test_slice_with_run_time_bounds_keeps_the_dims_it_does_not_slice(tmp_path):
    """buffer[:, 0:s] of a [1, 16] buffer (BERT's position ids): onnx infers [unk, unk]; the loader keeps the 1.
    Without axes the Slice slices the first len(starts) axes; a Slice on every axis gains nothing."""
    from conftest import save

    nodes = [oh.make_node("Shape", ["x"], ["xs"]), oh.make_node("Gather", ["xs", "one"], ["s0"]),
             oh.make_node("Unsqueeze", ["s0", "z"], ["end"]),
             oh.make_node("Slice", ["buf", "z", "end", "one1"], ["pid"]),
             oh.make_node("Slice", ["buf", "z", "end"], ["rows"]),
             oh.make_node("Slice", ["buf", "z2", "end2"], ["both"]),
             oh.make_node("Concat", ["end", "end"], ["end2"], axis=0)]
    inits = {"buf": np.arange(16)[None, :], "one": np.array(1), "z": np.array([0]), "one1": np.array([1]),
             "z2": np.array([0, 0])}
    outs = [(o, None, TensorProto.INT64) for o in ("pid", "rows", "both")]
    m = make_model(nodes, [("x", ["b", "s"])], outs, inits, opset=13)
    model, _ = load_model(save(m, tmp_path / "m.onnx"))
    t = model.graph.types
    assert t["pid"].shape[0] == 1 and t["rows"].shape[1] == 16 and 1 not in t["both"].shape
    assert slice_types(model.graph, [n.proto for n in model.graph.nodes]) == {}   # nothing more to gain
