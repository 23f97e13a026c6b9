"""patterns/transpose.yaml: inverse Transpose pairs cancel, pairs merge, Transposes of constants fold, and
Transposes move below elementwise ops and ops with axes (the axes mapped through the permutation), so that
they meet their inverse."""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from .conftest import check_fires, check_misses, fuse, make_model, rand_feeds

P3 = [2, 0, 1]  # x [2, 3, 4] -> [4, 2, 3]
X3 = [2, 3, 4]
T3 = [4, 2, 3]


def _attrs(node):
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


def _inits(got):
    return {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}


def _probe(nodes, outputs, value):
    nodes.append(oh.make_node("Neg", [value], ["probe"], name="probe"))
    outputs.append(("probe", None))


# ----- pairs and constants -------------------------------------------------------------------------------------
def _pair(p1, p2, x_shape=X3, first_read=False):
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=p1, name="t1"),
             oh.make_node("Transpose", ["t"], ["u"], perm=p2, name="t2"),
             oh.make_node("Relu", ["u"], ["y"], name="relu")]
    outputs = [("y", None)]
    if first_read:
        _probe(nodes, outputs, "t")
    return make_model(nodes, [("x", x_shape)], outputs)


@pytest.mark.parametrize(("p1", "p2"), [([1, 2, 0], [2, 0, 1]), ([0, 2, 1], [0, 2, 1]), ([1, 0, 2], [1, 0, 2])])
def test_transpose_cancel_fires(p1, p2):
    got = check_fires(_pair(p1, p2), "transpose-cancel", ["Relu"])
    assert list(got.graph.node[0].input) == ["x"]


def test_transpose_cancel_keeps_a_first_transpose_others_read():
    check_fires(_pair([1, 2, 0], [2, 0, 1], first_read=True), "transpose-cancel", ["Transpose", "Relu", "Neg"])


def test_transpose_cancel_near_miss():
    check_misses(_pair([1, 2, 0], [1, 2, 0]), "transpose-cancel",
                 "require failed: is_identity_perm(compose_perm(t.perm, Y.perm))")


@pytest.mark.parametrize(("p1", "p2", "want"), [([1, 2, 0], [1, 2, 0], [2, 0, 1]), ([0, 2, 1], [1, 0, 2], [2, 0, 1]),
                                                ([2, 0, 1], [0, 2, 1], [2, 1, 0])])
def test_transpose_merge_fires(p1, p2, want):
    got = check_fires(_pair(p1, p2), "transpose-merge", ["Transpose", "Relu"])
    assert _attrs(got.graph.node[0]) == {"perm": want}


def test_transpose_merge_near_misses():
    check_misses(_pair([1, 2, 0], [2, 0, 1]), "transpose-merge", "require failed: not is_identity_perm")
    check_misses(_pair([1, 2, 0], [1, 2, 0], first_read=True), "transpose-merge",
                 "Transpose 't1' (line t) has 1 consumer(s) outside the match (Neg 'probe')")


def _of_const(c_input=False):
    c = np.arange(24, dtype=np.float32).reshape(X3)
    nodes = [oh.make_node("Transpose", ["c"], ["ct"], perm=P3, name="tc"),
             oh.make_node("Add", ["x", "ct"], ["y"], name="add")]
    inputs = [("x", T3)] + ([("c", X3)] if c_input else [])
    return make_model(nodes, inputs, [("y", T3)], {} if c_input else {"c": c})


def test_transpose_const_fires():
    # folding alone would do it too: the rule is tested alone (fold=False)
    got = check_fires(_of_const(), "transpose-const", ["Add"], fold=False)
    np.testing.assert_array_equal(_inits(got)[got.graph.node[0].input[1]],
                                  np.arange(24, dtype=np.float32).reshape(X3).transpose(P3))


def test_transpose_const_near_miss():
    check_misses(_of_const(c_input=True), "transpose-const", "C ('c') is not a constant", fold=False)


# ----- elementwise ---------------------------------------------------------------------------------------------
UNARY = {"transpose-below-relu": ("Relu", {}), "transpose-below-sigmoid": ("Sigmoid", {}),
         "transpose-below-tanh": ("Tanh", {}), "transpose-below-leakyrelu": ("LeakyRelu", {"alpha": 0.3}),
         "transpose-below-hardsigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
         "transpose-below-neg": ("Neg", {}), "transpose-below-abs": ("Abs", {}), "transpose-below-erf": ("Erf", {}),
         "transpose-below-exp": ("Exp", {}), "transpose-below-sqrt": ("Sqrt", {})}


