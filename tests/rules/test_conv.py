"""patterns/conv.yaml: BatchNormalization / Mul / Add folded into a Conv; com.microsoft.FusedConv with each
activation and with a residual; NhwcConv (CUDA)."""

import tempfile

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from .conftest import assert_same, check_fires, check_misses, fuse, make_model, rand_feeds, rule

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
B = RNG.standard_normal(6).astype(np.float32)
X = ("x", [1, 4, 8, 8])
Y_SHAPE = [1, 6, 8, 8]


def _conv(post_nodes, inits=None, bias=True, w_input=False, dtype=TensorProto.FLOAT, opset=17, extra=(),
          extra_outputs=(), out_shape=None):
    """x -> Conv (pads 1, so c is [1, 6, 8, 8]) -> post_nodes -> y."""
    np_t = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    conv_in = ["x", "w"] + (["b"] if bias else [])
    nodes = [oh.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], name="conv"), *post_nodes, *extra]
    all_inits = {"b": B.astype(np_t)} if bias else {}
    inputs = [("x", X[1], dtype)]
    if w_input:
        inputs.append(("w", list(W.shape), dtype))
    else:
        all_inits["w"] = W.astype(np_t)
    all_inits.update(inits or {})
    outputs = [("y", out_shape or Y_SHAPE, dtype), *extra_outputs]
    return make_model(nodes, inputs, outputs, all_inits, opset=opset)


def _attrs(node):
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


def _probe(value="c"):
    return [oh.make_node("Neg", [value], ["probe"], name="probe")], [("probe", Y_SHAPE)]


# ----- folds ---------------------------------------------------------------------------------------------------
def _bn(bias=True, opset=15, mean_input=False, scale_shape=(6,), training=None, eps=1e-3):
    bn_attrs = {"epsilon": eps} | ({"training_mode": training} if training is not None else {})
    bn = oh.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"], name="bn", **bn_attrs)
    inits = {"scale": RNG.uniform(0.5, 2, scale_shape).astype(np.float32),
             "shift": RNG.standard_normal(6).astype(np.float32),
             "var": RNG.uniform(0.5, 2, 6).astype(np.float32)}
    if not mean_input:
        inits["mean"] = RNG.standard_normal(6).astype(np.float32)
    m = _conv([bn], inits, bias=bias, opset=opset)
    if mean_input:
        m.graph.input.append(oh.make_tensor_value_info("mean", TensorProto.FLOAT, [6]))
    return m


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("opset", [9, 15])
def test_conv_bn_fold_fires(bias, opset):
    got = check_fires(_bn(bias, opset), "conv-bn-fold", ["Conv"], rtol=1e-4, atol=1e-4)
    assert len(got.graph.node[0].input) == 3 and _attrs(got.graph.node[0])["pads"] == [1, 1, 1, 1]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"mean_input": True}, "MEAN ('mean') is not a constant"),
    ({"training": 1}, "BatchNormalization training_mode=1, rule needs 0"),
    ({"scale_shape": (1, 6)}, "SCALE has rank 2, rule allows 1"),
])
def test_conv_bn_fold_near_misses(kw, reason):
    m = _bn(**kw)
    check_misses(m, "conv-bn-fold", reason)


def _affine(op, c_shape, swap=False, c_input=False, value=None, opset=17):
    k = RNG.uniform(0.5, 2, c_shape).astype(np.float32) if value is None else np.full(c_shape, value, np.float32)
    node = oh.make_node(op, ["k", "c"] if swap else ["c", "k"], ["y"], name="post")
    m = _conv([node], {} if c_input else {"k": k}, opset=opset)
    if c_input:
        m.graph.input.append(oh.make_tensor_value_info("k", TensorProto.FLOAT, list(c_shape)))
    return m


SHAPES = [(1, 6, 1, 1), (6, 1, 1), (1, 1, 1, 1), (1,), ()]


@pytest.mark.parametrize(("rule_id", "op"), [("conv-mul-fold", "Mul"), ("conv-add-fold", "Add")])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_conv_mul_add_fold_fires(rule_id, op, shape, swap):
    got = check_fires(_affine(op, shape, swap), rule_id, ["Conv"], rtol=1e-4, atol=1e-4)
    assert len(got.graph.node[0].input) == 3  # a bias is made where there was none


