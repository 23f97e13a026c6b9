"""Versioning: the nodes after a run-time If move into its branches, the hot one is specialized, the cold one
stays the original; exact for inputs taking either branch."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, ort_run, save

from onnxfuse import OptimizeOptions, optimize

F = onnx.TensorProto.FLOAT


def _branch(nodes, out, name):
    return oh.make_graph(nodes, name, [], [oh.make_tensor_value_info(out, F, None)])


def _squeeze_if_model(data_test: bool = False) -> onnx.ModelProto:
    """TorchScript's dynamic x.squeeze(-1), then a rank test of its result (as silero VAD does):
    y = If(x.shape[-1] == 1, Squeeze(x, -1), x); z = If(rank(y) != 2, Unsqueeze(y, 0), y);
    out = Flatten(Relu(z) * 2).
    With data_test the second If tests a data value (sum(y) > 0) instead: nothing to specialize."""
    nodes = [
        oh.make_node("Shape", ["x"], ["s"], name="shape"),
        oh.make_node("Gather", ["s", "minus1"], ["last"], name="last_dim", axis=0),
        oh.make_node("Equal", ["last", "one"], ["c"], name="is_one"),
        oh.make_node("If", ["c"], ["y"], name="squeeze_if",
                     then_branch=_branch([oh.make_node("Squeeze", ["x", "axis_m1"], ["sq"], name="sq")], "sq", "t"),
                     else_branch=_branch([oh.make_node("Identity", ["x"], ["idn"], name="idn")], "idn", "e")),
    ]
    if data_test:
        nodes += [oh.make_node("ReduceSum", ["y"], ["total"], name="total", keepdims=0),
                  oh.make_node("Greater", ["total", "zero_f"], ["c2"], name="positive")]
    else:
        nodes += [oh.make_node("Shape", ["y"], ["ys"], name="yshape"),
                  oh.make_node("Size", ["ys"], ["rank"], name="rank"),
                  oh.make_node("Equal", ["rank", "two"], ["is2"], name="is2"),
                  oh.make_node("Not", ["is2"], ["c2"], name="not2")]
    nodes += [
        oh.make_node("If", ["c2"], ["z"], name="rank_if",
                     then_branch=_branch([oh.make_node("Unsqueeze", ["y", "axis_0"], ["us"], name="us")], "us", "t2"),
                     else_branch=_branch([oh.make_node("Identity", ["y"], ["idn2"], name="idn2")], "idn2", "e2")),
        oh.make_node("Relu", ["z"], ["r"], name="relu"),
        oh.make_node("Mul", ["r", "two_f"], ["m"], name="mul"),
        oh.make_node("Flatten", ["m"], ["out"], name="flatten", axis=1),
    ]
    inits = {"minus1": np.array([-1], np.int64), "one": np.array([1], np.int64), "two": np.array(2, np.int64),
             "axis_m1": np.array([-1], np.int64), "axis_0": np.array([0], np.int64),
             "two_f": np.array(2.0, np.float32), "zero_f": np.array(0.0, np.float32)}
    return make_model(nodes, [("x", ["b", 4, "n"])], [("out", [None, None])], inits, opset=15)


def _ifs(graph: onnx.GraphProto) -> int:
    total = 0
    for n in graph.node:
        total += n.op_type == "If"
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                total += _ifs(a.g)
    return total


def _optimize(tmp_path, model, shape: str):
    src = save(model, tmp_path / "in.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(builtin=False, measure=False, shapes=[shape]))
    return src, r, onnx.load(out)


@pytest.mark.parametrize("hot_n", [1, 5])
def test_tail_moves_into_the_if_and_the_hot_branch_loses_its_shape_tests(tmp_path, hot_n):
    src, r, got = _optimize(tmp_path, _squeeze_if_model(), f"x:2x4x{hot_n}")
    assert r.cleanups.get("if-version") == 1
    top = [n for n in got.graph.node if n.op_type == "If"]
    assert len(top) == 1 and list(top[0].output) == ["out"]
    branches = {a.name: a.g for a in top[0].attribute}
    hot, cold = ("then_branch", "else_branch") if hot_n == 1 else ("else_branch", "then_branch")
    assert _ifs(branches[hot]) == 0  # the rank test folded away where the rank is known
    assert _ifs(branches[cold]) == 1  # the other branch is the original tail, untouched
    for n in (1, 5, 7):  # inputs taking the hot and the cold branch alike give the original's outputs
        x = np.random.default_rng(n).standard_normal((2, 4, n)).astype(np.float32)
        want, = ort_run(onnx.load(src), {"x": x})
        have, = ort_run(got, {"x": x})
        assert have.shape == want.shape
        np.testing.assert_array_equal(have, want)


def test_data_dependent_conditions_are_not_versioned(tmp_path):
    _, r, got = _optimize(tmp_path, _squeeze_if_model(data_test=True), "x:2x4x1")
    assert "if-version" not in r.cleanups
    assert [n.name for n in got.graph.node if n.op_type == "If"] == ["squeeze_if", "rank_if"]


def test_no_versioning_without_fold(tmp_path):
    src = save(_squeeze_if_model(), tmp_path / "in.onnx")
    r = optimize(src, str(tmp_path / "out.onnx"),
                 OptimizeOptions(builtin=False, measure=False, fold=False, shapes=["x:2x4x1"]))
    assert "if-version" not in r.cleanups


def test_a_rolled_back_versioning_stays_off(tmp_path):
    """Bisection denies a rewrite by (rule, root value): the root is the replaced If's first output."""
    from onnxfuse.load.loader import load_model
    from onnxfuse.rewrite.engine import EngineOptions, run

    src = save(_squeeze_if_model(), tmp_path / "in.onnx")
    for deny, versioned in ((set(), True), ({("if-version", "y")}, False)):
        model, _ = load_model(src)
        eng = run(model, [], EngineOptions(hot={"c": True}, deny=deny))
        assert any(a.rule == "if-version" and a.root == "y" for a in eng.applications) is versioned


