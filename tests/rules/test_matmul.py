"""patterns/matmul.yaml: Gemm + activation -> FusedGemm; MatMul with a scalar scale or a transposed operand ->
FusedMatMul; a Transpose feeding Gemm folded into transA / transB."""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from .conftest import assert_same, check_fires, check_misses, fuse, make_model, op_types, rand_feeds

RNG = np.random.default_rng(0)
W86 = RNG.standard_normal((8, 6)).astype(np.float32)
C6 = RNG.standard_normal(6).astype(np.float32)


def _attrs(node):
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


def _gemm_act(act, bias=True, trans_b=False, dtype=TensorProto.FLOAT, extra_reader=False, **act_attrs):
    np_t = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    inits = {"w": (W86.T if trans_b else W86).astype(np_t)}
    if bias:
        inits["c"] = C6.astype(np_t)
    nodes = [oh.make_node("Gemm", ["a", "w"] + (["c"] if bias else []), ["g"], name="gemm", transB=int(trans_b)),
             oh.make_node(act, ["g"], ["y"], name="act", **act_attrs)]
    outputs = [("y", [4, 6], dtype)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["g"], ["probe"], name="probe"))
        outputs.append(("probe", [4, 6], dtype))
    return make_model(nodes, [("a", [4, 8], dtype)], outputs, inits)


@pytest.mark.parametrize("act", ["Relu", "Tanh", "Sigmoid"])
@pytest.mark.parametrize(("bias", "trans_b"), [(True, False), (False, False), (True, True)],
                         ids=["bias", "no-bias", "transB"])
def test_gemm_activation_fires(act, bias, trans_b):
    got = check_fires(_gemm_act(act, bias, trans_b), "gemm-activation", ["com.microsoft.FusedGemm"])
    attrs = _attrs(got.graph.node[0])
    assert attrs["activation"] == act.encode() and attrs.get("transB", 0) == int(trans_b)
    assert len(got.graph.node[0].input) == (3 if bias else 2)


@pytest.mark.parametrize(("kw", "reason"), [
    ({"extra_reader": True}, "Gemm 'gemm' (line g) has 1 consumer(s) outside the match (Neg 'probe')"),
    ({"dtype": TensorProto.DOUBLE}, "A has dtype double, rule allows float"),
])
def test_gemm_activation_near_misses(kw, reason):
    check_misses(_gemm_act("Relu", **kw), "gemm-activation", reason)


def test_gemm_activation_is_cpu_only():
    r, got = fuse(_gemm_act("Relu"), "gemm-activation", target="cuda")
    assert r.fired == {} and [(s.rule, s.reason) for s in r.skipped] == [("gemm-activation", "declared for cpu only")]
    assert op_types(got) == ["Gemm", "Relu"]


def test_gemm_leakyrelu_fires():
    got = check_fires(_gemm_act("LeakyRelu", alpha=0.2), "gemm-leakyrelu", ["com.microsoft.FusedGemm"])
    attrs = _attrs(got.graph.node[0])
    assert attrs["activation"] == b"LeakyRelu" and abs(attrs["activation_alpha"] - 0.2) < 1e-7


def test_gemm_leakyrelu_default_alpha():
    got = check_fires(_gemm_act("LeakyRelu"), "gemm-leakyrelu", ["com.microsoft.FusedGemm"])
    assert abs(_attrs(got.graph.node[0])["activation_alpha"] - 0.01) < 1e-7


def test_gemm_leakyrelu_near_miss():
    check_misses(_gemm_act("LeakyRelu", extra_reader=True, alpha=0.2), "gemm-leakyrelu",
                 "Gemm 'gemm' (line g) has 1 consumer(s) outside the match")


def _scaled_matmul(form, s=0.125, s_shape=(), s_input=False, dtype=TensorProto.FLOAT):
    """A [2, 4, 8] @ B [2, 8, 6] with a scalar scale (B an input: attention's Q @ K^T)."""
    a, b = "a", "b"
    nodes = []
    if form == "a_scaled":
        nodes.append(oh.make_node("Mul", ["a", "s"], ["as"], name="scale"))
        a = "as"
    elif form == "b_scaled":
        nodes.append(oh.make_node("Mul", ["b", "s"], ["bs"], name="scale"))
        b = "bs"
    nodes.append(oh.make_node("MatMul", [a, b], ["mm"], name="mm"))
    if form == "after":
        nodes.append(oh.make_node("Mul", ["mm", "s"], ["y"], name="scale"))
    elif form == "after_swapped":
        nodes.append(oh.make_node("Mul", ["s", "mm"], ["y"], name="scale"))
    elif form == "div":
        nodes.append(oh.make_node("Div", ["mm", "s"], ["y"], name="scale"))
    else:
        nodes[-1].output[0] = "y"
    inputs = [("a", [2, 4, 8], dtype), ("b", [2, 8, 6], dtype)]
    inits = {}
    np_t = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    if s_input:
        inputs.append(("s", list(s_shape), dtype))
    else:
        inits["s"] = np.full(s_shape, s, np_t)
    return make_model(nodes, inputs, [("y", [2, 4, 6], dtype)], inits)


