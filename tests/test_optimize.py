"""optimize() on the bundled sample models: exact rewrites, onnxruntime numerics, fixed point, determinism."""

import os
from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import MODELS, ort_run

from onnxfuse import OptimizeOptions, optimize


def _opt(name, tmp_path, **kw):
    out = tmp_path / f"{name}.opt.onnx"
    r = optimize(os.path.join(MODELS, f"{name}.onnx"), str(out), OptimizeOptions(**{"measure": False, **kw}))
    return r, onnx.load(str(out))


def _ops(model) -> Counter:
    c = Counter()

    def walk(g):
        for n in g.node:
            c[(n.domain + "." if n.domain else "") + n.op_type] += 1
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub)

    walk(model.graph)
    return c


def test_cnn_small_exact_rewrite(tmp_path):
    r, m = _opt("cnn_small", tmp_path)
    ops = _ops(m)
    assert ops["com.microsoft.FusedConv"] == 8
    # the Conv followed by Add of a per-channel constant: bias folded, nothing to fuse; and the residual
    # Conv + Add + Relu, which onnxruntime sums into its NCHWc Conv itself (conv-add-relu is not used where it
    # runs convolutions in NCHWc, as the suite assumes: tests/conftest.py)
    assert ops["Conv"] == 2 and ops["Add"] == 1 and ops["Relu"] == 1
    assert ops["com.microsoft.FusedGemm"] == 1
    for gone in ("BatchNormalization", "Clip", "Div", "HardSigmoid", "Sigmoid", "Tanh", "LeakyRelu"):
        assert ops[gone] == 0, gone
    assert r.fired["conv-bn-fold"] == 3 and "conv-add-relu" not in r.fired
    activations = sorted(a.s.decode() for n in m.graph.node if n.op_type == "FusedConv"
                         for a in n.attribute if a.name == "activation")
    assert activations == ["Clip", "HardSigmoid", "HardSwish", "LeakyRelu", "Relu", "Relu", "Sigmoid", "Tanh"]
    assert r.validation == "passed"
    assert all(c.passed for c in r.checks)


@pytest.mark.parametrize("name,expected", [
    # word + position embeddings and their LayerNorm: one EmbedLayerNormalization (no segment input)
    ("transformer_small", {"LayerNormalization": 0, "com.microsoft.SkipLayerNormalization": 2,
                           "com.microsoft.EmbedLayerNormalization": 1,
                           "com.microsoft.BiasGelu": 1, "com.microsoft.Attention": 1,
                           "com.microsoft.FusedMatMul": 0}),
    ("transformer_op18", {"LayerNormalization": 1, "com.microsoft.SkipLayerNormalization": 1,
                          "com.microsoft.FastGelu": 1, "com.microsoft.QuickGelu": 1,
                          "com.microsoft.SkipSimplifiedLayerNormalization": 1}),
])
def test_transformer_fusions(tmp_path, name, expected):
    r, m = _opt(name, tmp_path)
    ops = _ops(m)
    for op, n in expected.items():
        assert ops[op] == n, (op, dict(ops))
    for gone in ("ReduceMean", "Erf", "Tanh", "Sqrt", "Pow", "Reciprocal"):
        assert ops[gone] == 0, (gone, dict(ops))
    assert r.validation == "passed"


def _feeds(model):
    rng = np.random.default_rng(1)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value or 2 for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[i.name] = (np.ones(shape, np.int64) if "mask" in i.name
                             else rng.integers(0, 100, shape).astype(np.int64))
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", ["cnn_small", "transformer_small", "transformer_op18"])
def test_numerics_independent_of_validator(tmp_path, name):
    """Re-check numerics with our own inputs (not the validator's) through onnxruntime."""
    _, m = _opt(name, tmp_path)
    orig = onnx.load(os.path.join(MODELS, f"{name}.onnx"))
    feeds = _feeds(orig)
    for a, b in zip(ort_run(orig, feeds), ort_run(m, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    onnx.checker.check_model(m, full_check=True)


def test_if_subgraph_fused_inside_branches(tmp_path):
    r, m = _opt("if_subgraph", tmp_path)
    (if_node,) = [n for n in m.graph.node if n.op_type == "If"]
    for a in if_node.attribute:
        branch_ops = Counter(n.op_type for n in a.g.node)
        assert branch_ops["FusedConv"] == 2, (a.name, branch_ops)
        assert branch_ops["BatchNormalization"] == 0
    # outer-scope references: the branches still read outer values that the outer graph defines
    outer = {i.name for i in m.graph.initializer} | {i.name for i in m.graph.input} | {
        o for n in m.graph.node for o in n.output}
    for a in if_node.attribute:
        inner = {i.name for i in a.g.initializer} | {o for n in a.g.node for o in n.output}
        reads = {i for n in a.g.node for i in n.input if i}
        assert reads - inner <= outer
    orig = onnx.load(os.path.join(MODELS, "if_subgraph.onnx"))
    for sr in (16000, 8000):
        feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32),
                 "sr": np.array(sr, dtype=np.int64)}
        np.testing.assert_allclose(ort_run(orig, feeds)[0], ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["cnn_small", "transformer_small", "transformer_op18", "if_subgraph"])
