"""patterns/activation.yaml: decomposed HardSwish / HardSigmoid, HardSwish (CUDA), QuickGelu, SiLU."""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from .conftest import check_fires, check_misses, fuse, make_model, rand_feeds

SIXTH = np.float32(1 / 6)


def _relu6_graph(form, three=3.0, zero=0.0, six=6.0, six_d=6.0, sixth=SIXTH, dtype=np.float32, swap=False,
                 extra_reader=False, opset=13):
    """x * relu6(x + 3) / 6 (or relu6(x + 3) / 6) as torch exports a hand-written hard-swish / hard-sigmoid."""
    add = ["t3", "x"] if swap else ["x", "t3"]
    nodes = [oh.make_node("Add", add, ["a"], name="add3"),
             oh.make_node("Clip", ["a", "z0", "s6"], ["cl"], name="relu6")]
    if form == "div":  # (x * relu6) / 6
        nodes += [oh.make_node("Mul", ["cl", "x"] if swap else ["x", "cl"], ["m"], name="mul_x"),
                  oh.make_node("Div", ["m", "d6"], ["y"], name="div6")]
    elif form == "mul":  # (x * relu6) * (1/6)
        nodes += [oh.make_node("Mul", ["x", "cl"], ["m"], name="mul_x"),
                  oh.make_node("Mul", ["m", "k6"], ["y"], name="mul6")]
    elif form == "inner_div":  # x * (relu6 / 6)
        nodes += [oh.make_node("Div", ["cl", "d6"], ["h"], name="div6"),
                  oh.make_node("Mul", ["x", "h"], ["y"], name="mul_x")]
    elif form == "inner_mul":  # x * (relu6 * (1/6))
        nodes += [oh.make_node("Mul", ["k6", "cl"] if swap else ["cl", "k6"], ["h"], name="mul6"),
                  oh.make_node("Mul", ["h", "x"] if swap else ["x", "h"], ["y"], name="mul_x")]
    elif form == "hsig_div":  # relu6 / 6
        nodes += [oh.make_node("Div", ["cl", "d6"], ["y"], name="div6")]
    elif form == "hsig_mul":  # relu6 * (1/6)
        nodes += [oh.make_node("Mul", ["cl", "k6"], ["y"], name="mul6")]
    inits = {"t3": np.array(three, dtype), "z0": np.array(zero, dtype), "s6": np.array(six, dtype),
             "d6": np.array(six_d, dtype), "k6": np.array(sixth, dtype)}
    used = {i for n in nodes for i in n.input}
    inits = {k: v for k, v in inits.items() if k in used}
    et = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    outputs = [("y", [2, 8], et)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["cl"], ["probe"], name="probe"))
        outputs.append(("probe", [2, 8], et))
    return make_model(nodes, [("x", [2, 8], et)], outputs, inits, opset=opset)


@pytest.mark.parametrize("form", ["div", "mul", "inner_div", "inner_mul"])
@pytest.mark.parametrize("swap", [False, True])
def test_hardswish_decomposed_fires(form, swap):
    m = _relu6_graph(form, swap=swap)
    got = check_fires(m, "hardswish-decomposed", ["HardSigmoid", "Mul"], feeds=rand_feeds(m) | {
        "x": np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)})
    hs = got.graph.node[0]
    assert {a.name: round(a.f, 6) for a in hs.attribute} == {"alpha": 0.166667, "beta": 0.5}


def test_hardswish_decomposed_float64():
    m = _relu6_graph("div", dtype=np.float64)
    r, got = fuse(m, "hardswish-decomposed")
    # matched, but onnxruntime's CPU HardSigmoid takes float only: the per-match kernel check refuses it
    assert r.fired == {}


# Each mutant differs from a positive case above in one thing. The engine's reason is not asserted here: the
# Add(X, THREE) swap is tried last and fails with as many nodes taken, so it is what explain reports (see
# tests/test_matcher_unit.py::test_reason_of_a_refused_full_match_survives_a_later_equal_attempt).
MUTANTS = {"three": {"three": 2.5}, "six": {"six": 5.0}, "zero": {"zero": 0.5}, "six_d": {"six_d": 6.5},
           "sixth": {"sixth": 0.17}, "extra_reader": {"extra_reader": True}, "float16": {"dtype": np.float16}}
