"""patterns/norm.yaml: decomposed LayerNorm (opset 11-17 axes attribute, opset 18 axes input; Pow or Mul squares;
Div or Reciprocal; below opset 17 a zero-skip SkipLayerNormalization), RMSNorm (opset 23), residual Add + RMSNorm /
LayerNorm -> Skip*LayerNormalization, BERT embeddings -> EmbedLayerNormalization."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from .conftest import assert_same, check_fires, check_misses, fuse, make_model, op_types, rand_feeds, save

RNG = np.random.default_rng(0)
K = 8
SHAPE = [2, 4, K]
GAMMA = RNG.uniform(0.5, 1.5, K).astype(np.float32)
BETA = RNG.standard_normal(K).astype(np.float32)


def _reduce_mean(x, out, opset, axes=(-1,), name=None):
    if opset >= 18:
        return oh.make_node("ReduceMean", [x, "axes"], [out], keepdims=1, name=name or out)
    return oh.make_node("ReduceMean", [x], [out], axes=list(axes), keepdims=1, name=name or out)


def _layernorm(opset=17, square="pow", div="div", beta=True, swap=False, axes=(-1,), eps=1e-5, eps_shape=(),
               gamma_shape=(K,), extra_reader=None):
    nodes = [_reduce_mean("x", "mean", opset, axes),
             oh.make_node("Sub", ["x", "mean"], ["d"], name="d")]
    if square == "pow":
        nodes.append(oh.make_node("Pow", ["d", "two"], ["sq"], name="sq"))
    else:
        nodes.append(oh.make_node("Mul", ["d", "d"], ["sq"], name="sq"))
    nodes += [_reduce_mean("sq", "var", opset, axes),
              oh.make_node("Add", ["eps", "var"] if swap else ["var", "eps"], ["ve"], name="ve"),
              oh.make_node("Sqrt", ["ve"], ["std"], name="std")]
    if div == "div":
        nodes.append(oh.make_node("Div", ["d", "std"], ["n"], name="n"))
    else:
        nodes += [oh.make_node("Reciprocal", ["std"], ["rstd"], name="rstd"),
                  oh.make_node("Mul", ["rstd", "d"] if swap else ["d", "rstd"], ["n"], name="n")]
    out = "g" if beta else "y"
    nodes.append(oh.make_node("Mul", ["gamma", "n"] if swap else ["n", "gamma"], [out], name="scale"))
    if beta:
        nodes.append(oh.make_node("Add", ["beta", "g"] if swap else ["g", "beta"], ["y"], name="shift"))
    inits = {"two": np.float32(2.0), "eps": np.full(eps_shape, eps, np.float32),
             "gamma": np.resize(GAMMA, gamma_shape).astype(np.float32)}
    if beta:
        inits["beta"] = BETA
    if opset >= 18:
        inits["axes"] = np.array(axes, np.int64)
    if square != "pow":
        del inits["two"]
    outputs = [("y", SHAPE)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", [extra_reader], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, [("x", SHAPE)], outputs, inits, opset=opset)


@pytest.mark.parametrize(("opset", "square", "div", "beta", "swap"), [
    (17, "pow", "div", True, False),   # TorchScript, opset 17: axes attribute
    (18, "pow", "div", True, False),   # dynamo, opset 18: axes input
    (17, "mul", "recip", True, True),
    (18, "mul", "recip", False, False),
    (17, "pow", "div", False, True),
    (18, "pow", "recip", True, True),
])
def test_layernorm_decomposed_fires(opset, square, div, beta, swap):
    got = check_fires(_layernorm(opset, square, div, beta, swap, eps=1e-6), "layernorm-decomposed",
                      ["LayerNormalization"], rtol=1e-4, atol=1e-4)
    ln = got.graph.node[0]
    assert list(ln.input) == ["x", "gamma"] + (["beta"] if beta else [])
    attrs = {a.name: oh.get_attribute_value(a) for a in ln.attribute}
    assert attrs["axis"] == -1 and abs(attrs["epsilon"] - 1e-6) < 1e-12


# (the reasons explain reports are those of later alternatives / operand orders: not asserted)
@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("kw", [{"axes": (1,)}, {"extra_reader": "mean"}, {"extra_reader": "d"},
                                {"extra_reader": "std"}, {"gamma_shape": (4, K)}, {"eps_shape": (K,)}],
                         ids=["mean-over-axis-1", "mean-read", "centered-read", "std-read", "gamma-2d", "eps-per-channel"])
def test_layernorm_decomposed_near_misses(opset, kw):
    check_misses(_layernorm(opset, **kw), "layernorm-decomposed")


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with x and y as [batch, seq, K]."""
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_param, dims[1].dim_param = "batch", "seq"
    return model


def _eps(node) -> float:
    return next(oh.get_attribute_value(a) for a in node.attribute if a.name == "epsilon")