def test_second_run_changes_nothing(tmp_path, name):
    _opt(name, tmp_path)
    first = tmp_path / f"{name}.opt.onnx"
    second = tmp_path / "again.onnx"
    r2 = optimize(str(first), str(second), OptimizeOptions(measure=False))
    assert r2.applications == []
    assert _ops(onnx.load(str(first))) == _ops(onnx.load(str(second)))


def test_output_is_byte_identical_across_runs(tmp_path):
    src = os.path.join(MODELS, "transformer_small.onnx")
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    optimize(src, str(a), OptimizeOptions(measure=False))
    optimize(src, str(b), OptimizeOptions(measure=False))
    assert a.read_bytes() == b.read_bytes()


def test_provenance_recorded(tmp_path):
    _, m = _opt("cnn_small", tmp_path)
    fused = [n for n in m.graph.node if n.op_type == "FusedConv"]
    assert fused and all(n.doc_string.startswith("onnxfuse: rule=") for n in fused)
    relu = next(n for n in fused if "rule=conv-relu " in n.doc_string)
    replaced = relu.doc_string.split("replaced=")[1].split(",")
    orig_names = {n.name for n in onnx.load(os.path.join(MODELS, "cnn_small.onnx")).graph.node}
    assert set(replaced) <= orig_names and any("Relu" in r for r in replaced)


def test_only_and_skip(tmp_path):
    r, m = _opt("cnn_small", tmp_path, only=["conv-bn-fold"])
    assert set(r.fired) == {"conv-bn-fold"}
    r, m = _opt("cnn_small", tmp_path, skip=["conv-bn-fold"])
    assert "conv-bn-fold" not in r.fired and _ops(m)["BatchNormalization"] == 3


def test_untouched_nodes_survive_byte_for_byte(tmp_path):
    src = os.path.join(MODELS, "transformer_small.onnx")
    r, m = _opt("transformer_small", tmp_path, only=["erf-gelu"])
    orig = {n.name: n.SerializeToString() for n in onnx.load(src).graph.node}
    kept = [n for n in m.graph.node if n.name in orig]
    assert len(kept) == len(orig) - 8 + 0  # erf gelu: Div, Erf, Add, Mul, Mul + 3 Constant nodes removed
    assert all(n.SerializeToString() == orig[n.name] for n in kept)


SILERO = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared",
                      "models", "silero_vad_op15.onnx")