NEAR = [(form, k) for form in ("div", "mul", "inner_div", "inner_mul") for k in MUTANTS
        if not (k == "six_d" and "mul" in form) and not (k == "sixth" and "div" in form)]


@pytest.mark.parametrize(("form", "mutant"), NEAR, ids=[f"{f}-{k}" for f, k in NEAR])
def test_hardswish_decomposed_near_misses(form, mutant):
    check_misses(_relu6_graph(form, **MUTANTS[mutant]), "hardswish-decomposed")


@pytest.mark.parametrize("form", ["hsig_div", "hsig_mul"])
def test_hardsigmoid_decomposed_fires(form):
    m = _relu6_graph(form)
    got = check_fires(m, "hardsigmoid-decomposed", ["HardSigmoid"], feeds={
        "x": np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)})
    assert list(got.graph.node[0].input) == ["x"]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"zero": -1.0}, None),  # reasons: see the note above test_hardswish_decomposed_near_misses
    ({"six": 8.0}, None),
    ({"extra_reader": True}, None),
    ({"dtype": np.float16}, "X has dtype float16, rule allows float, double"),
])
def test_hardsigmoid_decomposed_near_misses(kw, reason):
    check_misses(_relu6_graph("hsig_div", **kw), "hardsigmoid-decomposed", reason)


def test_hardsigmoid_decomposed_needs_both_clip_bounds():
    # Clip with no lower bound (relu6 written as min(x + 3, 6)) is not relu6
    nodes = [oh.make_node("Add", ["x", "t3"], ["a"], name="add3"),
             oh.make_node("Clip", ["a", "", "s6"], ["cl"], name="clip"),
             oh.make_node("Div", ["cl", "d6"], ["y"], name="div6")]
    m = make_model(nodes, [("x", [2, 8])], [("y", [2, 8])],
                   {"t3": np.float32(3), "s6": np.float32(6), "d6": np.float32(6)}, opset=13)
    check_misses(m, "hardsigmoid-decomposed")


def _x_hardsigmoid(alpha=1 / 6, beta=0.5, opset=14, other=False):
    nodes = [oh.make_node("HardSigmoid", ["x"], ["h"], alpha=alpha, beta=beta, name="hsig"),
             oh.make_node("Mul", ["w" if other else "x", "h"], ["y"], name="mul")]
    inputs = [("x", [2, 8])] + ([("w", [2, 8])] if other else [])
    return make_model(nodes, inputs, [("y", [2, 8])], opset=opset)


def test_hardswish_fires_on_cuda():
    m = _x_hardsigmoid()
    # no CUDA here: the output is checked on the CPU, where onnxruntime runs HardSwish as its function body
    check_fires(m, "hardswish", ["HardSwish"], target="cuda", feeds={
        "x": np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)})


def test_hardswish_is_cuda_only_and_opset_14():
    r, _ = fuse(_x_hardsigmoid(), "hardswish")
    assert r.fired == {} and [(s.rule, s.reason) for s in r.skipped] == [("hardswish", "declared for cuda only")]
    r, _ = fuse(_x_hardsigmoid(opset=13), "hardswish", target="cuda")
    assert r.fired == {} and "outside the rule's range 14.." in r.skipped[0].reason


@pytest.mark.parametrize(("kw", "reason"), [
    ({"alpha": 0.2}, None),  # reported: the swapped Mul order, tried last
    ({"other": True}, "X must be the same value in both places"),
])
def test_hardswish_near_misses(kw, reason):
    check_misses(_x_hardsigmoid(**kw), "hardswish", reason, target="cuda")