@pytest.mark.parametrize("opset", [11, 12, 14, 16])
def test_layernorm_below_opset_17_is_written_as_a_zero_skip_layernorm(opset):
    """ONNX defines LayerNormalization from opset 17: below it the one layernorm-decomposed makes is a step only,
    and layernorm-zero-skip writes it as com.microsoft.SkipLayerNormalization with a zero skip (folded to a
    constant here, the shape being static). The output passes the full onnx.checker."""
    m = _layernorm(opset, eps=1e-6)
    r, got = fuse(m, "layernorm-decomposed", "layernorm-zero-skip")
    assert r.fired == {"layernorm-decomposed": 1, "layernorm-zero-skip": 1}, r.fired
    assert op_types(got) == ["Constant", "com.microsoft.SkipLayerNormalization"]
    zero, sk = got.graph.node
    assert list(sk.input) == ["x", zero.output[0], "gamma", "beta"] and abs(_eps(sk) - 1e-6) < 1e-12
    assert not numpy_helper.to_array(zero.attribute[0].t).any() and zero.attribute[0].t.dims == [4, K]
    onnx.checker.check_model(got, full_check=True)
    assert_same(m, got, rand_feeds(m), 1e-4, 1e-4)


def test_layernorm_zero_skip_builds_the_zeros_at_run_time_for_dynamic_dims():
    m = _symbolic(_layernorm(14, eps=1e-6))
    r, got = fuse(m, "layernorm-decomposed", "layernorm-zero-skip")
    assert op_types(got) == ["Shape", "Slice", "Expand", "com.microsoft.SkipLayerNormalization"]
    onnx.checker.check_model(got, full_check=True)
    for dims in ({"batch": 1, "seq": 5}, {"batch": 3, "seq": 2}):
        assert_same(m, got, rand_feeds(m, dims=dims), 1e-4, 1e-4)


@pytest.mark.parametrize("opset", [12, 14])
def test_layernorm_decomposed_alone_below_opset_17_is_left_out_and_says_why(opset):
    """Without a rule to take it further, the LayerNormalization would stay in an opset-12 model, which ONNX does
    not define there: the rewrite is left out, and the skipped rules say why."""
    m = _layernorm(opset, eps=1e-6)
    r, got = fuse(m, "layernorm-decomposed")
    assert r.fired == {} and op_types(got) == op_types(m)
    why = f"LayerNormalization is not an ONNX op at the model's opset {opset} (ONNX defines it from opset 17)"
    assert [(s.rule, s.reason) for s in r.skipped] == [
        ("layernorm-decomposed", f"left out at g, y: {why}: onnx.checker would reject the output")]
    onnx.checker.check_model(got, full_check=True)


def _residual(model: onnx.ModelProto) -> onnx.ModelProto:
    """x = a + skip before the LayerNorm (a transformer block's residual)."""
    for n in model.graph.node:
        n.input[:] = ["xs" if v == "x" else v for v in n.input]
    model.graph.node.insert(0, oh.make_node("Add", ["x", "skip"], ["xs"], name="residual"))
    model.graph.input.append(oh.make_tensor_value_info("skip", TensorProto.FLOAT, SHAPE))
    return model


@pytest.mark.parametrize("opset", [12, 14])
@pytest.mark.parametrize(("form", "want"), [
    ("plain", ["Constant", "com.microsoft.SkipLayerNormalization"]),
    ("residual", ["com.microsoft.SkipLayerNormalization"]),
])
def test_optimize_below_opset_17_writes_what_the_checker_accepts(cli, tmp_path, opset, form, want):
    """Every built-in rule, validation on, through the CLI: an opset-12/14 model with a decomposed LayerNorm (alone,
    or after a residual Add) comes out fused, passing onnx.checker's full check, with the original's numbers."""
    m = _layernorm(opset, eps=1e-6) if form == "plain" else _residual(_layernorm(opset, eps=1e-6))
    onnx.checker.check_model(m, full_check=True)
    src, out = save(m, tmp_path / "in.onnx"), tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", src, str(out))
    assert code == 0, stderr
    got = onnx.load(str(out))
    assert op_types(got) == want
    onnx.checker.check_model(got, full_check=True)
    assert_same(m, got, rand_feeds(m), 1e-4, 1e-4)