def test_conv_mul_fold_without_bias_gets_zero_bias():
    m = _conv([oh.make_node("Mul", ["c", "k"], ["y"], name="post")], {"k": np.float32(2.0)}, bias=False)
    got = check_fires(m, "conv-mul-fold", ["Conv"], rtol=1e-5, atol=1e-5)
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    np.testing.assert_array_equal(inits[got.graph.node[0].input[1]], W * 2)


@pytest.mark.parametrize(("rule_id", "op"), [("conv-mul-fold", "Mul"), ("conv-add-fold", "Add")])
@pytest.mark.parametrize("kw", [{"c_shape": (1, 6, 8, 8)}, {"c_shape": (1, 6, 1, 1), "c_input": True},
                                {"c_shape": (8,)}], ids=["per-pixel", "not-constant", "per-column"])
def test_conv_mul_add_fold_near_misses(rule_id, op, kw):
    check_misses(_affine(op, **kw), rule_id)


# ----- FusedConv -----------------------------------------------------------------------------------------------
def _residual(relu=True, swap=False, z_shape=Y_SHAPE, extra_reader=False):
    nodes = [oh.make_node("Add", ["z", "c"] if swap else ["c", "z"], ["s"] if relu else ["y"], name="residual")]
    if relu:
        nodes.append(oh.make_node("Relu", ["s"], ["y"], name="relu"))
    extra, extra_out = _probe("s") if extra_reader else ((), ())
    m = _conv(nodes, extra=extra, extra_outputs=extra_out)
    m.graph.input.append(oh.make_tensor_value_info("z", TensorProto.FLOAT, list(z_shape)))
    return m


@pytest.fixture
def no_nchwc():
    """A CPU where onnxruntime runs convolutions in NCHW (ARM, or x86 without AVX2): what conv-add is for."""
    from onnxfuse.targets import assume_cpu_nchwc

    with assume_cpu_nchwc(False):
        yield


@pytest.mark.parametrize(("rule_id", "relu"), [("conv-add-relu", True), ("conv-add", False)])
@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_conv_residual_fires(rule_id, relu, swap, no_nchwc):
    got = check_fires(_residual(relu, swap), rule_id, ["com.microsoft.FusedConv"], rtol=1e-5, atol=1e-5)
    node = got.graph.node[0]
    assert list(node.input) == ["x", "w", "b", "z"]
    assert _attrs(node).get("activation") == (b"Relu" if relu else None)


@pytest.mark.parametrize(("rule_id", "relu"), [("conv-add-relu", True), ("conv-add", False)])
def test_conv_residual_not_where_onnxruntime_sums_into_its_nchwc_conv(rule_id, relu):
    """onnxruntime runs a FusedConv with Z outside its NCHWc layout: on such a CPU the residual stays an Add
    (which onnxruntime sums into its blocked Conv), and the near miss names the condition."""
    from onnxfuse.targets import assume_cpu_nchwc

    with assume_cpu_nchwc(True):
        check_misses(_residual(relu), rule_id, "require failed: not cpu_nchwc() (on cpu)")
    if "cuda" in rule(rule_id).targets:  # the GPU's FusedConv is another kernel: no such condition there
        r, _ = fuse(_residual(relu), rule_id, target="cuda")
        assert r.fired == {rule_id: 1}


def test_the_nchwc_probe_asks_onnxruntime():
    """cpu_nchwc() is onnxruntime's answer on this machine (a Conv it rewrote into com.microsoft.nchwc ops),
    cached; assume_cpu_nchwc overrides it inside its block only."""
    import onnxruntime as ort

    from onnxfuse.targets import _probe_nchwc, assume_cpu_nchwc, cpu_nchwc

    m = _conv([oh.make_node("Relu", ["c"], ["y"])])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tempfile.mkdtemp() + "/o.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    blocked = any(n.domain == "com.microsoft.nchwc" for n in onnx.load(so.optimized_model_filepath).graph.node)
    assert _probe_nchwc() == blocked
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ONNXFUSE_CPU_NCHWC")  # the suite decides as for an NCHWc CPU (tests/conftest.py)
        assert cpu_nchwc() == blocked
        mp.setenv("ONNXFUSE_CPU_NCHWC", "0" if blocked else "1")  # optimizing here for another CPU
        assert cpu_nchwc() == (not blocked)
        with assume_cpu_nchwc(blocked):
            assert cpu_nchwc() == blocked
        assert cpu_nchwc() == (not blocked)