def _sigmoid_gate(alpha=None, alpha_shape=(), swap=False, alpha_input=False, other=False, dtype=TensorProto.FLOAT,
                  extra_reader=False):
    nodes = []
    s_in = "x"
    inits = {}
    inputs = [("x", [2, 8], dtype)]
    if alpha is not None:
        nodes.append(oh.make_node("Mul", ["k", "x"] if swap else ["x", "k"], ["xa"], name="scale"))
        s_in = "xa"
        if alpha_input:
            inputs.append(("k", list(alpha_shape), dtype))
        else:
            inits["k"] = np.full(alpha_shape, alpha, np.float32)
    nodes.append(oh.make_node("Sigmoid", ["w" if other else s_in], ["s"], name="sig"))
    nodes.append(oh.make_node("Mul", ["s", "x"] if swap else ["x", "s"], ["y"], name="gate"))
    if other:
        inputs.append(("w", [2, 8], dtype))
    outputs = [("y", [2, 8], dtype)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["s"], ["probe"], name="probe"))
        outputs.append(("probe", [2, 8], dtype))
    return make_model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("shape", [(), (1,)])
def test_quick_gelu_fires(swap, shape):
    got = check_fires(_sigmoid_gate(1.702, shape, swap=swap), "quick-gelu", ["com.microsoft.QuickGelu"])
    assert abs(got.graph.node[0].attribute[0].f - 1.702) < 1e-6


@pytest.mark.parametrize(("kw", "reason"), [
    ({"alpha_shape": (8,)}, None),  # reported: the swapped inner Mul, tried last with as many nodes taken
    ({"alpha_input": True}, None),
    ({"extra_reader": True}, None),
])
def test_quick_gelu_near_misses(kw, reason):
    check_misses(_sigmoid_gate(1.702, **{"alpha_shape": (), **kw}), "quick-gelu", reason)


@pytest.mark.parametrize("swap", [False, True])
def test_silu_fires(swap):
    got = check_fires(_sigmoid_gate(swap=swap), "silu", ["com.microsoft.QuickGelu"])
    assert got.graph.node[0].attribute[0].f == 1.0


@pytest.mark.parametrize(("kw", "reason"), [
    ({"other": True}, "computes 'silu': it also reads 'x', which is not a constant"),
    ({"extra_reader": True}, "consumer(s) outside the match (Neg 'probe')"),
    ({"dtype": TensorProto.DOUBLE}, "X has dtype double, rule allows float, float16"),
])
def test_silu_near_misses(kw, reason):
    check_misses(_sigmoid_gate(**kw), "silu", reason)


def _x_over(ops: list[tuple[str, list[str]]], consts: dict[str, float], dtype=np.float32, opset: int = 13,
            attrs: dict[str, dict] | None = None):
    """A chain of `ops` ((op, inputs) each, the last one's output `y`, the others' t0, t1, ...) reading x."""
    nodes = []
    for i, (op, ins) in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        nodes.append(oh.make_node(op, ins, [out], name=f"n{i}_{op}", **(attrs or {}).get(out, {})))
    et = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return make_model(nodes, [("x", [2, 8], et)], [("y", [2, 8], et)],
                      {k: np.array(v, dtype) for k, v in consts.items()}, opset=opset)


LINSPACE = {"x": np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)}


def test_hardswish_decomposed_in_other_spellings():
    # relu6 as Min(Max(x + 3, 0), 6), then * (1/6) before the gate: a spelling no rule lists
    m = _x_over([("Add", ["x", "c3"]), ("Max", ["t0", "c0"]), ("Min", ["t1", "c6"]), ("Mul", ["t2", "k6"]),
                 ("Mul", ["t3", "x"])], {"c3": 3.0, "c0": 0.0, "c6": 6.0, "k6": SIXTH})
    check_fires(m, "hardswish-decomposed", ["HardSigmoid", "Mul"], feeds=LINSPACE)
    # Clip with its bounds as attributes (opset 6-10) and Relu before it
    m = _x_over([("Add", ["c3", "x"]), ("Relu", ["t0"]), ("Clip", ["t1"]), ("Mul", ["x", "t2"]), ("Div", ["t3", "d6"])],
                {"c3": 3.0, "d6": 6.0}, opset=10, attrs={"t2": {"min": 0.0, "max": 6.0}})
    check_fires(m, "hardswish-decomposed", ["HardSigmoid", "Mul"], feeds=LINSPACE)