def _rms(opset=23, square="pow", div="div", ax=(-1,), skip=False, extra_reader=None, gamma_input=False,
         s_shape=SHAPE, a_shape=SHAPE):
    nodes = []
    x = "x"
    inputs = [("x", list(a_shape))]
    if skip:
        nodes.append(oh.make_node("Add", ["x", "skip"], ["s"], name="residual"))
        inputs.append(("skip", list(s_shape)))
        x = "s"
    nodes.append(oh.make_node("Pow", [x, "two"], ["sq"], name="sq") if square == "pow"
                 else oh.make_node("Mul", [x, x], ["sq"], name="sq"))
    nodes += [_reduce_mean("sq", "ms", opset, ax),
              oh.make_node("Add", ["ms", "eps"], ["me"], name="me"),
              oh.make_node("Sqrt", ["me"], ["r"], name="r")]
    if div == "div":
        nodes.append(oh.make_node("Div", [x, "r"], ["n"], name="n"))
    elif div == "recip":
        nodes += [oh.make_node("Reciprocal", ["r"], ["rr"], name="rr"), oh.make_node("Mul", [x, "rr"], ["n"], name="n")]
    else:  # x * (1 / r)
        nodes += [oh.make_node("Div", ["one", "r"], ["rr"], name="rr"), oh.make_node("Mul", ["rr", x], ["n"], name="n")]
    nodes.append(oh.make_node("Mul", ["n", "gamma"], ["y"], name="scale"))
    inits = {"two": np.float32(2), "one": np.float32(1), "eps": np.float32(1e-6)}
    if opset >= 18:
        inits["axes"] = np.array(ax, np.int64)
    if gamma_input:
        inputs.append(("gamma", [K]))
    else:
        inits["gamma"] = GAMMA
    inits = {k: v for k, v in inits.items() if any(k in n.input for n in nodes)}
    outputs = [("y", SHAPE)]
    if extra_reader:
        nodes.append(oh.make_node("Neg", [extra_reader], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize(("square", "div"), [("pow", "div"), ("mul", "recip"), ("pow", "one_div")])
def test_rmsnorm_fires(square, div):
    got = check_fires(_rms(23, square, div), "rmsnorm", ["RMSNormalization"], rtol=1e-4, atol=1e-4)
    attrs = {a.name: oh.get_attribute_value(a) for a in got.graph.node[0].attribute}
    assert attrs["axis"] == -1 and abs(attrs["epsilon"] - 1e-6) < 1e-12


def test_rmsnorm_near_misses():
    r, _ = fuse(_rms(22), "rmsnorm")
    assert r.fired == {} and r.skipped[0].reason == "model opset 22 outside the rule's range 23..10000"
    # over another axis than the last: what the ops compute is not the concept
    check_misses(_rms(23, ax=(1,)), "rmsnorm", "computes 'rmsnorm': the ops from 'x' compute something else")
    check_misses(_rms(23, extra_reader="ms"), "rmsnorm", "ReduceMean 'ms' has 1 consumer(s)")


@pytest.mark.parametrize(("opset", "square", "div"), [(17, "pow", "div"), (18, "mul", "recip"), (18, "pow", "one_div")])
def test_skip_rmsnorm_fires(opset, square, div):
    got = check_fires(_rms(opset, square, div, skip=True), "skip-rmsnorm",
                      ["com.microsoft.SkipSimplifiedLayerNormalization"], rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "skip", "gamma"]


def test_skip_rmsnorm_keeps_the_sum_for_other_readers():
    """The residual stream continues from the sum: its readers read output 3 of the fused op."""
    m = _rms(18, skip=True, extra_reader="s")
    got = check_fires(m, "skip-rmsnorm", ["com.microsoft.SkipSimplifiedLayerNormalization", "Neg"], rtol=1e-4,
                      atol=1e-4)
    fused, neg = got.graph.node
    assert len(fused.output) == 4 and fused.output[3] == "s" and list(neg.input) == ["s"]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"s_shape": [K]}, None),  # a bias broadcast over the rows, not a skip
    ({"a_shape": [8, K], "s_shape": [8, K]}, None),  # rank 2
    ({"extra_reader": "ms"}, "ReduceMean 'ms' has 1 consumer(s) outside the match"),
])
def test_skip_rmsnorm_near_misses(kw, reason):
    m = _rms(18, skip=True, **kw)
    if "a_shape" in kw:
        m.graph.output[0].type.tensor_type.shape.dim.pop(0)
    check_misses(m, "skip-rmsnorm", reason)


@pytest.mark.parametrize(("opset", "square", "div"), [(17, "pow", "recip"), (18, "mul", "div"), (22, "pow", "one_div")])
def test_rmsnorm_zero_skip_fires(opset, square, div):
    """A plain RMSNorm below opset 23 becomes SkipSimplifiedLayerNormalization with a zero skip [s, k] expanded
    at run time (other batch and sequence sizes than the model was declared with run too)."""
    m = _rms(opset, square, div)
    for d in (*m.graph.input[0].type.tensor_type.shape.dim[:2], *m.graph.output[0].type.tensor_type.shape.dim[:2]):
        d.Clear()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "b"
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s"
    got = check_fires(m, "rmsnorm-zero-skip", ["Shape", "Slice", "Expand", "com.microsoft.SkipSimplifiedLayerNormalization"],
                      rtol=1e-5, atol=1e-5, feeds=rand_feeds(m, dims={"b": 3, "s": 5}))
    fused = got.graph.node[-1]
    assert fused.input[0] == "x" and fused.input[2] == "gamma" and len(fused.output) == 1
    attrs = {a.name: oh.get_attribute_value(a) for a in fused.attribute}
    assert abs(attrs["epsilon"] - 1e-6) < 1e-12


@pytest.mark.parametrize(("rule_id", "skip", "ops"), [
    ("skip-rmsnorm", True, ["com.microsoft.SkipSimplifiedLayerNormalization"]),
    ("rmsnorm-zero-skip", False, ["Constant", "com.microsoft.SkipSimplifiedLayerNormalization"])])  # static: folded
def test_rmsnorm_scale_computed_at_run_time(rule_id, skip, ops):
    """The RMSNorm scale need not be a constant (a graph input here, as onnxscript's tests and some exports have
    it): the kernel reads gamma at run time; the zero skip takes the input's float type, not gamma's value."""
    m = _rms(18, skip=skip, gamma_input=True)
    got = check_fires(m, rule_id, ops, rtol=1e-5, atol=1e-5)
    assert got.graph.node[-1].input[2] == "gamma"


def test_rmsnorm_zero_skip_near_misses():
    r, _ = fuse(_rms(23), "rmsnorm-zero-skip")  # RMSNormalization there
    assert r.fired == {} and r.skipped[0].reason == "model opset 23 outside the rule's range 10..22"
    r, _ = fuse(_rms(9), "rmsnorm-zero-skip")  # the Slice it writes takes its bounds as inputs from opset 10
    assert r.fired == {} and r.skipped[0].reason == "model opset 9 outside the rule's range 10..22"
    check_misses(_rms(18, ax=(1,)), "rmsnorm-zero-skip")
    check_misses(_rms(18, extra_reader="r"), "rmsnorm-zero-skip", "has 1 consumer(s) outside the match")