@pytest.mark.parametrize(("rule_id", "relu"), [("conv-add-relu", True), ("conv-add", False)])
def test_conv_residual_near_misses(rule_id, relu, no_nchwc):
    # Z broadcast along the channel axis is a bias, not a residual FusedConv takes
    check_misses(_residual(relu, z_shape=[1, 6, 1, 1]), rule_id)
    if relu:
        check_misses(_residual(relu, extra_reader=True), rule_id, "Add 'residual' (line s) has 1 consumer(s) "
                                                                  "outside the match (Neg 'probe')")


def _act(op, opset=17, bias=True, extra_reader=False, dtype=TensorProto.FLOAT, **attrs):
    extra, extra_out = _probe() if extra_reader else ((), ())
    if extra_reader and dtype != TensorProto.FLOAT:
        extra_out = [("probe", Y_SHAPE, dtype)]
    return _conv([oh.make_node(op, ["c"], ["y"], name="act", **attrs)], bias=bias, opset=opset, extra=extra,
                 extra_outputs=extra_out, dtype=dtype)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv_relu_fires(bias):
    got = check_fires(_act("Relu", bias=bias), "conv-relu", ["com.microsoft.FusedConv"])
    assert _attrs(got.graph.node[0]) == {"activation": b"Relu", "pads": [1, 1, 1, 1]}
    assert len(got.graph.node[0].input) == (3 if bias else 2)


@pytest.mark.parametrize(("kw", "reason"), [
    ({"extra_reader": True}, "Conv 'conv' (line c) has 1 consumer(s) outside the match (Neg 'probe')"),
    ({"dtype": TensorProto.DOUBLE}, "X has dtype double, rule allows float"),
])
def test_conv_relu_near_misses(kw, reason):
    check_misses(_act("Relu", **kw), "conv-relu", reason)


@pytest.mark.parametrize(("op", "opset"), [("Sigmoid", 17), ("Tanh", 17), ("HardSwish", 14)])
def test_conv_activation_fires(op, opset):
    got = check_fires(_act(op, opset), "conv-activation", ["com.microsoft.FusedConv"], rtol=1e-5, atol=1e-5)
    assert _attrs(got.graph.node[0])["activation"] == op.encode()


def test_conv_activation_near_miss():
    check_misses(_act("Tanh", extra_reader=True), "conv-activation", "Conv 'conv' (line c) has 1 consumer(s)")


@pytest.mark.parametrize(("rule_id", "op", "attrs", "params"), [
    ("conv-leakyrelu", "LeakyRelu", {"alpha": 0.2}, [0.2]),
    ("conv-leakyrelu", "LeakyRelu", {}, [0.01]),
    ("conv-hardsigmoid", "HardSigmoid", {"alpha": 0.3, "beta": 0.4}, [0.3, 0.4]),
    ("conv-hardsigmoid", "HardSigmoid", {}, [0.2, 0.5]),
])
def test_conv_activation_with_params_fires(rule_id, op, attrs, params):
    got = check_fires(_act(op, **attrs), rule_id, ["com.microsoft.FusedConv"], rtol=1e-5, atol=1e-5)
    a = _attrs(got.graph.node[0])
    assert a["activation"] == op.encode()
    np.testing.assert_allclose(a["activation_params"], params, rtol=1e-6)


@pytest.mark.parametrize(("rule_id", "op"), [("conv-leakyrelu", "LeakyRelu"), ("conv-hardsigmoid", "HardSigmoid")])
def test_conv_activation_with_params_near_miss(rule_id, op):
    check_misses(_act(op, extra_reader=True), rule_id, "Conv 'conv' (line c) has 1 consumer(s)")


def _clip(lo=-0.5, hi=0.5, lo_input=False):
    inputs = ["c", "" if lo is None else "lo"] + ([] if hi is None else ["hi"])
    inits = {k: np.float32(v) for k, v in (("lo", lo), ("hi", hi)) if v is not None and not (k == "lo" and lo_input)}
    m = _conv([oh.make_node("Clip", inputs, ["y"], name="clip")], inits, opset=13)
    if lo_input:
        m.graph.input.append(oh.make_tensor_value_info("lo", TensorProto.FLOAT, []))
    return m