def _squeeze_gemm_model() -> onnx.ModelProto:
    """Like _squeeze_if_model, but the tail ends in a Gemm, which needs rank 2: with the Identity branch (rank 3,
    then unsqueezed to rank 4) the original can only fail."""
    model = _squeeze_if_model()
    g = model.graph
    del g.node[-3:]  # Relu, Mul, Flatten
    g.node.append(oh.make_node("Gemm", ["z", "w"], ["out"], name="gemm"))
    g.initializer.append(onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w"))
    del g.output[:]
    g.output.append(oh.make_tensor_value_info("out", F, ["b", 3]))
    return model


def test_a_squeeze_guard_whose_other_branch_can_only_fail_is_dropped(tmp_path):
    """With the If's else branch, strict shape inference proves the Gemm cannot run: every input the original
    runs takes the then branch, so the guard goes and no If is left. Where the original fails, so does ours."""
    src, r, got = _optimize(tmp_path, _squeeze_gemm_model(), "x:2x4x1")
    assert r.cleanups.get("if-version") == 1 and r.cleanups.get("if-squeeze-unguard") == 1
    assert _ifs(got.graph) == 0
    x = np.random.default_rng(0).standard_normal((3, 4, 1)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], ort_run(onnx.load(src), {"x": x})[0])
    bad = np.zeros((3, 4, 5), np.float32)
    for model in (onnx.load(src), got):
        with pytest.raises(Exception):  # noqa: B017 (onnxruntime raises its own exception types)
            ort_run(model, {"x": bad})


def test_a_guard_whose_other_branch_can_run_stays(tmp_path):
    _, r, got = _optimize(tmp_path, _squeeze_if_model(), "x:2x4x1")
    assert "if-squeeze-unguard" not in r.cleanups and _ifs(got.graph) == 2  # the versioned If; cold branch's own


def _random_tail_model(seed: int) -> onnx.ModelProto:
    """The squeeze guard, then a random chain of elementwise ops before the rank test and after it; some
    values of the chain also become graph outputs."""
    rng = np.random.default_rng(seed)
    model = _squeeze_if_model()
    g = model.graph
    nodes = list(g.node)[:4]  # shape, last_dim, is_one, squeeze_if -> y
    cur, k, outputs = "y", 0, []

    def chain(n: int) -> None:
        nonlocal cur, k
        for _ in range(n):
            op = ["Relu", "Neg", "Abs", "Sigmoid", "MulC"][int(rng.integers(5))]
            out = f"e{k}"
            k += 1
            nodes.append(oh.make_node("Mul", [cur, "two_f"], [out]) if op == "MulC" else oh.make_node(op, [cur], [out]))
            cur = out
            if rng.random() < 0.3:  # also a graph output, flattened (a top-level output needs a rank)
                nodes.append(oh.make_node("Flatten", [out], [f"{out}_flat"], axis=1))
                outputs.append(f"{out}_flat")

    chain(int(rng.integers(0, 3)))
    nodes += [oh.make_node("Shape", [cur], ["ys"]), oh.make_node("Size", ["ys"], ["rank"]),
              oh.make_node("Equal", ["rank", "two"], ["is2"]), oh.make_node("Not", ["is2"], ["c2"]),
              oh.make_node("If", ["c2"], ["z"], name="rank_if",
                           then_branch=_branch([oh.make_node("Unsqueeze", [cur, "axis_0"], ["us"])], "us", "t2"),
                           else_branch=_branch([oh.make_node("Identity", [cur], ["idn2"])], "idn2", "e2"))]
    cur = "z"
    chain(int(rng.integers(1, 4)))
    nodes.append(oh.make_node("Flatten", [cur], ["out"], axis=1))
    del g.node[:]
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(oh.make_tensor_value_info(o, F, [None, None]) for o in ["out", *outputs])
    return model


@pytest.mark.parametrize("seed", range(6))
def test_versioning_random_tails_stay_exact_and_idempotent(tmp_path, seed):
    model = _random_tail_model(seed)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        pytest.skip("the generated model is not valid ONNX")
    src, r, got = _optimize(tmp_path, model, "x:2x4x1")
    assert r.cleanups.get("if-version") == 1, r.cleanups
    assert _ifs(got.graph) < _ifs(model.graph) + 2  # hot path lost its rank test
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((2, 4, n)).astype(np.float32)
        for have, want in zip(ort_run(got, {"x": x}), ort_run(onnx.load(src), {"x": x}), strict=True):
            assert have.shape == want.shape
            np.testing.assert_array_equal(have, want)
    again = tmp_path / "again.onnx"
    r2 = optimize(str(tmp_path / "out.onnx"), str(again), OptimizeOptions(builtin=False, measure=False,
                                                                          shapes=["x:2x4x1"]))
    assert "if-version" not in r2.cleanups
