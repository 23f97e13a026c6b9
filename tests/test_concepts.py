"""The layout, scalar and mask concepts (concepts/layout.py, concepts/masked.py and their proofs): a chain of data movement is proved
to be a rearrangement whatever ops spell it, scalar factors fold (constants and shape arithmetic of static dims),
every spelling of an additive mask is one mask, and a concept that does not parse is one error line with its
column."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from onnxfuse.concepts.layout_proof import prove_layout, scalar_factor
from onnxfuse.concepts.layout_text import LayoutError, parse_layout
from onnxfuse.concepts.shape_ops import Unprovable
from onnxfuse.ir import Model


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


# ----- the mask concept: masked(x, M) ------------------------------------------------------------------------
MASKED_RULE = """\
rules:
- id: masked-softmax
  doc: A user's rule on the mask concept - Softmax of masked scores, the mask as one tensor (subtracted
    negated, a form the concept does not take again).
  match:
    Y: Softmax(masked(Relu(S), M{rows}), axis=-1)
  rewrite:
    r: Relu(S)
    n: Neg(M)
    a: Sub(r, n)
    Y: Softmax(a, axis=-1)
"""


def _masked_scores(spell: str):
    """Softmax over [2, 4, 8, 8] scores masked in one of several spellings; returns (model, feeds)."""
    rng = np.random.default_rng(0)
    keep = np.ones((2, 1, 1, 8), bool)
    keep[1, ..., 5:] = False
    ins = {"s": ([2, 4, 8, 8], TensorProto.FLOAT), "keep": ([2, 1, 1, 8], TensorProto.BOOL),
           "rel": ([1, 4, 8, 8], TensorProto.FLOAT), "pad": ([2, 1, 1, 8], TensorProto.FLOAT),
           "causal": ([8, 8], TensorProto.FLOAT)}
    nodes = [oh.make_node("Relu", ["s"], ["r"])]
    if spell == "where":        # masked_fill(~keep, finfo.min)
        nodes.append(oh.make_node("Where", ["keep", "r", "fmin"], ["w"]))
    elif spell == "where_first":  # Where(masked, -inf, s), the operands the other way round
        nodes += [oh.make_node("Not", ["keep"], ["drop"]), oh.make_node("Where", ["drop", "ninf", "r"], ["w"])]
    elif spell == "bias_where_pad":  # a position bias, then a Where mask, then a padding row: three terms
        nodes += [oh.make_node("Add", ["rel", "r"], ["b1"]), oh.make_node("Where", ["keep", "b1", "fmin"], ["b2"]),
                  oh.make_node("Add", ["b2", "pad"], ["w"])]
    elif spell == "causal":     # a rank-2 mask
        nodes.append(oh.make_node("Add", ["r", "causal"], ["w"]))
    nodes.append(oh.make_node("Softmax", ["w"], ["y"], axis=-1))
    inits = {"fmin": np.array(np.finfo(np.float32).min, np.float32), "ninf": np.array(-np.inf, np.float32)}
    used = {i for n in nodes for i in n.input}
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info(k, t, sh) for k, (sh, t) in ins.items() if k in used],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])],
                      [numpy_helper.from_array(v, k) for k, v in inits.items() if k in used])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    feeds = {"s": rng.standard_normal((2, 4, 8, 8)).astype(np.float32), "keep": keep,
             "rel": rng.standard_normal((1, 4, 8, 8)).astype(np.float32),
             "pad": np.where(rng.random((2, 1, 1, 8)) < 0.3, -10000.0, 0.0).astype(np.float32),
             "causal": np.triu(np.full((8, 8), -np.inf, np.float32), 1)}
    return model, {k: v for k, v in feeds.items() if k in used}


@pytest.mark.parametrize(("spell", "rows", "ops"), [
    ("where", "", ["Where", "Relu", "Neg", "Sub", "Softmax"]),
    ("where_first", "", ["Not", "Where", "Relu", "Neg", "Sub", "Softmax"]),
    ("bias_where_pad", "", ["Where", "Add", "Add", "Relu", "Neg", "Sub", "Softmax"]),
    ("causal", "", ["Relu", "Neg", "Sub", "Softmax"]),  # one value: M is it
    ("causal", ", rows=S", ["Unsqueeze", "Relu", "Neg", "Sub", "Softmax"]),  # every row: made rank 4
    ("where", ", rows=S", ["Where", "Shape", "Gather", "Concat", "Expand", "Relu", "Neg", "Sub", "Softmax"]),  # one row
])
def test_a_users_rule_on_the_mask_concept(tmp_path, spell, rows, ops):
    """A rule of the user's own on `masked`: every spelling is one mask M, built by the rewrite where no single
    value is it (the terms summed in the model's order), and onnxruntime gives the original's result."""
    import onnxruntime as ort

    from onnxfuse import OptimizeOptions, optimize

    model, feeds = _masked_scores(spell)
    src, out, pat = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "p.yaml"
    onnx.save(model, src)
    pat.write_text(MASKED_RULE.format(rows=rows))
    r = optimize(str(src), str(out), OptimizeOptions(patterns=[str(pat)], builtin=False, measure=False, fold=False))
    assert r.fired == {"masked-softmax": 1} and r.validation == "passed"
    got = onnx.load(out)
    assert [n.op_type for n in got.graph.node] == ops, [n.op_type for n in got.graph.node]
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (model, got)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-6, atol=1e-6)
    if spell == "bias_where_pad":
        adds = [n for n in got.graph.node if n.op_type == "Add"]
        assert adds[0].input[0] == "rel" and adds[1].input[1] == "pad"  # rel + where, then + pad


@pytest.mark.parametrize("spell", ["where", "bias_where_pad"])
def test_masked_refuses_a_where_that_is_no_mask(tmp_path, spell):
    """Where(keep, s, -10000) differs from s + Where(keep, 0, -10000) where a row is all masked: not a mask,
    and explain says so, also where other terms were taken before it (its reason is the candidate's, not
    "found Where, expected ..." from the split that stopped at the Where)."""
    from onnxfuse.ir import Model as IRModel
    from onnxfuse.patterns.parser import load_file
    from onnxfuse.rewrite.engine import near_misses

    model, _ = _masked_scores(spell)
    for t in model.graph.initializer:
        if t.name == "fmin":
            t.CopyFrom(numpy_helper.from_array(np.array(-10000.0, np.float32), "fmin"))
    pat = tmp_path / "p.yaml"
    pat.write_text(MASKED_RULE.format(rows=""))
    misses = near_misses(IRModel(onnx.shape_inference.infer_shapes(model), "."), load_file(str(pat)), "cpu",
                         min_progress=0)
    assert misses and all("masked: the Where fill -10000 is not a mask minimum" in m.reason for m in misses), misses


@pytest.mark.parametrize(("line", "col", "message"), [
    ("Softmax(masked(Relu(S)), axis=-1)", 16, "masked takes 2 arguments"),
    ("Softmax(masked(Relu(S), m), axis=-1)", 32, "masked: its second argument names the mask it binds"),
    ("Softmax(masked(Relu(S), M, cols=X), axis=-1)", 40, "masked has no parameter 'cols'"),
    ('computes(S)', 8, "computes takes 2 arguments"),
    ('computes(S, "gelu2")', 21, "computes: no function 'gelu2' (there are: gelu, gelu_tanh, silu, quickgelu, hardsigmoid, hardswish, layernorm, rmsnorm)"),
    ('computes(S, "gelu", eps=E)', 32, "computes 'gelu' has no parameter 'eps' (it has: none)"),
    ('computes(S, "layernorm", eps=e)', 37, "eps= names the number the concept binds"),
])
def test_a_bad_concept_is_one_line_with_its_column(tmp_path, line, col, message):
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.patterns.parser import load_file

    f = tmp_path / "p.yaml"
    f.write_text(f"rules:\n- id: r\n  match:\n    Y: {line}\n  rewrite:\n    Y: Relu(S)\n")
    with pytest.raises(OnnxfuseError) as e:
        load_file(str(f))
    assert f"{f}:4:{col}:" in str(e.value) and message in str(e.value), str(e.value)


def test_a_shape_shape_inference_made_up_far_back_is_worked_out_from_the_graph_inputs():
    """A deep model's last layer: its values' dims are made up by shape inference (unk__N) all the way back to
    the graph input, 200 nodes away. The shape is worked out from the producers (iteratively, any depth), so
    the head split is proved on the model's own dims; a depth-limited walk gave up, guessed, and a 12-layer
    BERT export fused attention in its first three layers only."""
    from onnxfuse.tensors import TensorType

    depth = 200
    nodes = [oh.make_node("Relu", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}"]) for i in range(depth)]
    last = f"r{depth - 1}"
    nodes += [oh.make_node("Shape", [last], ["sh"]), oh.make_node("Gather", ["sh", "zero"], ["b0"], axis=0),
              oh.make_node("Gather", ["sh", "one"], ["s0"], axis=0),
              oh.make_node("Concat", ["b0", "s0", "nd"], ["tgt"], axis=0),
              oh.make_node("Reshape", [last, "tgt"], ["r"]), oh.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    g = _graph(nodes, {"zero": _i64(0), "one": _i64(1), "nd": _i64(4, 16)})
    for i in range(depth):  # what shape inference leaves on such a chain: dims of its own making
        g.types[f"r{i}"] = TensorType(TensorProto.FLOAT, (f"unk__{2 * i}", f"unk__{2 * i + 1}", 64))
    proof = prove_layout(g, last, "y", frozenset(), parse_layout("b s (n d) -> b n s d"))
    assert proof.atoms == {"b": "batch", "s": "seq", "n": 4, "d": 16}