def _unary(op, attrs, first_read=False):
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=P3, name="tr"),
             oh.make_node(op, ["t"], ["y"], name="op", **attrs)]
    outputs = [("y", T3)]
    if first_read:
        _probe(nodes, outputs, "t")
    return make_model(nodes, [("x", X3)], outputs)


@pytest.mark.parametrize("rule_id", list(UNARY))
def test_transpose_below_unary_fires(rule_id):
    op, attrs = UNARY[rule_id]
    m = _unary(op, attrs)
    got = check_fires(m, rule_id, [op, "Transpose"], feeds=rand_feeds(m, positive=op == "Sqrt"))
    assert _attrs(got.graph.node[0]) == pytest.approx(attrs) and _attrs(got.graph.node[1]) == {"perm": P3}


@pytest.mark.parametrize("rule_id", list(UNARY))
def test_transpose_below_unary_near_miss(rule_id):
    op, attrs = UNARY[rule_id]
    check_misses(_unary(op, attrs, first_read=True), rule_id,
                 "Transpose 'tr' (line t) has 1 consumer(s) outside the match (Neg 'probe')")


BINARY = {"Add": ("transpose-below-add", "transpose-below-add-const"),
          "Mul": ("transpose-below-mul", "transpose-below-mul-const"),
          "Sub": ("transpose-below-sub", "transpose-below-sub-const"),
          "Div": ("transpose-below-div", "transpose-below-div-const")}


def _binary(op, p_a=P3, p_b=P3, b_shape=X3):
    nodes = [oh.make_node("Transpose", ["a"], ["ta"], perm=p_a, name="ta"),
             oh.make_node("Transpose", ["b"], ["tb"], perm=p_b, name="tb"),
             oh.make_node(op, ["ta", "tb"], ["y"], name="op")]
    return make_model(nodes, [("a", X3), ("b", b_shape)], [("y", T3)])


@pytest.mark.parametrize("op", list(BINARY))
def test_transpose_below_binary_fires(op):
    m = _binary(op)
    got = check_fires(m, BINARY[op][0], [op, "Transpose"], feeds=rand_feeds(m, positive=True))
    assert list(got.graph.node[0].input) == ["a", "b"]


@pytest.mark.parametrize("op", list(BINARY))
def test_transpose_below_binary_near_miss(op):
    # the same shape after different permutations
    m = _binary(op, p_b=[2, 1, 0], b_shape=[3, 2, 4])
    check_misses(m, BINARY[op][0], None)


def _with_const(op, c_shape, swap=False):
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Transpose", ["a"], ["ta"], perm=P3, name="ta"),
             oh.make_node(op, ["c", "ta"] if swap else ["ta", "c"], ["y"], name="op")]
    return make_model(nodes, [("a", X3)], [("y", T3)], {"c": rng.uniform(0.5, 2, c_shape).astype(np.float32)})


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("c_shape", [(), (1,), (1, 1, 1), T3], ids=str)
def test_transpose_below_binary_const_fires(op, c_shape):
    m = _with_const(op, c_shape)
    got = check_fires(m, BINARY[op][1], [op, "Transpose"], feeds=rand_feeds(m, positive=True))
    if c_shape == T3:  # laid out before the Transpose
        c = numpy_helper.to_array(m.graph.initializer[0])
        np.testing.assert_array_equal(_inits(got)[got.graph.node[0].input[1]], c.transpose(np.argsort(P3)))


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_transpose_below_commutative_const_either_side(op):
    m = _with_const(op, T3, swap=True)
    check_fires(m, BINARY[op][1], [op, "Transpose"])


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("c_shape", [(3,), (2, 1), (2, 3)], ids=str)
def test_transpose_below_binary_broadcast_const_fires(op, c_shape):
    # tf2onnx's per-channel [C] after an NHWC Transpose: made full rank with leading 1s, then laid out
    m = _with_const(op, c_shape)
    got = check_fires(m, BINARY[op][1], [op, "Transpose"], feeds=rand_feeds(m, positive=True))
    c = numpy_helper.to_array(m.graph.initializer[0])
    want = c.reshape((1,) * (3 - c.ndim) + c.shape).transpose(np.argsort(P3))
    np.testing.assert_array_equal(_inits(got)[got.graph.node[0].input[1]], want)