@pytest.mark.parametrize(("form", "alpha"), [("after", 0.125), ("after_swapped", 0.125), ("a_scaled", 0.125),
                                             ("b_scaled", 0.125), ("div", 8.0)])
@pytest.mark.parametrize("s_shape", [(), (1,)], ids=["scalar", "1-elem"])
def test_matmul_scale_fires(form, alpha, s_shape):
    got = check_fires(_scaled_matmul(form, s=alpha, s_shape=s_shape), "matmul-scale",
                      ["com.microsoft.FusedMatMul"])
    assert list(got.graph.node[0].input) == ["a", "b"]
    assert _attrs(got.graph.node[0])["alpha"] == 0.125


@pytest.mark.parametrize("form", ["after", "a_scaled", "div"])
@pytest.mark.parametrize("kw", [{"s_shape": (6,)}, {"s_input": True}, {"dtype": TensorProto.DOUBLE}],
                         ids=["per-column", "not-constant", "float64"])
def test_matmul_scale_near_misses(form, kw):
    if form == "a_scaled" and kw.get("s_shape") == (6,):
        kw = {"s_shape": (8,)}  # per-column scale of A
    check_misses(_scaled_matmul(form, **kw), "matmul-scale")


def _transposed_operand(side, perm, extra_reader=False):
    """MatMul with one operand a Transpose of an input (constant operands would be folded first)."""
    if side == "b":
        shape_b = {2: [6, 8], 3: [2, 6, 8], 4: [2, 3, 6, 8]}[len(perm)] if perm != [1, 0, 2] else [8, 2, 6]
        shape_a = {2: [4, 8], 3: [2, 4, 8], 4: [2, 3, 4, 8]}[len(perm)]
        nodes = [oh.make_node("Transpose", ["b"], ["bt"], perm=perm, name="tr"),
                 oh.make_node("MatMul", ["a", "bt"], ["y"], name="mm")]
    else:
        shape_a = {2: [8, 4], 3: [2, 8, 4], 4: [2, 3, 8, 4]}[len(perm)] if perm != [1, 0, 2] else [4, 2, 8]
        shape_b = {2: [8, 6], 3: [2, 8, 6], 4: [2, 3, 8, 6]}[len(perm)]
        nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=perm, name="tr"),
                 oh.make_node("MatMul", ["at", "b"], ["y"], name="mm")]
    out = {2: [4, 6], 3: [2, 4, 6], 4: [2, 3, 4, 6]}[len(perm)]
    outputs = [("y", out)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["bt" if side == "b" else "at"], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, [("a", shape_a), ("b", shape_b)], outputs)


PERMS = [[1, 0], [0, 2, 1], [0, 1, 3, 2]]


MATMUL_T = {"a": "matmul-transpose-a", "b": "matmul-transpose-b"}
GEMM_T = {"a": "gemm-transpose-a", "b": "gemm-transpose-b"}


@pytest.mark.parametrize("perm", PERMS, ids=["rank2", "rank3", "rank4"])
@pytest.mark.parametrize("side", ["a", "b"])
def test_matmul_transpose_fires(side, perm):
    got = check_fires(_transposed_operand(side, perm), MATMUL_T[side], ["com.microsoft.FusedMatMul"])
    other = "B" if side == "a" else "A"  # (the rewrite writes its alpha and other transpose flag, defaults here)
    assert _attrs(got.graph.node[0]) == {f"trans{side.upper()}": 1, f"trans{other}": 0, "alpha": 1.0}
    assert list(got.graph.node[0].input) == ["a", "b"]


@pytest.mark.parametrize("side", ["a", "b"])
def test_matmul_transpose_near_misses(side):
    # a permutation that is not a swap of the last two axes
    check_misses(_transposed_operand(side, [1, 0, 2]), MATMUL_T[side],
                 "Transpose perm=[1, 0, 2], rule needs [0, 1, 3, 2]")
    check_misses(_transposed_operand(side, [0, 2, 1], extra_reader=True), MATMUL_T[side],
                 "Transpose 'tr' has 1 consumer(s) outside the match (Neg 'probe')")