@pytest.mark.parametrize(("lo", "hi"), [(-0.5, 0.5), (0.0, 6.0), (0.0, None), (None, 1.0)],
                         ids=["both", "relu6", "min-only", "max-only"])
def test_conv_clip_fires(lo, hi):
    got = check_fires(_clip(lo, hi), "conv-clip", ["com.microsoft.FusedConv"])
    a = _attrs(got.graph.node[0])
    want = [-3.4028234663852886e38 if lo is None else lo, 3.4028234663852886e38 if hi is None else hi]
    assert a["activation"] == b"Clip"
    np.testing.assert_allclose(a["activation_params"], want, rtol=1e-6)


def test_conv_clip_near_miss():
    check_misses(_clip(lo_input=True), "conv-clip", "LO ('lo') is not a constant")


def test_conv_clip_attr_fires_at_opset_10():
    m = _conv([oh.make_node("Clip", ["c"], ["y"], name="clip", min=-0.5, max=0.5)], opset=10)
    got = check_fires(m, "conv-clip-attr", ["com.microsoft.FusedConv"])
    np.testing.assert_allclose(_attrs(got.graph.node[0])["activation_params"], [-0.5, 0.5])


def test_conv_clip_rules_keep_to_their_opsets():
    r, _ = fuse(_clip(), "conv-clip-attr")
    assert r.fired == {} and "model opset 13 outside the rule's range 1..10" in r.skipped[0].reason
    m = _conv([oh.make_node("Clip", ["c"], ["y"], name="clip", min=-0.5, max=0.5)], opset=10)
    r, _ = fuse(m, "conv-clip")
    assert r.fired == {} and "model opset 10 outside the rule's range 11.." in r.skipped[0].reason


def _conv_hardswish(alpha=1 / 6, beta=0.5, swap=False):
    nodes = [oh.make_node("HardSigmoid", ["c"], ["h"], name="hsig", alpha=alpha, beta=beta),
             oh.make_node("Mul", ["h", "c"] if swap else ["c", "h"], ["y"], name="mul")]
    return _conv(nodes, opset=13)


@pytest.mark.parametrize("swap", [False, True], ids=["", "swapped"])
def test_conv_hardswish_fires(swap):
    got = check_fires(_conv_hardswish(swap=swap), "conv-hardswish", ["com.microsoft.FusedConv"], rtol=1e-5,
                      atol=1e-5)
    assert _attrs(got.graph.node[0])["activation"] == b"HardSwish"


@pytest.mark.parametrize("kw", [{"alpha": 0.2}, {"beta": 0.6}], ids=["alpha", "beta"])
def test_conv_hardswish_near_misses(kw):
    check_misses(_conv_hardswish(**kw), "conv-hardswish")


@pytest.mark.parametrize("rule_id", ["conv-add", "conv-activation", "conv-leakyrelu", "conv-hardsigmoid",
                                     "conv-clip", "conv-hardswish"])
def test_fused_conv_with_activations_other_than_relu_is_cpu_only(rule_id):
    # CUDA's FusedConv runs Relu only (the kernel table cannot say it: the rules do)
    r, _ = fuse(_act("Relu"), rule_id, target="cuda")
    assert [(s.rule, s.reason) for s in r.skipped] == [(rule_id, "declared for cpu only")]