@pytest.mark.parametrize("op", list(BINARY))
def test_transpose_below_binary_const_near_misses(op):
    # a constant of higher rank than the Transpose's output would change the output rank
    check_misses(_with_const(op, (1,) + tuple(T3)), BINARY[op][1], None)
    if op in ("Sub", "Div"):  # c - t, c / t: the Transpose is not the first operand
        check_misses(_with_const(op, T3, swap=True), BINARY[op][1], None)


def _gated(act, perm=(0, 2, 3, 1), extra_reader=False):
    kw = {"alpha": 0.25, "beta": 0.5} if act == "HardSigmoid" else {}
    nodes = [oh.make_node("Transpose", ["a"], ["t"], perm=list(perm), name="tr"),
             oh.make_node(act, ["t"], ["h"], name="act", **kw),
             oh.make_node("Mul", ["t", "h"], ["y"], name="mul")]
    outputs = [("y", None)]
    if extra_reader:
        _probe(nodes, outputs, "t")
    return make_model(nodes, [("a", [1, 4, 3, 5])], outputs)


GATED = {"HardSigmoid": "transpose-below-hardswish", "Sigmoid": "transpose-below-swish"}


@pytest.mark.parametrize("act", list(GATED))
def test_transpose_below_gated_activation_fires(act):
    got = check_fires(_gated(act), GATED[act], [act, "Mul", "Transpose"])
    assert list(got.graph.node[0].input) == ["a"]
    assert _attrs(got.graph.node[2]) == {"perm": [0, 2, 3, 1]}
    if act == "HardSigmoid":
        assert _attrs(got.graph.node[0]) == {"alpha": 0.25, "beta": 0.5}


@pytest.mark.parametrize("act", list(GATED))
def test_transpose_below_gated_activation_near_miss(act):
    check_misses(_gated(act, extra_reader=True), GATED[act], "consumer(s) outside the match")


# ----- ops with axes -------------------------------------------------------------------------------------------
def _concat(n=2, axis=1, perms=None):
    perms = perms or [P3] * n
    names = "abc"[:n]
    nodes = [oh.make_node("Transpose", [v], [f"t{v}"], perm=p, name=f"t{v}") for v, p in zip(names, perms, strict=True)]
    nodes.append(oh.make_node("Concat", [f"t{v}" for v in names], ["y"], axis=axis, name="cat"))
    return make_model(nodes, [(v, X3) for v in names], [("y", None)])


@pytest.mark.parametrize(("n", "axis", "mapped"), [(2, 1, 0), (2, -1, 1), (3, 0, 2), (3, -1, 1)])
def test_transpose_below_concat_fires(n, axis, mapped):
    rule_id = {2: "transpose-below-concat", 3: "transpose-below-concat3"}[n]
    got = check_fires(_concat(n, axis), rule_id, ["Concat", "Transpose"])
    assert _attrs(got.graph.node[0]) == {"axis": mapped}


@pytest.mark.parametrize("n", [2, 3])
def test_transpose_below_concat_near_miss(n):
    rule_id = {2: "transpose-below-concat", 3: "transpose-below-concat3"}[n]
    m = _concat(n, axis=0, perms=[P3] * (n - 1) + [[2, 1, 0]])
    m.graph.input[n - 1].type.tensor_type.shape.dim[0].dim_value = 3
    m.graph.input[n - 1].type.tensor_type.shape.dim[1].dim_value = 2
    check_misses(m, rule_id, None)


def _slice(axes=(2,), steps=True, axes_input=False, starts=(1,), ends=(3,)):
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=P3, name="tr"),
             oh.make_node("Slice", ["t", "s", "e", "ax"] + (["st"] if steps else []), ["y"], name="slice")]
    inits = {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64), "st": np.array([1] * len(starts), np.int64)}
    inputs = [("x", X3)]
    if axes_input:
        inputs.append(("ax", [len(axes)], TensorProto.INT64))
    else:
        inits["ax"] = np.array(axes, np.int64)
    return make_model(nodes, inputs, [("y", None)], {k: v for k, v in inits.items() if k != "st" or steps})


