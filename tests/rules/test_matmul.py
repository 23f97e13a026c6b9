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
    other = "B" if side == "a" else "A"  # (the rewrite writes its alpha and other flags, defaults here)
    assert _attrs(got.graph.node[0]) == {f"trans{side.upper()}": 1, f"trans{other}": 0, "alpha": 1.0,
                                         f"transBatch{side.upper()}": 0, f"transBatch{other}": 0}
    assert list(got.graph.node[0].input) == ["a", "b"]


def _view(rank, tb, t):
    """FusedMatMul's view of an operand (as onnxruntime's kernel reads it), written out independently here."""
    if tb and t:
        return [*range(1, rank), 0]
    if tb:
        return [*range(1, rank - 1), 0, rank - 1]
    return [*range(rank - 2), rank - 1, rank - 2] if t else list(range(rank))


def _through(logical, perm):
    """The shape x must have for Transpose(x, perm) to have the shape `logical`."""
    shape = [0] * len(perm)
    for i, p in enumerate(perm):
        shape[p] = logical[i]
    return shape


@pytest.mark.parametrize(("tb", "t"), [(1, 0), (1, 1), (0, 1)], ids=["batch", "batch+last", "last"])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("side", ["a", "b"])
def test_a_transpose_the_flags_express_becomes_them_batch_axes_too(side, rank, tb, t):
    """Every Transpose one of FusedMatMul's views is (transBatch moves the first axis before the last, trans
    swaps the last two, or both), on either operand: one FusedMatMul with those flags, the same numbers."""
    la, lb = [2, 3, 4, 8][-rank:], [2, 3, 8, 6][-rank:]
    perm = _view(rank, tb, t)
    x = _through(la if side == "a" else lb, perm)
    nodes = [oh.make_node("Transpose", [side], ["t"], perm=perm),
             oh.make_node("MatMul", ["t", "b"] if side == "a" else ["a", "t"], ["y"])]
    m = make_model(nodes, [("a", x if side == "a" else la), ("b", x if side == "b" else lb)],
                   [("y", la[:-1] + lb[-1:])])
    got = check_fires(m, MATMUL_T[side], ["com.microsoft.FusedMatMul"])
    a = _attrs(got.graph.node[0])
    assert (a[f"transBatch{side.upper()}"], a[f"trans{side.upper()}"]) == (tb, t)


def test_a_fused_matmul_already_there_composes_a_transpose_with_its_own_view():
    """FusedMatMul(Transpose(A, [1, 0, 2]), B, transA=1): its view of the transpose's output moves the first axis
    after the last two swapped; composed with the Transpose that is transBatchA=1, transA=1 of A itself."""
    nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=[1, 0, 2]),
             oh.make_node("FusedMatMul", ["at", "b"], ["y"], domain="com.microsoft", alpha=0.5, transA=1)]
    m = make_model(nodes, [("a", [8, 2, 4]), ("b", [2, 8, 6])], [("y", [2, 4, 6])])
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    got = check_fires(m, "matmul-transpose-a", ["com.microsoft.FusedMatMul"])
    a = _attrs(got.graph.node[0])
    assert (a["transBatchA"], a["transA"], a["alpha"]) == (1, 1, 0.5) and list(got.graph.node[0].input) == ["a", "b"]


@pytest.mark.parametrize("side", ["a", "b"])
def test_matmul_transpose_near_misses(side):
    # a permutation no flags express (the middle two of four axes swapped)
    a4, b4 = [2, 4, 3, 8], [2, 8, 3, 6]
    nodes = [oh.make_node("Transpose", [side], ["t"], perm=[0, 2, 1, 3], name="tr"),
             oh.make_node("MatMul", ["t", "b"] if side == "a" else ["a", "t"], ["y"], name="mm")]
    m = make_model(nodes, [("a", a4 if side == "a" else [2, 3, 4, 8]), ("b", b4 if side == "b" else [2, 3, 8, 6])],
                   [("y", [2, 3, 4, 6])])
    check_misses(m, MATMUL_T[side], "the transpose is not a view FusedMatMul's flags express")
    # a batch axis moved where the other operand has another rank: the kernel refuses it
    if side == "a":
        nodes = [oh.make_node("Transpose", ["a"], ["t"], perm=[1, 0, 2], name="tr"),
                 oh.make_node("MatMul", ["t", "b"], ["y"], name="mm")]
        m = make_model(nodes, [("a", [4, 2, 8]), ("b", [8, 6])], [("y", [2, 4, 6])])
    else:
        nodes = [oh.make_node("Transpose", ["b"], ["t"], perm=[1, 0, 2], name="tr"),
                 oh.make_node("MatMul", ["a", "t"], ["y"], name="mm")]
        m = make_model(nodes, [("a", [4, 8]), ("b", [8, 2, 6])], [("y", [2, 4, 6])])
    check_misses(m, MATMUL_T[side], "FusedMatMul moves a batch axis only where both operands have the same rank")
    check_misses(_transposed_operand(side, [0, 2, 1], extra_reader=True), MATMUL_T[side],
                 "Transpose 'tr' (line t) has 1 consumer(s) outside the match (Neg 'probe')")


