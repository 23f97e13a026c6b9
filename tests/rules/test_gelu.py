"""patterns/gelu.yaml: Erf Gelu, tanh Gelu (TorchScript Pow / dynamo products), BiasGelu, FastGelu with bias."""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from .conftest import check_fires, check_misses, make_model, rand_feeds, why_not

X = ("x", [2, 4, 8])


def _scaled_product(nodes, p_name, form, swap=False):
    """The three exported forms of 0.5 * x * p."""
    if form == "half_first":  # (x * 0.5) * p
        nodes += [oh.make_node("Mul", ["half", "x"] if swap else ["x", "half"], ["xh"], name="mul_half"),
                  oh.make_node("Mul", [p_name, "xh"] if swap else ["xh", p_name], ["y"], name="gelu_out")]
    elif form == "half_last":  # (x * p) * 0.5
        nodes += [oh.make_node("Mul", ["x", p_name], ["xp"], name="mul_p"),
                  oh.make_node("Mul", ["half", "xp"] if swap else ["xp", "half"], ["y"], name="gelu_out")]
    else:  # x * (p * 0.5)
        nodes += [oh.make_node("Mul", [p_name, "half"], ["ph"], name="mul_half"),
                  oh.make_node("Mul", ["ph", "x"] if swap else ["x", "ph"], ["y"], name="gelu_out")]


def _erf_gelu(scale="div", form="half_first", swap=False, sqrt2=1.4142135, one=1.0, half=0.5,
              dtype=TensorProto.FLOAT, extra_reader=False, bias=None):
    np_t = np.float16 if dtype == TensorProto.FLOAT16 else np.float64 if dtype == TensorProto.DOUBLE else np.float32
    nodes, inputs = [], [("x0" if bias is not None else "x", X[1], dtype)]
    inits = {"one": np.array(one, np_t), "half": np.array(half, np_t)}
    if bias is not None:  # x = x0 + bias, as a Linear layer's bias before the activation
        nodes.append(oh.make_node("Add", ["x0", "b"], ["x"], name="bias_add"))
        inits["b"] = np.asarray(bias, np_t)
    if scale == "div":  # TorchScript: x / sqrt(2)
        nodes.append(oh.make_node("Div", ["x", "k"], ["s"], name="div"))
        inits["k"] = np.array(sqrt2, np_t)
    else:  # dynamo: x * (1 / sqrt(2))
        nodes.append(oh.make_node("Mul", ["k", "x"] if swap else ["x", "k"], ["s"], name="mul_k"))
        inits["k"] = np.array(1 / sqrt2, np_t)
    nodes += [oh.make_node("Erf", ["s"], ["e"], name="erf"),
              oh.make_node("Add", ["one", "e"] if swap else ["e", "one"], ["p"], name="add_one")]
    _scaled_product(nodes, "p", form, swap)
    outputs = [("y", X[1], dtype)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["e"], ["probe"], name="probe"))
        outputs.append(("probe", X[1], dtype))
    return make_model(nodes, inputs, outputs, inits)


FORMS = ["half_first", "half_last", "p_half"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scale", ["div", "mul"])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_erf_gelu_fires(scale, form, swap):
    check_fires(_erf_gelu(scale, form, swap), "erf-gelu", ["com.microsoft.Gelu"])


def test_erf_gelu_within_tolerance_of_sqrt2():
    # 1.4142 is 1.5e-5 relative off (rtol 1e-3): exporters round sqrt(2) differently
    check_fires(_erf_gelu(sqrt2=1.4142), "erf-gelu", ["com.microsoft.Gelu"], rtol=1e-4, atol=1e-4)


def test_erf_gelu_float16_is_per_target():
    # matched on both; the CPU kernel of com.microsoft.Gelu takes float only, the CUDA one float16 too (no CUDA
    # here to compare numbers on)
    m = _erf_gelu(dtype=TensorProto.FLOAT16)
    check_misses(m, "erf-gelu", "the CPU kernel for com.microsoft.Gelu does not take float16")
    check_fires(m, "erf-gelu", ["com.microsoft.Gelu"], target="cuda", feeds=False)


@pytest.mark.parametrize(("kw", "reason"), [
    # what the ops compute is proved, not their constants compared: the reason is the concept's
    ({"sqrt2": 1.3}, "computes 'gelu': the ops from 'x' compute something else (off by"),
    ({"one": 2.0}, "computes 'gelu': the ops from 'x' compute something else"),
    ({"half": 0.6}, "computes 'gelu': the ops from 'x' compute something else"),
    ({"extra_reader": True}, "Erf 'erf' has 1 consumer(s) outside the match (Neg 'probe')"),
    ({"dtype": TensorProto.DOUBLE}, "X has dtype double, rule allows float, float16"),
])
def test_erf_gelu_near_misses(kw, reason):
    check_misses(_erf_gelu(**kw), "erf-gelu", reason)


def _tanh_gelu(cube="pow", form="half_first", swap=False, three=3.0, c1=0.044715, c2=0.7978845608,
               extra_reader=False):
    nodes = []
    if cube == "pow":  # TorchScript: x.pow(3) / torch.pow(x, 3.0)
        nodes.append(oh.make_node("Pow", ["x", "three"], ["cube"], name="pow"))
    elif cube == "x_xx":  # dynamo: x * (x * x)
        nodes += [oh.make_node("Mul", ["x", "x"], ["xx"], name="sq"),
                  oh.make_node("Mul", ["xx", "x"] if swap else ["x", "xx"], ["cube"], name="cube")]
    else:  # (x * x) * x
        nodes += [oh.make_node("Mul", ["x", "x"], ["xx"], name="sq"),
                  oh.make_node("Mul", ["x", "xx"] if swap else ["xx", "x"], ["cube"], name="cube")]
    nodes += [oh.make_node("Mul", ["c1", "cube"] if swap else ["cube", "c1"], ["c"], name="mul_c1"),
              oh.make_node("Add", ["c", "x"] if swap else ["x", "c"], ["inner"], name="add_x"),
              oh.make_node("Mul", ["inner", "c2"], ["arg"], name="mul_c2"),
              oh.make_node("Tanh", ["arg"], ["t"], name="tanh"),
              oh.make_node("Add", ["t", "one"], ["p"], name="add_one")]
    _scaled_product(nodes, "p", form, swap)
    outputs = [("y", X[1])]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["t"], ["probe"], name="probe"))
        outputs.append(("probe", X[1]))
    inits = {"three": np.float32(three), "c1": np.float32(c1), "c2": np.float32(c2), "one": np.float32(1.0),
             "half": np.float32(0.5)}
    inits = {k: v for k, v in inits.items() if any(k in n.input for n in nodes)}
    return make_model(nodes, [X], outputs, inits)