def test_hardsigmoid_decomposed_in_another_spelling():
    # relu6(x + 3) / 6 as Min(Relu(x + 3) / 6, 1)
    m = _x_over([("Add", ["x", "c3"]), ("Relu", ["t0"]), ("Div", ["t1", "d6"]), ("Min", ["t2", "c1"])],
                {"c3": 3.0, "d6": 6.0, "c1": 1.0})
    check_fires(m, "hardsigmoid-decomposed", ["HardSigmoid"], feeds=LINSPACE)
    # not relu6: clipped at 5
    check_misses(_x_over([("Add", ["x", "c3"]), ("Clip", ["t0", "c0", "c5"]), ("Div", ["t1", "d6"])],
                         {"c3": 3.0, "c0": 0.0, "c5": 5.0, "d6": 6.0}), "hardsigmoid-decomposed",
                 "computes 'hardsigmoid': the ops from 'x' compute something else")


def test_silu_as_x_over_one_plus_exp():
    m = _x_over([("Neg", ["x"]), ("Exp", ["t0"]), ("Add", ["t1", "one"]), ("Div", ["x", "t2"])], {"one": 1.0})
    got = check_fires(m, "silu", ["com.microsoft.QuickGelu"], feeds=LINSPACE)
    assert got.graph.node[0].attribute[0].f == 1.0
    # x / (1 + exp(x)) is not silu
    m = _x_over([("Exp", ["x"]), ("Add", ["t0", "one"]), ("Div", ["x", "t1"])], {"one": 1.0})
    check_misses(m, "silu", "computes 'silu': the ops from 'x' compute something else")


def test_hardswish_on_a_value_whose_type_writes_a_dim_as_minus_one():
    """Paddle's exports type their inputs [-1, C, h, w]: the interpreter reads no shape from such a type, and the
    region is tested on one of its rank (the ops are elementwise: what they compute does not depend on it)."""
    m = _x_over([("Add", ["x", "c3"]), ("Clip", ["t0", "c0", "c6"]), ("Mul", ["x", "t1"]), ("Div", ["t2", "d6"])],
                {"c3": 3.0, "c0": 0.0, "c6": 6.0, "d6": 6.0})
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_value = -1
    check_fires(m, "hardswish-decomposed", ["HardSigmoid", "Mul"], feeds=LINSPACE)


@pytest.mark.parametrize(("ops", "consts"), [
    # x / (1 + exp(-alpha x)): the factor inside exp is -alpha
    ([("Mul", ["x", "na"]), ("Exp", ["t0"]), ("Add", ["t1", "one"]), ("Div", ["x", "t2"])],
     {"na": -1.702, "one": 1.0}),
    # the factor as a division by its reciprocal, and the gate on the left
    ([("Div", ["x", "r"]), ("Sigmoid", ["t0"]), ("Mul", ["t1", "x"])], {"r": 1 / 1.702}),
    # the factor first: sigmoid(alpha * x), gated by x on the left
    ([("Mul", ["a", "x"]), ("Sigmoid", ["t0"]), ("Mul", ["x", "t1"])], {"a": 1.702}),
])
def test_quick_gelu_in_other_spellings_finds_alpha(ops, consts):
    got = check_fires(_x_over(ops, consts), "quick-gelu", ["com.microsoft.QuickGelu"], feeds=LINSPACE)
    assert abs(got.graph.node[0].attribute[0].f - 1.702) < 1e-5


def test_quick_gelu_leaves_silu_to_its_rule_and_refuses_other_functions():
    # no factor: x * sigmoid(x) is SiLU's rule (QuickGelu with alpha 1), not a quick-gelu with a guessed alpha
    check_misses(_sigmoid_gate(), "quick-gelu", "it multiplies by no one-element factor")
    # a shift inside the gate is not x * sigmoid(alpha x) for any alpha
    check_misses(_x_over([("Mul", ["x", "a"]), ("Add", ["t0", "b"]), ("Sigmoid", ["t1"]), ("Mul", ["x", "t2"])],
                         {"a": 1.702, "b": 0.25}), "quick-gelu", "compute something else")