def test_skip_rmsnorm_wins_over_zero_skip():
    """With a residual Add before the norm, the bigger rule takes it: no zero skip."""
    r, got = fuse(_rms(18, skip=True), "skip-rmsnorm", "rmsnorm-zero-skip")
    assert r.fired == {"skip-rmsnorm": 1}
    assert op_types(got) == ["com.microsoft.SkipSimplifiedLayerNormalization"]


def _skip_ln(bias=False, beta=True, axis=-1, bias_input=False, s_shape=SHAPE, sum_reader=False):
    nodes = []
    a = "x"
    inputs = [("x", SHAPE), ("skip", list(s_shape))]
    inits = {"gamma": GAMMA}
    if beta:
        inits["beta"] = BETA
    if bias:
        nodes.append(oh.make_node("Add", ["x", "bias"], ["xb"], name="bias_add"))
        a = "xb"
        if bias_input:
            inputs.append(("bias", [K]))
        else:
            inits["bias"] = RNG.standard_normal(K).astype(np.float32)
    nodes += [oh.make_node("Add", [a, "skip"], ["s"], name="residual"),
              oh.make_node("LayerNormalization", ["s", "gamma"] + (["beta"] if beta else []), ["y"], axis=axis,
                           epsilon=1e-5, name="ln")]
    outputs = [("y", SHAPE)]
    if sum_reader:
        nodes.append(oh.make_node("Neg", ["s"], ["probe"], name="probe"))
        outputs.append(("probe", SHAPE))
    return make_model(nodes, inputs, outputs, inits, opset=17)


@pytest.mark.parametrize("beta", [True, False], ids=["beta", "no-beta"])
@pytest.mark.parametrize("sum_reader", [False, True], ids=["", "sum-read"])
def test_skip_layernorm_fires(beta, sum_reader):
    want = ["com.microsoft.SkipLayerNormalization"] + (["Neg"] if sum_reader else [])
    got = check_fires(_skip_ln(beta=beta, sum_reader=sum_reader), "skip-layernorm", want, rtol=1e-4, atol=1e-4)
    fused = got.graph.node[0]
    assert list(fused.input) == ["x", "skip", "gamma"] + (["beta"] if beta else [])
    assert list(fused.output)[3] == "s"  # the sum, for its other readers
    assert [list(n.input) for n in got.graph.node[1:]] == ([["s"]] if sum_reader else [])


@pytest.mark.parametrize("beta", [True, False], ids=["beta", "no-beta"])
def test_skip_layernorm_bias_fires(beta):
    got = check_fires(_skip_ln(bias=True, beta=beta), "skip-layernorm-bias", ["com.microsoft.SkipLayerNormalization"],
                      rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "skip", "gamma", "beta" if beta else "", "bias"]


@pytest.mark.parametrize("rule_id", ["skip-layernorm", "skip-layernorm-bias"])
@pytest.mark.parametrize(("kw", "reason"), [
    ({"axis": 1}, "LayerNormalization axis=1, rule needs -1"),
    ({"s_shape": [1, 1, K]}, None),  # broadcast: not a skip
])
def test_skip_layernorm_near_misses(rule_id, kw, reason):
    check_misses(_skip_ln(bias=rule_id.endswith("bias"), **kw), rule_id, reason)


def test_skip_layernorm_bias_takes_a_bias_computed_at_run_time():
    """The kernel's bias is a tensor input: one that arrives at run time fuses as a constant one does."""
    got = check_fires(_skip_ln(bias=True, bias_input=True), "skip-layernorm-bias",
                      ["com.microsoft.SkipLayerNormalization"], rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input)[-1] == "bias"


