"""patterns/noop.yaml: adding / subtracting exact zeros, multiplying / dividing by exact ones, a Concat of one
input. Each removed op's readers read its input; a graph output keeps its name through an Identity."""

import numpy as np
import onnx.helper as oh
import pytest

from .conftest import check_fires, check_misses, make_model

OPS = {"add-zero": ("Add", 0.0), "sub-zero": ("Sub", 0.0), "mul-one": ("Mul", 1.0), "div-one": ("Div", 1.0)}


def _binary(rule_id, const_shape=(3,), value=None, swap=False, x_shape=(2, 3), as_output=False):
    op, neutral = OPS[rule_id]
    k = np.full(const_shape, neutral if value is None else value, np.float32)
    nodes = [oh.make_node(op, ["k", "x"] if swap else ["x", "k"], ["n"], name="noop")]
    out_shape = list(np.broadcast_shapes(tuple(x_shape), const_shape))
    if as_output:
        nodes[0].output[0] = "y"
    else:
        nodes.append(oh.make_node("Relu", ["n"], ["y"], name="relu"))
    return make_model(nodes, [("x", list(x_shape))], [("y", out_shape)], {"k": k})


@pytest.mark.parametrize("rule_id", list(OPS))
@pytest.mark.parametrize("const_shape", [(), (1,), (3,), (2, 3), (1, 1)], ids=str)
def test_noop_fires(rule_id, const_shape):
    got = check_fires(_binary(rule_id, const_shape), rule_id, ["Relu"])
    assert list(got.graph.node[0].input) == ["x"]


@pytest.mark.parametrize("rule_id", ["add-zero", "mul-one"])
def test_noop_commutative_order(rule_id):
    check_fires(_binary(rule_id, swap=True), rule_id, ["Relu"])


@pytest.mark.parametrize("rule_id", list(OPS))
def test_noop_graph_output_keeps_its_name(rule_id):
    got = check_fires(_binary(rule_id, as_output=True), rule_id, ["Identity"])
    assert list(got.graph.node[0].input) == ["x"] and list(got.graph.node[0].output) == ["y"]


ALMOST = {"add-zero": 1e-7, "sub-zero": -1e-7, "mul-one": 1 + 2**-23, "div-one": 1 - 2**-24}  # not exact


@pytest.mark.parametrize("rule_id", list(OPS))
@pytest.mark.parametrize("mutant", ["almost", "grows-rank", "grows-dim"])
def test_noop_near_misses(rule_id, mutant):
    name = "Z" if rule_id in ("add-zero", "sub-zero") else "O"
    if mutant == "almost":  # rtol 0, atol 0; the reported failure can be the swapped order's
        check_misses(_binary(rule_id, value=ALMOST[rule_id]), rule_id)
    elif mutant == "grows-rank":  # broadcasting the constant would change x's shape
        check_misses(_binary(rule_id, const_shape=(4, 1, 1)), rule_id,
                     f"require failed: broadcasts_into({name}.dims, X.dims)")
    else:
        check_misses(_binary(rule_id, const_shape=(2, 1), x_shape=(1, 3)), rule_id,
                     f"require failed: broadcasts_into({name}.dims, X.dims)")


@pytest.mark.parametrize("rule_id", ["sub-zero", "div-one"])
def test_noop_neutral_on_the_left_is_not_neutral(rule_id):
    # 0 - x and 1 / x change x
    name = "Z" if rule_id == "sub-zero" else "O"
    check_misses(_binary(rule_id, swap=True), rule_id, f"{name} ('x') is not a constant")


def _concat(n_inputs=1, as_output=False):
    ins = ["x", "x2"][:n_inputs]
    nodes = [oh.make_node("Concat", ins, ["c"], axis=1, name="cat")]
    if as_output:
        nodes[0].output[0] = "y"
    else:
        nodes.append(oh.make_node("Relu", ["c"], ["y"], name="relu"))
    inputs = [("x", [2, 3]), ("x2", [2, 3])][:n_inputs]
    return make_model(nodes, inputs, [("y", [2, 3 * n_inputs])])


def test_concat_single_fires():
    got = check_fires(_concat(), "concat-single", ["Relu"])
    assert list(got.graph.node[0].input) == ["x"]
    check_fires(_concat(as_output=True), "concat-single", ["Identity"])


def test_concat_single_near_miss():
    check_misses(_concat(2), "concat-single", "Concat has 2 inputs, rule expects 1")