def _transposed_product(ra, rb, perm=None, fused=None):
    """Transpose(MatMul(a, b)) (or of a FusedMatMul with the attributes `fused`), a [.., 4, 8] @ b [.., 8, 6]."""
    la, lb = [2, 3, 4, 8][-ra:], [2, 3, 8, 6][-rb:]
    if fused:
        la = _through(la, _view(ra, 0, fused.get("transA", 0)))
        lb = _through(lb, _view(rb, 0, fused.get("transB", 0)))
        mm = oh.make_node("FusedMatMul", ["a", "b"], ["m"], name="mm", domain="com.microsoft", **fused)
    else:
        mm = oh.make_node("MatMul", ["a", "b"], ["m"], name="mm")
    r = max(ra, rb)
    perm = perm or _view(r, 0, 1)
    out = ([2, 3][-(r - 2):] if r > 2 else []) + [4, 6]
    m = make_model([mm, oh.make_node("Transpose", ["m"], ["y"], perm=perm, name="tr")],
                   [("a", la), ("b", lb)], [("y", [out[p] for p in perm])])
    if fused:
        m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    return m


@pytest.mark.parametrize(("ra", "rb"), [(2, 2), (3, 3), (4, 4), (3, 2), (2, 3)])
def test_matmul_transpose_output_fires(ra, rb):
    """(A B)^T over the last two axes is B^T A^T: one FusedMatMul(B, A) reading both transposed."""
    got = check_fires(_transposed_product(ra, rb), "matmul-transpose-output", ["com.microsoft.FusedMatMul"])
    assert list(got.graph.node[0].input) == ["b", "a"]
    a = _attrs(got.graph.node[0])
    assert (a["transA"], a["transB"], a["alpha"]) == (1, 1, 1.0)


def test_matmul_transpose_output_refines_a_fused_matmul_already_there():
    got = check_fires(_transposed_product(3, 3, fused={"transA": 1, "alpha": 0.25}), "matmul-transpose-output",
                      ["com.microsoft.FusedMatMul"])
    a = _attrs(got.graph.node[0])
    assert (a["transA"], a["transB"], a["alpha"]) == (1, 0, 0.25)  # B's flag toggled, A's swapped and toggled


def test_matmul_transpose_output_near_misses():
    check_misses(_transposed_product(3, 3, perm=[1, 0, 2]), "matmul-transpose-output",
                 "the Transpose does more than swap the last two axes")
    check_misses(_transposed_product(3, 3, fused={"transBatchB": 1}), "matmul-transpose-output",
                 "a vector operand, or a FusedMatMul that moves a batch axis")


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


def test_a_fused_matmul_that_transposes_its_batch_axes_is_refined_where_the_ranks_are_equal():
    nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
             oh.make_node("FusedMatMul", ["at", "b"], ["y"], domain="com.microsoft", transBatchB=1)]
    m = make_model(nodes, [("a", [2, 16, 8]), ("b", [16, 2, 4])], [("y", [2, 8, 4])])
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    got = check_fires(m, "matmul-transpose-a", ["com.microsoft.FusedMatMul"])
    a = _attrs(got.graph.node[0])
    assert (a["transA"], a["transBatchA"], a["transB"], a["transBatchB"]) == (1, 0, 0, 1)


@pytest.mark.parametrize("rank", [3, 4])
def test_every_transpose_before_or_after_a_matmul_stays_exact(rank):
    """Whatever the matmul and transpose rules make of MatMul(Transpose(A, perm), B), MatMul(A, Transpose(B, perm))
    and Transpose(MatMul(A, B), perm), every perm of a rank-3 and rank-4 operand included (FusedMatMul's flags
    express only some; the others must stay as they were, alone or through two rules), the rewritten model gives
    the original's numbers, at two sets of dims, all different (a swapped axis cannot hide)."""
    import itertools

    rules = ["matmul-transpose-a", "matmul-transpose-b", "matmul-transpose-output", "transpose-merge",
             "transpose-cancel", "matmul-scale", "fusedmatmul-scale"]
    dims = {3: [(2, 3, 5, 7), (3, 5, 4, 2)], 4: [(2, 3, 5, 7, 4), (3, 2, 4, 5, 6)]}[rank]
    fired_any = 0
    for perm in itertools.permutations(range(rank)):
        for where in ("a", "b", "out"):
            for d in dims:
                lead, (m_, k_, n_) = d[:rank - 2], d[rank - 2:rank + 1]
                a_shape, b_shape = (*lead, m_, k_), (*lead, k_, n_)
                inv = list(np.argsort(perm))
                nodes, inputs = [], []
                if where == "a":  # the input as the Transpose's inverse makes it [.., m, k]
                    inputs = [("a", [a_shape[i] for i in inv]), ("b", list(b_shape))]
                    nodes = [oh.make_node("Transpose", ["a"], ["at"], perm=list(perm)),
                             oh.make_node("MatMul", ["at", "b"], ["y"])]
                elif where == "b":
                    inputs = [("a", list(a_shape)), ("b", [b_shape[i] for i in inv])]
                    nodes = [oh.make_node("Transpose", ["b"], ["bt"], perm=list(perm)),
                             oh.make_node("MatMul", ["a", "bt"], ["y"])]
                else:
                    inputs = [("a", list(a_shape)), ("b", list(b_shape))]
                    nodes = [oh.make_node("MatMul", ["a", "b"], ["ab"]),
                             oh.make_node("Transpose", ["ab"], ["y"], perm=list(perm))]
                m = make_model(nodes, inputs, [("y", None)], {}, opset=17)
                r, got = fuse(m, *rules)
                fired_any += sum(r.fired.values())
                assert_same(m, got, rand_feeds(m, seed=sum(d)), rtol=1e-5, atol=1e-5)
    assert fired_any > 0  # some transposes are FusedMatMul's to take