def _embeddings(pbuf=None, start=0, rank1_buffer=False, axes=True, steps=True, ids_type=TensorProto.INT64,
                pos_rows=16, order="wsp"):
    """HF BERT embeddings as exported: word[ids] + token_type[tt] + position[buffer[:, 0:s]], LayerNorm (`order`
    "wps": the position added first, then the token type)."""
    h = 8
    pbuf = np.arange(16, dtype=np.int64) if pbuf is None else np.asarray(pbuf, np.int64)
    if not rank1_buffer:
        pbuf = pbuf[None, :]
    nodes = [oh.make_node("Shape", ["ids"], ["ids_shape"], name="shape"),
             oh.make_node("Gather", ["ids_shape", "one"], ["seq"], axis=0, name="seq"),
             oh.make_node("Unsqueeze", ["seq", "zero_ax"], ["end"], name="end"),
             oh.make_node("Slice", ["pbuf", "start", "end"] + (["axes"] if axes else ([""] if steps else []))
                          + (["steps"] if steps else []), ["pid"], name="pos_slice"),
             oh.make_node("Gather", ["word", "ids"], ["we"], axis=0, name="word"),
             oh.make_node("Gather", ["seg", "tt"], ["te"], axis=0, name="token_type"),
             oh.make_node("Add", ["we", "te" if order == "wsp" else "pe"], ["e1"], name="add1"),
             oh.make_node("Gather", ["pos", "pid"], ["pe"], axis=0, name="position"),
             oh.make_node("Add", ["e1", "pe" if order == "wsp" else "te"], ["e"], name="add2"),
             oh.make_node("LayerNormalization", ["e", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12, name="ln")]
    inits = {"one": np.array(1, np.int64), "zero_ax": np.array([0], np.int64), "pbuf": pbuf,
             "start": np.array([start], np.int64), "axes": np.array([pbuf.ndim - 1], np.int64),
             "steps": np.array([1], np.int64),
             "word": RNG.standard_normal((32, h)).astype(np.float32),
             "seg": RNG.standard_normal((2, h)).astype(np.float32),
             "pos": RNG.standard_normal((pos_rows, h)).astype(np.float32),
             "gamma": RNG.uniform(0.5, 1.5, h).astype(np.float32), "beta": RNG.standard_normal(h).astype(np.float32)}
    inits = {k: v for k, v in inits.items() if any(k in n.input for n in nodes)}
    return make_model(nodes, [("ids", ["b", "s"], ids_type), ("tt", ["b", "s"], ids_type)], [("y", ["b", "s", h])],
                      inits)


def _embed_feeds(m, dtype=np.int64):
    rng = np.random.default_rng(1)
    return {"ids": rng.integers(0, 32, (2, 10)).astype(dtype), "tt": rng.integers(0, 2, (2, 10)).astype(dtype)}


@pytest.mark.parametrize("kw", [{}, {"rank1_buffer": True}, {"rank1_buffer": True, "axes": False, "steps": False},
                                {"rank1_buffer": True, "axes": False}, {"ids_type": TensorProto.INT32}],
                         ids=["ts", "rank1-buffer", "no-axes-steps", "no-axes", "int32-ids"])
def test_embed_layernorm_fires(kw):
    m = _embeddings(**kw)
    dtype = np.int32 if kw.get("ids_type") == TensorProto.INT32 else np.int64
    got = check_fires(m, "embed-layernorm", ["Cast", "Cast", "com.microsoft.EmbedLayerNormalization"],
                      feeds=_embed_feeds(m, dtype), rtol=1e-4, atol=1e-4)
    emb = got.graph.node[2]
    assert list(emb.input)[2:] == ["word", "pos", "seg", "gamma", "beta"]


@pytest.mark.parametrize("order", ["wsp", "wps"])
def test_embed_layernorm_either_add_order(order, tmp_path):
    """(word + position) + token type fuses as (word + token type) + position does. ONNX's shape inference
    gives the position ids (a Slice of the [1, 16] buffer with a run-time end) invented dims on both axes, which a
    rule's [b, s] would take for the batch; the axis the Slice does not slice keeps the buffer's 1, so the
    segment Gather cannot be bound to the position one (its ids must have input_ids' shape) and the kernel gets
    each table in its place. Through optimize with validation: nothing rolled back."""
    from onnxfuse import OptimizeOptions, optimize

    m = _embeddings(order=order)
    ops = [n.op_type for n in m.graph.node]
    order_of = [n.input[1] for n in m.graph.node if n.op_type == "Add"]
    assert order_of == (["te", "pe"] if order == "wsp" else ["pe", "te"]) and ops.count("Add") == 2
    r = optimize(save(m, tmp_path / "m.onnx"), tmp_path / "o.onnx", OptimizeOptions(measure=False))
    assert r.validation == "passed" and r.fired.get("embed-layernorm") == 1, (r.validation, r.fired)
    got = onnx.load(str(tmp_path / "o.onnx"))
    (emb,) = [n for n in got.graph.node if n.op_type == "EmbedLayerNormalization"]
    casts = {n.output[0]: n.input[0] for n in got.graph.node if n.op_type == "Cast"}
    assert [casts.get(i, i) for i in emb.input[:5]] == ["ids", "tt", "word", "pos", "seg"]
    assert_same(m, got, _embed_feeds(m), 1e-4, 1e-4)


def test_embed_layernorm_near_miss_permuted_buffer():
    """Positions that are not 0..s-1 from the buffer: not the kernel's own positions (not fused here)."""
    check_misses(_embeddings(pbuf=np.arange(16) * 2), "embed-layernorm")


def test_embed_layernorm_near_miss_buffer_longer_than_table():
    check_misses(_embeddings(pbuf=np.arange(32), pos_rows=16), "embed-layernorm",
                 "require failed: size(default(PBUF, int64([0]))) <= POS.shape[0]")


@pytest.mark.parametrize("rule_id", ["skip-layernorm", "skip-rmsnorm"])
def test_skip_norm_needs_a_skip_of_the_same_shape(rule_id):
    """S [batch, one, k] and A [batch, seq, k]: the model's own names say the dims may differ (the Add
    broadcasts when one is 1); the fused op would refuse that input, so the rule must not fire."""
    if rule_id == "skip-layernorm":
        nodes = [oh.make_node("Add", ["x", "skip"], ["s"], name="residual"),
                 oh.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, name="ln")]
        inits = {"gamma": GAMMA, "beta": BETA}
    else:
        m = _rms(18, skip=True)
        nodes, inits = list(m.graph.node), {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    m = make_model(nodes, [("x", ["batch", "seq", K]), ("skip", ["batch", "one", K])], [("y", ["batch", "seq", K])],
                   inits, opset=18)
    feeds = {"x": RNG.standard_normal((2, 5, K)).astype(np.float32),
             "skip": RNG.standard_normal((2, 1, K)).astype(np.float32)}
    r, got = fuse(m, rule_id)
    assert r.fired == {}, "fired: " + str(op_types(got))
    assert_same(m, got, feeds)


def _tf_layernorm(shape=SHAPE, square="mul"):
    """Keras LayerNormalization as tf2onnx converts it: GlobalAveragePool means, m = gamma / sqrt(var + eps),
    y = x * m + (beta - mean * m)."""
    nodes = [oh.make_node("GlobalAveragePool", ["x"], ["mean"], name="mean"),
             oh.make_node("Sub", ["x", "mean"], ["d"], name="d"),
             oh.make_node("Mul", ["d", "d"], ["sq"], name="sq") if square == "mul"
             else oh.make_node("Pow", ["d", "two"], ["sq"], name="sq"),
             oh.make_node("GlobalAveragePool", ["sq"], ["var"], name="var"),
             oh.make_node("Add", ["var", "eps"], ["ve"], name="ve"),
             oh.make_node("Sqrt", ["ve"], ["std"], name="std"),
             oh.make_node("Reciprocal", ["std"], ["rstd"], name="rstd"),
             oh.make_node("Mul", ["rstd", "gamma"], ["m"], name="m"),
             oh.make_node("Mul", ["x", "m"], ["xm"], name="xm"),
             oh.make_node("Mul", ["mean", "m"], ["mm"], name="mm"),
             oh.make_node("Sub", ["beta", "mm"], ["shift"], name="shift"),
             oh.make_node("Add", ["xm", "shift"], ["y"], name="y")]
    inits = {"eps": np.float32(1e-6), "gamma": GAMMA, "beta": BETA, "two": np.float32(2.0)}
    return make_model(nodes, [("x", list(shape))], [("y", list(shape))], inits)


@pytest.mark.parametrize("square", ["mul", "pow"])
def test_layernorm_batchnorm_form_fires(square):
    got = check_fires(_tf_layernorm(square=square), "layernorm-batchnorm-form", ["LayerNormalization"],
                      rtol=1e-5, atol=1e-5)
    ln = got.graph.node[0]
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    np.testing.assert_array_equal(inits[ln.input[1]], GAMMA)
    np.testing.assert_array_equal(inits[ln.input[2]], BETA)
    assert {a.name: a for a in ln.attribute}["epsilon"].f == pytest.approx(1e-6)


def test_layernorm_batchnorm_form_needs_rank_3():
    """On a rank-4 tensor GlobalAveragePool averages the last two axes: not a LayerNorm over the last one."""
    check_misses(_tf_layernorm(shape=[2, 3, 4, K]), "layernorm-batchnorm-form")


def _embed_ids_form(form, eps=1e-12):
    """word[ids] (+ seg[tt]) + pos[position ids] -> LayerNormalization (opset 17): position ids as a graph input
    ("input") or DistilBERT's Range/Unsqueeze/Expand ("range", no segment)."""
    TP = TensorProto
    rng = np.random.default_rng(0)
    inits = {"word": rng.standard_normal((16, 8)).astype(np.float32), "pos": rng.standard_normal((16, 8)).astype(np.float32),
             "seg": rng.standard_normal((2, 8)).astype(np.float32), "g": np.ones(8, np.float32),
             "bt": np.zeros(8, np.float32), "z": np.array(0, np.int64), "one": np.array(1, np.int64),
             "ax0": np.array([0], np.int64), "i1": np.array(1, np.int64)}
    inputs = [("ids", [2, 8], TP.INT64)]
    nodes = [oh.make_node("Gather", ["word", "ids"], ["w"], axis=0)]
    if form == "range":
        nodes += [oh.make_node("Shape", ["ids"], ["sh"]), oh.make_node("Gather", ["sh", "i1"], ["n"], axis=0),
                  oh.make_node("Range", ["z", "n", "one"], ["r"]), oh.make_node("Unsqueeze", ["r", "ax0"], ["r2"]),
                  oh.make_node("Expand", ["r2", "sh"], ["pid"]), oh.make_node("Gather", ["pos", "pid"], ["p"], axis=0),
                  oh.make_node("Add", ["w", "p"], ["e"])]
    else:
        inputs += [("tt", [2, 8], TP.INT64), ("pid", [2, 8], TP.INT64)]
        nodes += [oh.make_node("Gather", ["seg", "tt"], ["s"], axis=0), oh.make_node("Add", ["w", "s"], ["ws"]),
                  oh.make_node("Gather", ["pos", "pid"], ["p"], axis=0), oh.make_node("Add", ["ws", "p"], ["e"])]
    nodes.append(oh.make_node("LayerNormalization", ["e", "g", "bt"], ["y"], axis=-1, epsilon=eps))
    return make_model(nodes, inputs, [("y", [2, 8, 8])], {k: v for k, v in inits.items()
                                                         if any(k in n.input for n in nodes)}, opset=17)


@pytest.mark.parametrize("form", ["input"])  # "range" (DistilBERT): covered by the forms corpus only, see report
def test_embed_layernorm_position_ids_value(form):
    """Position ids that are not a Slice of the arange buffer go to the kernel's position_ids input; no segment
    ids: the kernel's segment inputs are left out."""
    m = _embed_ids_form(form)
    feeds = {"ids": np.array([[1, 5, 9, 2, 0, 15, 3, 3], [4, 4, 8, 1, 7, 6, 2, 11]], np.int64)}
    if form == "input":
        feeds["tt"] = np.array([[0, 0, 0, 1, 1, 1, 1, 0]] * 2, np.int64)
        feeds["pid"] = np.array([[7, 6, 5, 4, 3, 2, 1, 0], [0, 2, 4, 6, 8, 10, 12, 14]], np.int64)
    ops = (["Cast", "Cast", "Cast"] if form == "input"
           else ["Shape", "Gather", "Range", "Unsqueeze", "Expand", "Cast", "Cast"]) + ["com.microsoft.EmbedLayerNormalization"]
    got = check_fires(m, "embed-layernorm", ops, feeds=feeds, rtol=1e-4, atol=1e-4)
    eln = got.graph.node[-1]
    assert len(eln.input) == 9 and eln.input[8]  # position_ids passed
    assert (eln.input[1] == "") == (form == "range")  # no segment ids for DistilBERT


def test_embed_layernorm_position_table_not_constant_not_fused():
    """Near miss: position ids from an input, but the position table is a graph input (not a constant)."""
    m = _embed_ids_form("input")
    pos = [i for i in m.graph.initializer if i.name == "pos"][0]
    m.graph.initializer.remove(pos)
    m.graph.input.append(oh.make_tensor_value_info("pos", TensorProto.FLOAT, [16, 8]))
    check_misses(m, "embed-layernorm")


@pytest.mark.parametrize(("op", "opset"), [("SimplifiedLayerNormalization", 17)])
def test_skip_rmsnorm_refines_a_norm_op_already_there(op, opset):
    """Add + onnxruntime's SimplifiedLayerNormalization (onnxscript writes it): the op is a starting point, not a
    miss; its epsilon is the op's own (0.01 here: the default would differ)."""
    rng = np.random.default_rng(5)
    nodes = [oh.make_node("Add", ["x", "r"], ["s"]),
             oh.make_node(op, ["s", "w"], ["y"], axis=-1, epsilon=0.01)]
    m = make_model(nodes, [("x", [2, 8, 64]), ("r", [2, 8, 64])], [("y", [2, 8, 64])],
                   {"w": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)}, opset=opset)
    feeds = {k: 0.1 * v for k, v in rand_feeds(m).items()}  # variance about eps: a wrong eps shows
    got = check_fires(m, "skip-rmsnorm", ["com.microsoft.SkipSimplifiedLayerNormalization"], feeds=feeds,
                      rtol=1e-4, atol=1e-5)
    assert next(a.f for a in got.graph.node[0].attribute if a.name == "epsilon") == pytest.approx(0.01)