@pytest.mark.parametrize(("axes", "starts", "ends", "mapped"), [((2,), (1,), (3,), [1]), ((-1,), (1,), (3,), [1]),
                                                                ((0, 1), (1, 0), (3, 1), [2, 0])])
@pytest.mark.parametrize("steps", [True, False], ids=["steps", "no-steps"])
def test_transpose_below_slice_fires(axes, starts, ends, mapped, steps):
    got = check_fires(_slice(axes, steps, starts=starts, ends=ends), "transpose-below-slice", ["Slice", "Transpose"])
    assert list(_inits(got)[got.graph.node[0].input[3]]) == mapped


def test_transpose_below_slice_near_miss():
    m = _slice(axes_input=True)
    check_misses(m, "transpose-below-slice", "AX ('ax') is not a constant")


def _pad(mode="constant", value=False, pads=(0, 1, 1, 1, 0, 2), pads_input=False, axes=False, opset=13):
    ins = ["t", "pads"] + (["v"] if value else ([""] if axes else [])) + (["axes"] if axes else [])
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=P3, name="tr"),
             oh.make_node("Pad", ins, ["y"], mode=mode, name="pad")]
    inits = {"v": np.float32(0.5), "axes": np.array([0, 2], np.int64)}
    inputs = [("x", X3)]
    if pads_input:
        inputs.append(("pads", [len(pads)], TensorProto.INT64))
    else:
        inits["pads"] = np.array(pads, np.int64)
    return make_model(nodes, inputs, [("y", None)], {k: v for k, v in inits.items() if k in ins}, opset=opset)


@pytest.mark.parametrize(("mode", "value"), [("constant", False), ("constant", True), ("reflect", False),
                                             ("edge", False)])
def test_transpose_below_pad_fires(mode, value):
    got = check_fires(_pad(mode, value), "transpose-below-pad", ["Pad", "Transpose"])
    # pads [b0, b1, b2, e0, e1, e2] of the transposed axes, laid out in x's axis order
    assert list(_inits(got)[got.graph.node[0].input[1]]) == [1, 1, 0, 0, 2, 1]
    assert _attrs(got.graph.node[0]) == {"mode": mode.encode()}


def test_transpose_below_pad_near_misses():
    check_misses(_pad(pads_input=True), "transpose-below-pad", "PADS ('pads') is not a constant")
    # opset 18 Pad with axes: pads then cover only those axes
    check_misses(_pad(pads=(1, 1, 0, 2), axes=True, opset=18), "transpose-below-pad", "Pad has 4 inputs, rule expects 2-3")


def _reduce(op, axes=(1,), keepdims=1, opset=18):
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=P3, name="tr")]
    inits = {}
    if op == "ReduceSum" or opset >= 18:
        nodes.append(oh.make_node(op, ["t", "ax"], ["y"], keepdims=keepdims, name="red"))
        inits["ax"] = np.array(axes, np.int64)
    else:
        nodes.append(oh.make_node(op, ["t"], ["y"], axes=list(axes), keepdims=keepdims, name="red"))
    return make_model(nodes, [("x", X3)], [("y", None)], inits, opset=opset)


REDUCE = {"ReduceSum": "transpose-below-reducesum", "ReduceMean": "transpose-below-reducemean"}


@pytest.mark.parametrize("op", list(REDUCE))
@pytest.mark.parametrize(("axes", "mapped"), [((1,), [0]), ((-1,), [1]), ((0, 2), [2, 1])])
def test_transpose_below_reduce_fires(op, axes, mapped):
    got = check_fires(_reduce(op, axes), REDUCE[op], [op, "Transpose"])
    assert list(_inits(got)[got.graph.node[0].input[1]]) == mapped


@pytest.mark.parametrize("op", list(REDUCE))
def test_transpose_below_reduce_near_misses(op):
    # keepdims=0 drops axes: the permutation no longer fits the output
    check_misses(_reduce(op, keepdims=0), REDUCE[op], f"{op} keepdims=0, rule needs 1")


def test_transpose_below_reducemean_needs_axes_as_input():
    r, _ = fuse(_reduce("ReduceMean", opset=17), "transpose-below-reducemean")
    assert r.fired == {} and "outside the rule's range 18.." in r.skipped[0].reason