# ----- NhwcConv (CUDA) -----------------------------------------------------------------------------------------
def _as_nchw(model):
    """The NhwcConv of `model` written as Transpose -> Conv -> Transpose, its weight laid back [M, C, kH, kW]
    (so onnxruntime's CPU provider can run what the rule wrote)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    out = []
    for n in g.node:
        if n.op_type != "NhwcConv":
            out.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        g.initializer.append(numpy_helper.from_array(w.transpose(0, 3, 1, 2).copy(), "w_nchw"))
        attrs = {a.name: oh.get_attribute_value(a) for a in n.attribute}
        out += [oh.make_node("Transpose", [n.input[0]], ["emul_in"], perm=[0, 3, 1, 2]),
                oh.make_node("Conv", ["emul_in", "w_nchw", *n.input[2:]], ["emul_out"], **attrs),
                oh.make_node("Transpose", ["emul_out"], [n.output[0]], perm=[0, 2, 3, 1])]
    del g.node[:]
    g.node.extend(out)
    return model


def test_conv_nhwc_fires_on_cuda():
    m = _conv([oh.make_node("Relu", ["c"], ["y"], name="relu")], opset=17)
    got = check_fires(m, "conv-nhwc", ["Transpose", "com.microsoft.NhwcConv", "Transpose", "Relu"],
                      target="cuda", feeds=False)
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    nhwc = got.graph.node[1]
    np.testing.assert_array_equal(inits[nhwc.input[1]], W.transpose(0, 2, 3, 1))
    assert _attrs(nhwc)["pads"] == [1, 1, 1, 1]
    assert_same(m, _as_nchw(got), rand_feeds(m))


def test_conv_nhwc_near_misses():
    m = _conv([oh.make_node("Relu", ["c"], ["y"], name="relu")], opset=17)
    r, _ = fuse(m, "conv-nhwc")
    assert r.fired == {} and r.skipped[0].reason == "declared for cuda only"
    check_misses(_conv([oh.make_node("Relu", ["c"], ["y"], name="relu")], w_input=True), "conv-nhwc",
                 "W ('w') is not a constant", target="cuda")
    w1 = RNG.standard_normal((6, 4, 3)).astype(np.float32)  # a 1-D convolution
    m1 = make_model([oh.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1], name="conv")], [("x", [1, 4, 8])],
                    [("y", [1, 6, 8])], {"w": w1})
    check_misses(m1, "conv-nhwc", "X has rank 3, rule allows 4", target="cuda")


# ----- pad-conv ------------------------------------------------------------------------------------------------
def _pad_conv(pads=(0, 0, 1, 0, 0, 0, 1, 1), value=0.0, mode="constant", conv_pads=(1, 1, 0, 0), auto_pad=None):
    """x [1, 4, 9, 8] -> Pad(pads, value, mode) -> Conv(w, b, stride 2, pads conv_pads)."""
    conv_attrs = {"auto_pad": auto_pad} if auto_pad else {"pads": list(conv_pads)}
    nodes = [oh.make_node("Pad", ["x", "pads", "v"], ["xp"], mode=mode, name="pad"),
             oh.make_node("Conv", ["xp", "w", "b"], ["y"], strides=[2, 2], name="conv", **conv_attrs)]
    inits = {"pads": np.array(pads, np.int64), "v": np.array(value, np.float32), "w": W, "b": B}
    return make_model(nodes, [("x", [1, 4, 9, 8])], [("y", None)], inits, opset=17)


def test_pad_conv_fires():
    """The Pad's begin / end amounts (rows 1 / 1, columns 0 / 1) join the Conv's own pads (1, 1, 0, 0)."""
    got = check_fires(_pad_conv(), "pad-conv", ["Conv"])
    assert _attrs(got.graph.node[0]) == {"pads": [2, 1, 1, 1], "strides": [2, 2]}
    assert list(got.graph.node[0].input) == ["x", "w", "b"]


@pytest.mark.parametrize("kw", [
    {"value": 1.0},                                  # not zeros
    {"mode": "reflect"},                             # not constant padding
    {"pads": (1, 0, 1, 0, 0, 0, 1, 1)},              # pads the batch
    {"auto_pad": "SAME_UPPER"},                      # the Conv pads by its own rule
])
def test_pad_conv_near_misses(kw):
    check_misses(_pad_conv(**kw), "pad-conv")


# ----- pad-fusedconv-fold --------------------------------------------------------------------------------------
def _pad_fusedconv(pads=(0, 0, 0, 1, 0, 0, 1, 2), conv_pads=None, value=None, mode=None, x_shape=(1, 8, 9, 9)):
    rng = np.random.default_rng(0)
    c = x_shape[1]
    inits = {"pads": np.array(pads, np.int64), "w": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(c).astype(np.float32)}
    pad_in = ["x", "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_in.append("v")
    conv_kw = {"group": c, "strides": [2, 2], "activation": "Relu"}
    if conv_pads is not None:
        conv_kw["pads"] = list(conv_pads)
    nodes = [oh.make_node("Pad", pad_in, ["p"], name="pad", **({"mode": mode} if mode else {})),
             oh.make_node("FusedConv", ["p", "w", "b"], ["y"], domain="com.microsoft", name="conv", **conv_kw)]
    m = make_model(nodes, [("x", list(x_shape))], [("y", None)], inits)
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    return m


@pytest.mark.parametrize(("pads", "conv_pads", "want"),
                         [((0, 0, 0, 1, 0, 0, 1, 2), None, [0, 1, 1, 2]),
                          ((0, 0, 1, 1, 0, 0, 2, 2), (1, 0, 0, 1), [2, 1, 2, 3])], ids=str)
def test_pad_fusedconv_fold_fires(pads, conv_pads, want):
    got = check_fires(_pad_fusedconv(pads, conv_pads, value=0.0), "pad-fusedconv-fold", ["com.microsoft.FusedConv"])
    node = got.graph.node[0]
    assert list(node.input[:1]) == ["x"] and _attrs(node)["pads"] == want
    assert _attrs(node)["activation"] == b"Relu" and _attrs(node)["group"] == 8


def test_pad_fusedconv_fold_near_misses():
    # a non-zero pad value, a reflect pad, or a pad of the channel axis cannot be a conv pad
    check_misses(_pad_fusedconv(value=1.0), "pad-fusedconv-fold", None)
    check_misses(_pad_fusedconv(mode="reflect"), "pad-fusedconv-fold", 'require failed: default(p.mode, "constant")')
    check_misses(_pad_fusedconv(pads=(0, 1, 0, 1, 0, 0, 1, 2)), "pad-fusedconv-fold",
                 "require failed: all(take(PADS")


# ----- ConvTranspose folds (paddle2onnx's DB head: ConvTranspose, Add of the bias, BatchNormalization) -----------
def _convt(post, bias=False, group=1, add_shape=(1, 6, 1, 1), bn=False, eps=1e-5):
    """x[1,4,5,5] -> ConvTranspose (k 2, stride 2; 6 output channels) -> [Add of a constant] -> [BatchNorm]."""
    inits = {"w": (RNG.standard_normal((4, 6 // group, 2, 2)) * 0.3).astype(np.float32)}
    ins = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits["b"] = RNG.standard_normal(6).astype(np.float32)
    nodes = [oh.make_node("ConvTranspose", ins, ["t"], kernel_shape=[2, 2], strides=[2, 2], group=group)]
    cur = "t"
    if post in ("add", "add-bn"):
        inits["k"] = RNG.standard_normal(add_shape).astype(np.float32)
        nodes.append(oh.make_node("Add", [cur, "k"], ["a"]))
        cur = "a"
    if post in ("bn", "add-bn"):
        inits |= {"scale": RNG.uniform(0.5, 2, 6).astype(np.float32), "shift": RNG.standard_normal(6).astype(np.float32),
                  "mean": RNG.standard_normal(6).astype(np.float32), "var": RNG.uniform(0.5, 2, 6).astype(np.float32)}
        nodes.append(oh.make_node("BatchNormalization", [cur, "scale", "shift", "mean", "var"], ["bo"], epsilon=eps))
        cur = "bo"
    nodes.append(oh.make_node("Relu", [cur], ["y"]))
    return make_model(nodes, [("x", [1, 4, 5, 5])], [("y", [1, 6, 10, 10])], inits, opset=17)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (6, 1, 1), ()], ids=["1c11", "c11", "scalar"])
def test_convtranspose_add_fold_fires(bias, shape):
    got = check_fires(_convt("add", bias, add_shape=shape), "convtranspose-add-fold", ["ConvTranspose", "Relu"])
    ct = got.graph.node[0]
    assert len(ct.input) == 3 and _attrs(ct)["strides"] == [2, 2]


def test_convtranspose_bn_fold_fires_and_chains_after_the_bias_add():
    got = check_fires(_convt("bn", bias=True), "convtranspose-bn-fold", ["ConvTranspose", "Relu"],
                      rtol=1e-4, atol=1e-4)
    assert _attrs(got.graph.node[0])["kernel_shape"] == [2, 2]
    # paddle2onnx's spelling: no bias, an Add of it, then BatchNormalization: both fold, one ConvTranspose is left
    check_fires(_convt("add-bn"), ["convtranspose-add-fold", "convtranspose-bn-fold"], ["ConvTranspose", "Relu"],
                fired={"convtranspose-add-fold": 1, "convtranspose-bn-fold": 1}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("rule_id", "post"), [("convtranspose-add-fold", "add"), ("convtranspose-bn-fold", "bn")])
def test_convtranspose_folds_leave_grouped_convtranspose(rule_id, post):
    """A grouped ConvTranspose's output channel m is not W[:, m]: neither fold fires, and the reason is the
    group (checked before the constants are computed), not a failed broadcast."""
    check_misses(_convt(post, group=2, add_shape=()), rule_id, "require failed: default(c.group, 1) == 1")


def test_convtranspose_add_fold_needs_a_per_channel_constant():
    check_misses(_convt("add", add_shape=(1, 6, 10, 10)), "convtranspose-add-fold", "C has shape [1, 6, 10, 10]")


# ----- a channel Slice of a Conv: a Conv with those filters (torch's chunk, YOLO's C2f) ------------------------
def _chunk(act=None, parts=((0, 4), (4, 8)), group=1, axis=1, opset=17):
    """x[1,4,6,6] -> Conv (8 filters, 3x3) -> [SiLU as x * Sigmoid(x), or QuickGelu] -> Slices of the channels
    (TorchScript's chunk: constant starts and ends) -> each part an output."""
    inits = {"w": (RNG.standard_normal((8, 4 // group, 3, 3)) * 0.3).astype(np.float32),
             "b": RNG.standard_normal(8).astype(np.float32), "ax": np.array([axis], np.int64)}
    nodes = [oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=group)]
    cur = "c"
    if act == "silu":
        nodes += [oh.make_node("Sigmoid", ["c"], ["sg"]), oh.make_node("Mul", ["c", "sg"], ["a"])]
        cur = "a"
    elif act == "quickgelu":
        nodes.append(oh.make_node("QuickGelu", ["c"], ["a"], domain="com.microsoft", alpha=1.0))
        cur = "a"
    outs = []
    for i, (s0, e0) in enumerate(parts):
        inits[f"s{i}"], inits[f"e{i}"] = np.array([s0], np.int64), np.array([e0], np.int64)
        nodes.append(oh.make_node("Slice", [cur, f"s{i}", f"e{i}", "ax"], [f"y{i}"]))
        n = (min(e0, 8) if e0 >= 0 else 8 + e0) - (s0 if s0 >= 0 else 8 + s0)
        outs.append((f"y{i}", [1, n, 6, 6]))
    m = make_model(nodes, [("x", [1, 4, 6, 6])], outs, inits, opset=opset)
    if act == "quickgelu":
        m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    return m


@pytest.mark.parametrize(("rule_id", "act", "tail"), [
    ("conv-channel-slice", None, []),
    ("conv-silu-channel-slice", "silu", ["com.microsoft.QuickGelu"]),
])
def test_conv_channel_slice_gives_one_conv_per_part(rule_id, act, tail):
    """Both Slices become Convs with their filters; the shared Conv (and activation) goes with the last one."""
    got = check_fires(_chunk(act), rule_id, (["Conv"] + tail) * 2, fired={rule_id: 2})
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    convs = [n for n in got.graph.node if n.op_type == "Conv"]
    assert [inits[c.input[1]].shape[0] for c in convs] == [4, 4]
    assert all(_attrs(c)["pads"] == [1, 1, 1, 1] for c in convs)


def test_conv_channel_slice_clamps_and_counts_from_the_end():
    """Ends past the channel count (torch writes INT64_MAX) and negative starts are the Slice's own rules."""
    check_fires(_chunk(parts=((-3, 2**62), (1, 3))), "conv-channel-slice", ["Conv", "Conv"],
                fired={"conv-channel-slice": 2})


@pytest.mark.parametrize(("kw", "reason"), [
    ({"group": 2}, "require failed: default(c.group, 1) == 1"),   # a grouped Conv's filters read only its group
    ({"axis": 2}, "norm_axes(AX, 4) == [1]"),                     # a slice of the rows is not a set of filters
    ({"parts": ((5, 5),)}, "require failed: e0 > s0"),            # an empty part
])
def test_conv_channel_slice_near_misses(kw, reason):
    check_misses(_chunk(**kw), "conv-channel-slice", reason)