def test_embed_layernorm_keeps_the_sum_for_a_residual_that_reads_it():
    """GPT-2: word[ids] + position[position_ids], the first block's LayerNorm, and the sum read again as that
    block's residual: EmbedLayerNormalization gives the sum through its embedding_sum output."""
    rng = np.random.default_rng(2)
    h = 8
    nodes = [oh.make_node("Gather", ["word", "ids"], ["we"], axis=0), oh.make_node("Gather", ["pos", "pids"], ["pe"], axis=0),
             oh.make_node("Add", ["we", "pe"], ["e"]),
             oh.make_node("LayerNormalization", ["e", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             oh.make_node("Add", ["e", "n"], ["y"])]
    inits = {"word": rng.standard_normal((32, h)).astype(np.float32), "pos": rng.standard_normal((16, h)).astype(np.float32),
             "gamma": np.ones(h, np.float32), "beta": np.zeros(h, np.float32)}
    m = make_model(nodes, [("ids", ["b", "s"], TensorProto.INT64), ("pids", ["b", "s"], TensorProto.INT64)],
                   [("y", ["b", "s", h])], inits, opset=17)
    feeds = {"ids": rng.integers(0, 32, (2, 10)).astype(np.int64),
             "pids": np.tile(np.arange(10, dtype=np.int64), (2, 1))}
    got = check_fires(m, "embed-layernorm", ["Cast", "Cast", "com.microsoft.EmbedLayerNormalization", "Add"],
                      feeds=feeds, rtol=1e-5, atol=1e-5)
    fused = got.graph.node[2]
    assert list(got.graph.node[3].input) == [fused.output[2], fused.output[0]]


@pytest.mark.parametrize("gamma_shape", [(1, K), (1, 1, K)], ids=["1k", "11k"])
def test_layernorm_with_a_gamma_of_leading_ones_fires(gamma_shape):
    """tf2onnx's Keras LayerNormalization: gamma [1, 1, k] (and beta [k]); LayerNormalization takes them as [k]."""
    got = check_fires(_layernorm(gamma_shape=gamma_shape), "layernorm-decomposed-row-gamma", ["LayerNormalization"],
                      rtol=1e-5, atol=1e-5)
    scale = next(t for t in got.graph.initializer if t.name == got.graph.node[0].input[1])
    assert list(scale.dims) == [K]


def test_skip_rmsnorm_over_the_cast_of_an_int_input_is_exact():
    """SkipSimplifiedLayerNormalization reads the Cast's float output (an int input cast to float, as a token-count
    or quantized model feeds it): the kernel computes in float32 what the ops did, so the fused op gives the
    original's numbers at every batch and length, small ints and large ones alike."""
    nodes = [oh.make_node("Cast", ["ids"], ["a"], to=TensorProto.FLOAT),
             oh.make_node("Add", ["a", "skip"], ["s"]), oh.make_node("Pow", ["s", "two"], ["p"]),
             oh.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1), oh.make_node("Add", ["m", "eps"], ["me"]),
             oh.make_node("Sqrt", ["me"], ["r"]), oh.make_node("Div", ["s", "r"], ["n"]),
             oh.make_node("Mul", ["n", "g"], ["y"])]
    m = make_model(nodes, [("ids", ["b", "t", 32], TensorProto.INT64), ("skip", ["b", "t", 32])], [("y", ["b", "t", 32])],
                   {"two": np.float32(2), "ax": np.array([-1], np.int64), "eps": np.float32(1e-6),
                    "g": np.linspace(0.5, 1.5, 32).astype(np.float32)}, opset=18)
    m = onnx.shape_inference.infer_shapes(m)
    r, got = fuse(m, "skip-rmsnorm")
    assert r.fired == {"skip-rmsnorm": 1}
    assert [n.op_type for n in got.graph.node] == ["Cast", "SkipSimplifiedLayerNormalization"]
    rng = np.random.default_rng(2)
    for b, t, hi in ((1, 1, 4), (2, 7, 1000), (3, 16, 1 << 20)):
        feeds = {"ids": rng.integers(-hi, hi, (b, t, 32)).astype(np.int64),
                 "skip": rng.standard_normal((b, t, 32)).astype(np.float32)}
        assert_same(m, got, feeds, rtol=1e-5, atol=1e-5)


def _patch_embeddings(pos_rows: int = 4) -> onnx.ModelProto:
    """ViT's embeddings in small: Conv patches flattened by a Reshape whose target is read from Shape at run time
    (shape inference makes the token count up), plus a position table [1, t, k] shared by every batch row, then
    the first LayerNormalization."""
    rng = np.random.default_rng(4)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], strides=[4, 4]),
             oh.make_node("Shape", ["c"], ["cs"], start=0, end=2),
             oh.make_node("Concat", ["cs", "m1"], ["flat"], axis=0),
             oh.make_node("Reshape", ["c", "flat"], ["f"]),
             oh.make_node("Transpose", ["f"], ["p"], perm=[0, 2, 1]),
             oh.make_node("Add", ["p", "pos"], ["e"]),
             oh.make_node("LayerNormalization", ["e", "g", "bt"], ["y"], axis=-1, epsilon=1e-6)]
    m = make_model(nodes, [("x", ["batch", 3, 8, 8])], [("y", None), ("e", None)],
                   {"w": rng.standard_normal((16, 3, 4, 4)).astype(np.float32), "m1": np.array([-1], np.int64),
                    "pos": rng.standard_normal((1, pos_rows, 16)).astype(np.float32),
                    "g": rng.uniform(0.5, 1.5, 16).astype(np.float32), "bt": rng.standard_normal(16).astype(np.float32)},
                   opset=17)
    return onnx.shape_inference.infer_shapes(m)