@pytest.mark.parametrize(("axes", "mapped"), [((1,), [0]), ((-1,), [1]), ((0, 2), [2, 1])])
def test_transpose_below_reducemean_attr_fires(axes, mapped):
    got = check_fires(_reduce("ReduceMean", axes, opset=17), "transpose-below-reducemean-attr",
                      ["ReduceMean", "Transpose"])
    assert _attrs(got.graph.node[0]) == {"axes": mapped, "keepdims": 1}


def test_transpose_below_reducemean_attr_keeps_a_transpose_others_read():
    # tf2onnx's squeeze-excite: the scale Mul reads the Transpose too; it stays for that reader
    m = _reduce("ReduceMean", (1, 2), opset=13)
    m.graph.node.append(oh.make_node("Neg", ["t"], ["probe"], name="probe"))
    m.graph.output.append(oh.make_tensor_value_info("probe", TensorProto.FLOAT, None))
    check_fires(m, "transpose-below-reducemean-attr", ["Transpose", "ReduceMean", "Transpose", "Neg"])


def test_transpose_below_reducemean_attr_near_misses():
    check_misses(_reduce("ReduceMean", keepdims=0, opset=17), "transpose-below-reducemean-attr",
                 "ReduceMean keepdims=0, rule needs 1")
    r, _ = fuse(_reduce("ReduceMean", opset=18), "transpose-below-reducemean-attr")
    assert r.fired == {} and "outside the rule's range" in r.skipped[0].reason


def _split(n=2, axis=1, sizes=None, opset=13, num_outputs=False, first_read=False):
    outs = [f"y{i}" for i in range(n)]
    ins = ["t"] + (["sp"] if sizes is not None else [])
    attrs = {"axis": axis} | ({"num_outputs": n} if num_outputs else {})
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=P3, name="tr"),
             oh.make_node("Split", ins, outs, name="split", **attrs)]
    outputs = [(o, None) for o in outs]
    if first_read:
        _probe(nodes, outputs, "t")
    x = [2, 3, 6]  # transposed: [6, 2, 3]
    inits = {} if sizes is None else {"sp": np.array(sizes, np.int64)}
    return make_model(nodes, [("x", x)], outputs, inits, opset=opset)


@pytest.mark.parametrize(("n", "axis", "sizes", "opset", "num_outputs", "mapped"), [
    (2, 0, None, 13, False, 2), (2, 0, (2, 4), 13, False, 2), (3, 0, (1, 2, 3), 13, False, 2),
    (3, -1, None, 13, False, 1), (2, 0, None, 18, True, 2), (3, 0, None, 18, True, 2)],
    ids=["2-even", "2-sizes", "3-sizes", "3-last", "2-num_outputs", "3-num_outputs"])
def test_transpose_below_split_fires(n, axis, sizes, opset, num_outputs, mapped):
    rule_id = {2: "transpose-below-split", 3: "transpose-below-split3"}[n]
    got = check_fires(_split(n, axis, sizes, opset, num_outputs), rule_id, ["Split"] + ["Transpose"] * n)
    assert _attrs(got.graph.node[0])["axis"] == mapped


@pytest.mark.parametrize("n", [2, 3])
def test_transpose_below_split_near_miss(n):
    rule_id = {2: "transpose-below-split", 3: "transpose-below-split3"}[n]
    check_misses(_split(n, axis=0, first_read=True), rule_id,
                 "Transpose 'tr' (line t) has 1 consumer(s) outside the match")


def _resize(mode="nearest", ctm=None, scales=(1.0, 2.0, 2.0, 1.0), roi=False, axes=None, opset=13):
    """NHWC x [1, 4, 6, 3] -> NCHW -> Resize by scales."""
    attrs = {"mode": mode} | ({} if ctm is None else {"coordinate_transformation_mode": ctm}) | (
        {} if axes is None else {"axes": list(axes)})
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="tr"),
             oh.make_node("Resize", ["t", "roi" if roi else "", "sc"], ["y"], name="resize", **attrs)]
    inits = {"sc": np.array(scales, np.float32)}
    if roi:
        inits["roi"] = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32)
    return make_model(nodes, [("x", [1, 4, 6, 3])], [("y", None)], inits, opset=opset)


@pytest.mark.parametrize(("mode", "ctm"), [("nearest", None), ("linear", None), ("linear", "align_corners"),
                                           ("cubic", "asymmetric")])