@pytest.mark.parametrize(("cube", "form"), [("pow", "half_first"), ("pow", "half_last"), ("x_xx", "p_half"),
                                            ("xx_x", "half_first"), ("xx_x", "half_last")])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_tanh_gelu_fires(cube, form, swap):
    check_fires(_tanh_gelu(cube, form, swap), "tanh-gelu", ["com.microsoft.FastGelu"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [{"three": 2.0}, {"c1": 0.05}, {"c2": 0.8}, {"extra_reader": True}],
                         ids=["square", "c1", "c2", "extra_reader"])
def test_tanh_gelu_near_misses(kw):
    check_misses(_tanh_gelu(**kw), "tanh-gelu")


def test_tanh_gelu_extra_reader_reason():
    why = why_not(_tanh_gelu(extra_reader=True), "tanh-gelu")
    assert "tanh: Tanh 'tanh' has 1 consumer(s) outside the match (Neg 'probe')" in why


def _biased(op, bias, swap=False, x_shape=(2, 4, 8), bias_input=False):
    domain_op = oh.make_node(op, ["a"], ["y"], name="act", domain="com.microsoft")
    add = oh.make_node("Add", ["b", "x"] if swap else ["x", "b"], ["a"], name="bias_add")
    inputs = [("x", list(x_shape))]
    inits = {}
    if bias_input:
        inputs.append(("b", list(np.shape(bias))))
    else:
        inits["b"] = np.asarray(bias, np.float32)
    m = make_model([add, domain_op], inputs, [("y", list(x_shape))], inits)
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    return m


BIAS = np.linspace(-1, 1, 8).astype(np.float32)


@pytest.mark.parametrize(("rule_id", "op", "want"), [("bias-gelu", "Gelu", ["com.microsoft.BiasGelu"]),
                                                     ("bias-fastgelu", "FastGelu", ["com.microsoft.FastGelu"])])
@pytest.mark.parametrize("x_shape", [(16, 8), (2, 4, 8), (2, 2, 2, 8)], ids=["rank2", "rank3", "rank4"])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_bias_gelu_fires(rule_id, op, want, x_shape, swap):
    got = check_fires(_biased(op, BIAS, swap, x_shape), rule_id, want, rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "b"]


@pytest.mark.parametrize(("rule_id", "op"), [("bias-gelu", "Gelu"), ("bias-fastgelu", "FastGelu")])
@pytest.mark.parametrize(("kw", "reason"), [
    ({"bias": np.zeros(8, np.float32)}, "require failed: not B.constant or any(B.value != 0)"),  # left to add-zero
    ({"bias": np.ones((4, 8), np.float32)}, None),  # the swapped Add order is reported
    ({"bias": np.ones(1, np.float32)}, None),  # a broadcast scalar is not a bias row
])
def test_bias_gelu_near_misses(rule_id, op, kw, reason):
    check_misses(_biased(op, **kw), rule_id, reason)


@pytest.mark.parametrize(("rule_id", "op", "want"), [("bias-gelu", "Gelu", ["com.microsoft.BiasGelu"]),
                                                     ("bias-fastgelu", "FastGelu", ["com.microsoft.FastGelu"])])
def test_bias_gelu_takes_a_bias_computed_at_run_time(rule_id, op, want):
    """The kernel takes the bias as a tensor input: a graph input (a LoRA delta, a dequantized weight) is as good
    as a constant."""
    got = check_fires(_biased(op, BIAS, bias_input=True), rule_id, want, rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "b"]


def test_linear_bias_then_erf_gelu_becomes_bias_gelu():
    """A Linear's bias Add followed by an exported Erf Gelu: erf-gelu, then bias-gelu on its result."""
    m = _erf_gelu(bias=BIAS)
    got = check_fires(m, ("erf-gelu", "bias-gelu"), ["com.microsoft.BiasGelu"],
                      fired={"erf-gelu": 1, "bias-gelu": 1}, feeds=rand_feeds(m), rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x0", "b"]


@pytest.mark.parametrize("c3", [0.7978845608 * 0.044715, 0.05])
def test_tanh_gelu_constants_multiplied_out(c3):
    """tanh(sqrt(2/pi) * x + 0.0356774 * x^3): the constants folded into each term, as some converters write it;
    a wrong product constant does not fire."""
    nodes = [oh.make_node("Pow", ["x", "three"], ["cube"], name="pow"),
             oh.make_node("Mul", ["x", "c2"], ["a"], name="a"), oh.make_node("Mul", ["cube", "c3"], ["b"], name="b"),
             oh.make_node("Add", ["a", "b"], ["arg"], name="arg"), oh.make_node("Tanh", ["arg"], ["t"], name="tanh"),
             oh.make_node("Add", ["t", "one"], ["p"], name="add_one")]
    _scaled_product(nodes, "p", "half_first", False)
    m = make_model(nodes, [X], [("y", X[1])], {"three": np.float32(3), "c2": np.float32(0.7978845608),
                                                 "c3": np.float32(c3), "one": np.float32(1), "half": np.float32(0.5)})
    if c3 == 0.05:
        check_misses(m, "tanh-gelu")
    else:
        check_fires(m, "tanh-gelu", ["com.microsoft.FastGelu"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("c1", "one", "fires"), [(0.044715, 1.0, True), (0.05, 1.0, False), (0.044715, 2.0, False)],
                         ids=["megatron", "c1", "one"])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_tanh_gelu_megatron_form(c1, one, fires, swap):
    """Megatron's tanh(0.79788456 * x * (1 + 0.044715 * x * x)): the cube never computed; a wrong constant or
    1 + ... written as 2 + ... does not fire."""
    nodes = [oh.make_node("Mul", ["c2", "x"] if swap else ["x", "c2"], ["a"], name="mul_c2"),
             oh.make_node("Mul", ["c1", "x"] if swap else ["x", "c1"], ["b"], name="mul_c1"),
             oh.make_node("Mul", ["b", "x"] if swap else ["x", "b"], ["bx"], name="mul_x"),
             oh.make_node("Add", ["one_i", "bx"] if swap else ["bx", "one_i"], ["q"], name="add_one_i"),
             oh.make_node("Mul", ["a", "q"], ["arg"], name="arg"), oh.make_node("Tanh", ["arg"], ["t"], name="tanh"),
             oh.make_node("Add", ["one", "t"] if swap else ["t", "one"], ["p"], name="add_one")]
    _scaled_product(nodes, "p", "half_first", swap)
    m = make_model(nodes, [X], [("y", X[1])], {"c2": np.float32(0.7978845608), "c1": np.float32(c1),
                                                 "one_i": np.float32(one), "one": np.float32(1),
                                                 "half": np.float32(0.5)})
    if fires:
        check_fires(m, "tanh-gelu", ["com.microsoft.FastGelu"], rtol=1e-4, atol=1e-4)
    else:
        check_misses(m, "tanh-gelu")


def _onnx_gelu20(approximate, bias, swap=False):
    """ONNX Gelu-20 (the starting point, not the contrib op) after a bias Add."""
    add = oh.make_node("Add", ["b", "x"] if swap else ["x", "b"], ["a"], name="bias_add")
    act = oh.make_node("Gelu", ["a"], ["y"], name="act", approximate=approximate)
    return make_model([add, act], [("x", [2, 4, 8])], [("y", [2, 4, 8])], {"b": np.asarray(bias, np.float32)},
                      opset=20)


@pytest.mark.parametrize(("approximate", "rule_id", "want"), [
    ("none", "bias-gelu", ["com.microsoft.BiasGelu"]), ("tanh", "bias-fastgelu", ["com.microsoft.FastGelu"])])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_bias_gelu_refines_onnx_gelu20(approximate, rule_id, want, swap):
    got = check_fires(_onnx_gelu20(approximate, BIAS, swap), rule_id, want, rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "b"]


def test_bias_gelu_keeps_the_approximation_of_gelu20():
    """Gelu-20 with approximate="tanh" is not BiasGelu's exact erf form (and the other way round)."""
    check_misses(_onnx_gelu20("tanh", BIAS), "bias-gelu", "Gelu approximate='tanh', rule needs 'none'")
    check_misses(_onnx_gelu20("none", BIAS), "bias-fastgelu", "Gelu approximate='none', rule needs 'tanh'")