def test_skip_layernorm_takes_a_skip_shared_by_every_batch_row():
    """ViT's embeddings: the patches' token count is a dim shape inference made up; the producers fix it to 4
    (worked out by the shape interpreter at two sets of sizes), so the position table [1, 4, 16] is a skip
    SkipLayerNormalization broadcasts over the batch; its sum stays readable (output 3)."""
    m = _patch_embeddings()
    patches = next(v for v in m.graph.value_info if v.name == "p").type.tensor_type.shape.dim
    assert not patches[1].HasField("dim_value"), "the test needs a token count shape inference made up"
    r, got = fuse(m, "skip-layernorm")
    assert r.fired == {"skip-layernorm": 1}
    sln = next(n for n in got.graph.node if n.op_type == "SkipLayerNormalization")
    assert list(sln.input[:2]) == ["p", "pos"] and sln.output[3] == "e"
    for batch in (1, 3):
        assert_same(m, got, {"x": np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)})


def test_skip_layernorm_refuses_a_skip_whose_rows_the_producers_do_not_fix():
    """A table of 5 rows against 4 tokens is no skip of theirs (the Add would not run either): refused with the
    reason in dims."""
    r, _ = fuse(_patch_embeddings(pos_rows=5), "skip-layernorm")
    assert r.fired == {}


def test_skip_layernorm_bias_takes_the_bias_added_after_the_skip():
    """(x + skip) + bias[k]: the other association of the same sum (the bias was "a skip of shape [k]" to the
    plain rule); SkipLayerNormalization adds all three."""
    bias = RNG.standard_normal(K).astype(np.float32)
    nodes = [oh.make_node("Add", ["x", "skip"], ["xs"]), oh.make_node("Add", ["xs", "bias"], ["s"]),
             oh.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    m = make_model(nodes, [("x", SHAPE), ("skip", SHAPE)], [("y", SHAPE)],
                   {"gamma": GAMMA, "beta": BETA, "bias": bias}, opset=17)
    got = check_fires(m, "skip-layernorm-bias", ["com.microsoft.SkipLayerNormalization"], rtol=1e-4, atol=1e-4)
    assert list(got.graph.node[0].input) == ["x", "skip", "gamma", "beta", "bias"]