def _gemm_of_transpose(side, trans=0, alpha=0.5, beta=2.0, perm=(1, 0), extra_reader=False):
    """Gemm whose A (or B) is a Transpose of an input (a constant would be folded first)."""
    ta, tb = (trans, 0) if side == "a" else (0, trans)
    operand = ([4, 8] if side == "a" else [8, 6])[::-1 if trans else 1]  # what the Gemm reads
    shape = operand if list(perm) == [0, 1] else operand[::-1]
    if side == "a":
        gemm = oh.make_node("Gemm", ["t", "w", "c"], ["y"], name="gemm", transA=ta, alpha=alpha, beta=beta)
        inits = {"w": W86, "c": C6}
    else:
        gemm = oh.make_node("Gemm", ["x", "t", "c"], ["y"], name="gemm", transB=tb, alpha=alpha, beta=beta)
        inits = {"c": C6}
    nodes = [oh.make_node("Transpose", ["a"], ["t"], perm=list(perm), name="tr"), gemm]
    inputs = [("a", shape)] + ([("x", [4, 8])] if side == "b" else [])
    outputs = [("y", [4, 6])]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["t"], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("side", ["a", "b"])
def test_gemm_transpose_fires(side, trans):
    got = check_fires(_gemm_of_transpose(side, trans), GEMM_T[side], ["Gemm"])
    attrs = _attrs(got.graph.node[0])
    assert attrs[f"trans{side.upper()}"] == 1 - trans and attrs["alpha"] == 0.5 and attrs["beta"] == 2.0
    assert "a" in got.graph.node[0].input


@pytest.mark.parametrize("side", ["a", "b"])
def test_gemm_transpose_near_misses(side):
    check_misses(_gemm_of_transpose(side, extra_reader=True), GEMM_T[side],
                 "Transpose 'tr' has 1 consumer(s) outside the match (Neg 'probe')")
    # an identity Transpose: flipping transA / transB would be wrong
    check_misses(_gemm_of_transpose(side, perm=(0, 1)), GEMM_T[side], "Transpose perm=[0, 1], rule needs [1, 0]")


@pytest.mark.parametrize("order", ["scale-rule-first", "transpose-rule-first"])
def test_a_transposed_scaled_matmul_becomes_one_fused_matmul_whichever_rule_fires_first(order):
    """MatMul(Transpose(A), B) * 0.125: whichever of matmul-scale and matmul-transpose-a takes it, the other's
    refinement of the FusedMatMul it made (fusedmatmul-scale, or matmul-transpose-a on a FusedMatMul) finishes."""
    nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]), oh.make_node("MatMul", ["at", "b"], ["m"]),
             oh.make_node("Mul", ["m", "s"], ["y"])]
    m = make_model(nodes, [("a", [2, 16, 8]), ("b", [2, 16, 4])], [("y", [2, 8, 4])], {"s": np.array(0.125, np.float32)})
    ids = (["matmul-scale", "matmul-transpose-a"] if order == "scale-rule-first" else
           ["matmul-transpose-a", "fusedmatmul-scale"])
    r, got = fuse(m, *ids, "fusedmatmul-scale" if order == "scale-rule-first" else "matmul-scale")
    assert op_types(got) == ["com.microsoft.FusedMatMul"], op_types(got)
    a = _attrs(got.graph.node[0])
    assert a["transA"] == 1 and a.get("transB", 0) == 0 and a["alpha"] == pytest.approx(0.125)
    assert_same(m, got, rand_feeds(m))


def test_a_fused_matmul_already_there_takes_a_transpose_by_toggling_and_keeps_its_alpha():
    nodes = [oh.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
             oh.make_node("FusedMatMul", ["a", "bt"], ["y"], domain="com.microsoft", alpha=0.5, transB=1)]
    m = make_model(nodes, [("a", [2, 8, 16]), ("b", [2, 16, 4])], [("y", [2, 8, 4])])
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    got = check_fires(m, "matmul-transpose-b", ["com.microsoft.FusedMatMul"])
    a = _attrs(got.graph.node[0])
    assert (a.get("transA", 0), a["transB"], a["alpha"]) == (0, 0, 0.5)  # B^T^T: no transpose left


def test_a_fused_matmul_that_transposes_its_batch_axes_is_not_refined():
    nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
             oh.make_node("FusedMatMul", ["at", "b"], ["y"], domain="com.microsoft", transBatchB=1)]
    m = make_model(nodes, [("a", [2, 16, 8]), ("b", [16, 2, 4])], [("y", [2, 8, 4])])
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    check_misses(m, "matmul-transpose-a", "transBatchB=1, rule needs 0")