@pytest.mark.skipif(not os.path.exists(SILERO), reason="shared/models not present")
def test_silero_if_branches_keep_outer_scope(tmp_path):
    """silero VAD (If subgraphs reading outer values): after rewriting, every subgraph still resolves every
    outer-scope name, and both branches (16 kHz and 8 kHz) give the original's outputs. Fusions *inside*
    branches are covered by test_if_subgraph_fused_inside_branches."""
    out = tmp_path / "silero.onnx"
    r = optimize(SILERO, str(out), OptimizeOptions(measure=False))
    assert r.fired.get("conv-relu", 0) >= 2 and r.validation.startswith("passed")
    got = onnx.load(str(out))
    onnx.checker.check_model(got, full_check=True)

    def check_scope(graph, outer):
        known = outer | {i.name for i in graph.input} | {t.name for t in graph.initializer} | {
            o for n in graph.node for o in n.output}
        for n in graph.node:
            assert all(not i or i in known for i in n.input), (n.name, list(n.input))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    check_scope(a.g, known)

    check_scope(got.graph, set())
    orig = onnx.load(SILERO)
    rng = np.random.default_rng(0)
    for sr in (16000, 8000):
        feeds = {"input": rng.standard_normal((1, 512 if sr == 16000 else 256)).astype(np.float32),
                 "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(sr, np.int64)}
        for a, b in zip(ort_run(orig, feeds), ort_run(got, feeds), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def _tf_style_model(tmp_path):
    """NHWC in and out, a Transpose pair around every Conv (as TensorFlow converters emit them)."""
    import onnx.helper as oh
    from conftest import make_model, save

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        oh.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2], name="t_in"),
        oh.make_node("Conv", ["x_nchw", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        oh.make_node("Transpose", ["c1"], ["c1_nhwc"], perm=[0, 2, 3, 1], name="t1_out"),
        oh.make_node("Relu", ["c1_nhwc"], ["r1"], name="relu1"),
        oh.make_node("Transpose", ["r1"], ["r1_nchw"], perm=[0, 3, 1, 2], name="t2_in"),
        oh.make_node("Conv", ["r1_nchw", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        oh.make_node("Transpose", ["c2"], ["c2_nhwc"], perm=[0, 2, 3, 1], name="t2_out"),
        oh.make_node("Add", ["c2_nhwc", "r1"], ["y"], name="residual"),
    ]
    m = make_model(nodes, [("x", [1, 16, 16, 3])], [("y", [1, 16, 16, 8])], {"w1": w1, "w2": w2}, opset=13)
    return save(m, tmp_path / "tf_style.onnx"), m


def test_tf_style_nhwc_model_loses_redundant_transposes(tmp_path):
    src, orig = _tf_style_model(tmp_path)
    out = tmp_path / "o.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False))
    assert r.ops_before["Transpose"] == 4
    assert r.ops_after.get("Transpose", 0) == 2  # one at the input boundary, one before the output
    assert r.fired.get("transpose-cancel", 0) >= 1
    got = onnx.load(str(out))
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 3)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(orig, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _dead_weights_model() -> onnx.ModelProto:
    """y = If(c) then Relu(x) + w_branch else Neg(x), with initializers nothing reads: `w_dead` (top level),
    `e_dead` (inside the else branch), a dead Constant, and `w_input` (also a graph input: kept, it is an input).
    `w_branch` is read only inside the then branch, by its outer-scope name: kept."""
    import onnx.helper as oh
    from onnx import TensorProto, numpy_helper

    f = TensorProto.FLOAT
    then_g = oh.make_graph([oh.make_node("Relu", ["x"], ["r"], name="relu"),
                            oh.make_node("Add", ["r", "w_branch"], ["t"], name="add")], "then", [],
                           [oh.make_tensor_value_info("t", f, [2, 3])])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
                           [oh.make_tensor_value_info("e", f, [2, 3])],
                           [numpy_helper.from_array(np.ones(3, np.float32), "e_dead")])
    nodes = [oh.make_node("Constant", [], ["k_dead"], name="k", value=numpy_helper.from_array(np.ones(2, np.float32))),
             oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    inits = [numpy_helper.from_array(np.arange(3, dtype=np.float32), "w_branch"),
             numpy_helper.from_array(np.ones((4, 4), np.float32), "w_dead"),
             numpy_helper.from_array(np.ones(3, np.float32), "w_input")]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", f, [2, 3]),
                                   oh.make_tensor_value_info("c", TensorProto.BOOL, []),
                                   oh.make_tensor_value_info("w_input", f, [3])],
                      [oh.make_tensor_value_info("y", f, [2, 3])], inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_output_drops_initializers_nothing_reads_and_keeps_outer_scope_reads(cli, tmp_path):
    m = _dead_weights_model()
    onnx.checker.check_model(m, full_check=True)
    src, out = str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")
    onnx.save(m, src)
    code, stdout, stderr = cli("optimize", src, out)
    assert code == 0, stderr
    got = onnx.load(out)
    assert sorted(t.name for t in got.graph.initializer) == ["w_branch", "w_input"]
    assert [n.op_type for n in got.graph.node] == ["If"]
    else_g = next(a.g for a in got.graph.node[0].attribute if a.name == "else_branch")
    assert list(else_g.initializer) == []
    onnx.checker.check_model(got, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_array_equal(ort_run(got, feeds)[0], ort_run(m, feeds)[0])