def test_transpose_below_resize_fires(mode, ctm):
    got = check_fires(_resize(mode, ctm, scales=(1.0, 1.0, 2.0, 2.0)), "transpose-below-resize", ["Resize", "Transpose"],
                      rtol=1e-5, atol=1e-5)
    assert list(_inits(got)[got.graph.node[0].input[2]]) == [1.0, 2.0, 2.0, 1.0]


def test_transpose_below_resize_near_misses():
    check_misses(_resize("linear", "tf_crop_and_resize", roi=True), "transpose-below-resize",
                 "require failed: default(Y.coordinate_transformation_mode, \"half_pixel\") != \"tf_crop_and_resize\"")
    # opset 18 Resize with axes: its scales cover only those axes (refused: the compute of SC2 fails first)
    check_misses(_resize(scales=(2.0, 2.0), axes=(2, 3), opset=18), "transpose-below-resize", "compute failed")


def _norm(op, perm, x_shape, consts=True, training=None):
    c = 3
    rng = np.random.default_rng(0)
    inits = {"s": rng.uniform(0.5, 2, c).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32), "v": rng.uniform(0.5, 2, c).astype(np.float32)}
    ins = ["t", "s", "b", "m", "v"] if op == "BatchNormalization" else ["t", "s", "b"]
    attrs = {"epsilon": 1e-3} | ({} if training is None else {"training_mode": training})
    nodes = [oh.make_node("Transpose", ["x"], ["t"], perm=perm, name="tr"),
             oh.make_node(op, ins, ["y"], name="norm", **attrs)]
    inputs = [("x", x_shape)]
    if not consts:
        inputs.append(("s", [c]))
        del inits["s"]
    return make_model(nodes, inputs, [("y", None)], {k: v for k, v in inits.items() if k in ins}, opset=15)


@pytest.mark.parametrize("consts", [True, False], ids=["constants", "scale-input"])
def test_transpose_below_batchnorm_fires(consts):
    got = check_fires(_norm("BatchNormalization", [0, 1, 3, 2], [2, 3, 4, 5], consts), "transpose-below-batchnorm",
                      ["BatchNormalization", "Transpose"], rtol=1e-5, atol=1e-5)
    assert _attrs(got.graph.node[0])["epsilon"] == pytest.approx(1e-3)


def test_transpose_below_batchnorm_near_miss():
    check_misses(_norm("BatchNormalization", [0, 3, 1, 2], [2, 4, 5, 3]), "transpose-below-batchnorm",
                 "require failed: t.perm[1] == 1")


@pytest.mark.parametrize(("perm", "x_shape"), [([0, 3, 1, 2], [2, 4, 5, 3]), ([0, 2, 1], [2, 4, 3])],
                         ids=["nhwc", "nlc"])
def test_transpose_below_batchnorm_affine_fires(perm, x_shape):
    got = check_fires(_norm("BatchNormalization", perm, x_shape), "transpose-below-batchnorm-affine",
                      ["Mul", "Add", "Transpose"], rtol=1e-5, atol=1e-5)
    assert _inits(got)[got.graph.node[0].input[1]].shape == (3,)  # along x's last axis


def test_transpose_below_batchnorm_affine_near_misses():
    check_misses(_norm("BatchNormalization", [0, 3, 1, 2], [2, 4, 5, 3], consts=False),
                 "transpose-below-batchnorm-affine", "S ('s') is not a constant")
    check_misses(_norm("BatchNormalization", [0, 1, 3, 2], [2, 3, 4, 5]), "transpose-below-batchnorm-affine",
                 "require failed: t.perm[1] != 1")


def test_transpose_below_instancenorm_fires():
    check_fires(_norm("InstanceNormalization", [0, 1, 3, 2], [2, 3, 4, 5]), "transpose-below-instancenorm",
                ["InstanceNormalization", "Transpose"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("perm", "x_shape", "reason"), [([0, 3, 1, 2], [2, 4, 5, 3], "t.perm[1] == 1"),
                                                         ([1, 0, 2, 3], [3, 2, 4, 5], "t.perm[0] == 0")])
def test_transpose_below_instancenorm_near_misses(perm, x_shape, reason):
    check_misses(_norm("InstanceNormalization", perm, x_shape), "transpose-below-instancenorm",
                 f"require failed: {reason}")
