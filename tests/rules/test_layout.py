"""patterns/layout.yaml: rewrites that keep onnxruntime's CPU convolutions in the blocked NCHWc layout (the
squeeze-excitation gate broadcast, constant affines as depthwise convolutions)."""

import os
import tempfile
from collections import Counter

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from .conftest import check_fires, check_misses, fuse, make_model, rand_feeds

RNG = np.random.default_rng(0)
C, R = 32, 8


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


INITS = {"w0": _w(C, C, 3, 3), "b0": _w(C), "w1": _w(R, C, 1, 1), "b1": _w(R), "w2": _w(C, R, 1, 1), "b2": _w(C)}
GATES = {  # the gate activations exporters write after the expanding 1x1 Conv, as (nodes, extra initializers)
    "sigmoid": ([oh.make_node("Sigmoid", ["e"], ["g"])], {}),
    "hardsigmoid": ([oh.make_node("HardSigmoid", ["e"], ["g"], alpha=1 / 6, beta=0.5)], {}),
    "clip-div": ([oh.make_node("Add", ["e", "three"], ["a3"]), oh.make_node("Clip", ["a3", "zero", "six"], ["cl"]),
                  oh.make_node("Div", ["cl", "six"], ["g"])],
                 {"three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}),
}


def _se(gate="sigmoid", hw=(8, 8), batch=1, gate_batch=None, opset=17, dynamic=False, tail=False):
    """x -> Conv (pads 1) = c; GlobalAveragePool -> Conv -> Relu -> Conv = e -> gate activation = g; y = c * g
    (`tail`: y = Conv(c * g), the SE block inside a chain of convolutions)."""
    h, w = hw
    gnodes, ginits = GATES[gate]
    nodes = [oh.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("GlobalAveragePool", ["c"], ["p"]),
             oh.make_node("Conv", ["p", "w1", "b1"], ["r"]), oh.make_node("Relu", ["r"], ["rr"]),
             oh.make_node("Conv", ["rr", "w2", "b2"], ["e"]), *gnodes]
    if gate_batch is not None:  # a gate of another batch size than x (broadcast over the batch too)
        nodes.append(oh.make_node("Slice", ["g", "s0", "s1", "s2"], ["gs"]))
        ginits = {**ginits, "s0": np.array([0], np.int64), "s1": np.array([gate_batch], np.int64),
                  "s2": np.array([0], np.int64)}
    nodes.append(oh.make_node("Mul", ["c", "gs" if gate_batch is not None else "g"], ["m" if tail else "y"]))
    if tail:
        nodes.append(oh.make_node("Conv", ["m", "w0", "b0"], ["y"], pads=[1, 1, 1, 1]))
    shape = [batch, C, "h", "w"] if dynamic else [batch, C, h, w]
    return make_model(nodes, [("x", shape)], [("y", shape)], {**INITS, **ginits}, opset=opset)


def _gate_ops(gate):
    return [n.op_type for n in GATES[gate][0]]


def test_se_gate_broadcast_fires_with_constant_scales_and_exact_numbers():
    got = check_fires(_se(), "se-gate-broadcast",
                      ["Conv", "GlobalAveragePool", "Conv", "Relu", "Conv", "Sigmoid", "Resize", "Mul"],
                      rtol=0, atol=0)
    resize = next(n for n in got.graph.node if n.op_type == "Resize")
    attrs = {a.name: oh.get_attribute_value(a) for a in resize.attribute}
    assert attrs == {"mode": b"nearest", "coordinate_transformation_mode": b"asymmetric", "nearest_mode": b"floor"}
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    assert resize.input[0] == "g" and inits[resize.input[1]].size == 0
    np.testing.assert_array_equal(inits[resize.input[2]], np.array([1, 1, 8, 8], np.float32))
    assert inits[resize.input[2]].dtype == np.float32
    mul = got.graph.node[-1]
    assert sorted(mul.input) == sorted(["c", resize.output[0]])


@pytest.mark.parametrize("gate", sorted(GATES))
def test_se_gate_broadcast_takes_each_gate_spelling(gate):
    check_fires(_se(gate), "se-gate-broadcast",
                ["Conv", "GlobalAveragePool", "Conv", "Relu", "Conv", *_gate_ops(gate), "Resize", "Mul"],
                rtol=0, atol=0)


def test_se_gate_broadcast_after_the_gate_fusions():
    # Clip/Div gate -> HardSigmoid -> FusedConv(HardSigmoid): the broadcast reads the fused gate
    got = check_fires(_se("clip-div"), ["hardsigmoid-decomposed", "conv-hardsigmoid", "se-gate-broadcast"],
                      ["Conv", "GlobalAveragePool", "Conv", "Relu", "com.microsoft.FusedConv", "Resize", "Mul"],
                      fired={"hardsigmoid-decomposed": 1, "conv-hardsigmoid": 1, "se-gate-broadcast": 1},
                      rtol=1e-6, atol=1e-6)
    assert got.graph.node[-2].input[0] == got.graph.node[-3].output[0]


@pytest.mark.parametrize("kw", [{"hw": (7, 5), "batch": 2}, {"hw": (1, 9)}, {"opset": 11}],
                         ids=["batch2-odd", "one-row", "opset11"])
def test_se_gate_broadcast_shapes_and_opsets(kw):
    m = _se(**kw)
    check_fires(m, "se-gate-broadcast",
                ["Conv", "GlobalAveragePool", "Conv", "Relu", "Conv", "Sigmoid", "Resize", "Mul"],
                feeds=rand_feeds(m), rtol=0, atol=0)


@pytest.mark.parametrize("kw, reason", [
    ({"dynamic": True}, "X.dims[2] > 0"),      # scales cannot be constants
    ({"hw": (1, 1)}, "X.dims[2] * X.dims[3] > 1"),  # nothing to broadcast
    ({"batch": 2, "gate_batch": 1}, "shape"),  # the gate broadcasts over the batch too
    ({"opset": 10}, None),                     # Resize-10 has no coordinate_transformation_mode
], ids=["dynamic-hw", "1x1", "gate-batch-1", "opset10"])
def test_se_gate_broadcast_near_misses(kw, reason):
    check_misses(_se(**kw), "se-gate-broadcast", reason)


def test_se_gate_broadcast_leaves_a_constant_scale_alone():
    m = make_model([oh.make_node("Mul", ["x", "s"], ["y"])], [("x", [1, C, 8, 8])], [("y", [1, C, 8, 8])],
                   {"s": _w(1, C, 1, 1)})
    check_misses(m, "se-gate-broadcast")


def test_se_gate_broadcast_is_cpu_only():
    r, _ = fuse(_se(), "se-gate-broadcast", target="cuda")
    assert [(s.rule, s.reason) for s in r.skipped] == [("se-gate-broadcast", "declared for cpu only")]


def _ort_reorders(model: onnx.ModelProto) -> Counter:
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = os.path.join(d, "o.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ops = Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)
    return Counter({k: v for k, v in ops.items() if k.startswith("Reorder")})


def test_se_gate_broadcast_keeps_onnxruntime_in_nchwc():
    """The point of the rule: onnxruntime's NCHWc chain no longer breaks at the SE Mul (the channel-broadcasting
    Mul needed a ReorderOutput for each input and a ReorderInput after it)."""
    m = _se(hw=(16, 16), tail=True)
    before = _ort_reorders(m)
    if not before:
        pytest.skip("onnxruntime runs no NCHWc convolutions on this machine")
    _, got = fuse(m, "se-gate-broadcast")
    after = _ort_reorders(got)
    # gone: the ReorderOutput of each of the Mul's inputs and the ReorderInput of its output (x in and y out stay)
    assert (after["ReorderOutput"], after["ReorderInput"]) == (before["ReorderOutput"] - 2,
                                                               before["ReorderInput"] - 1), (before, after)
    assert after["ReorderInput"] == 1


def _affine(a_shape=(1,), b_shape=(1,), hw=(8, 8), dynamic=False, channels=C, order=("h", "a")):
    """x -> Conv (pads 1) -> HardSwish = h; y = Conv(h * A + B) (PP-LCNetV3's learnable affine block between two
    convolutions); `order` gives Mul's and Add's operand order."""
    inits = {"w0": _w(channels, channels, 3, 3), "b0": _w(channels), "w1": _w(channels, channels, 1, 1),
             "A": (1 + _w(*a_shape)).astype(np.float32), "B": _w(*b_shape)}
    mul_in = ["h", "A"] if order[1] == "a" else ["A", "h"]
    nodes = [oh.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("HardSwish", ["c"], ["h"]),
             oh.make_node("Mul", mul_in, ["m"]), oh.make_node("Add", ["B", "m"] if order[0] == "b" else ["m", "B"],
                                                               ["t"]),
             oh.make_node("Conv", ["t", "w1"], ["y"])]
    shape = [1, channels, "h", "w"] if dynamic else [1, channels, *hw]
    return make_model(nodes, [("x", shape)], [("y", shape)], inits)


@pytest.mark.parametrize("a_shape, b_shape", [((1,), (1,)), ((), ()), ((1, C, 1, 1), (C, 1, 1)), ((C, 1, 1), (1,))],
                         ids=["scalars-1", "scalars-0d", "per-channel", "mixed"])
def test_affine_as_depthwise_conv_takes_scalar_and_channel_constants(a_shape, b_shape):
    m = _affine(a_shape, b_shape)
    got = check_fires(m, "affine-as-depthwise-conv", ["Conv", "HardSwish", "Conv", "Conv"], rtol=1e-6, atol=1e-6)
    dw = got.graph.node[2]
    attrs = {a.name: oh.get_attribute_value(a) for a in dw.attribute}
    assert attrs == {"group": C, "kernel_shape": [1, 1]} and dw.input[0] == "h"
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    src = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    w, b = inits[dw.input[1]], inits[dw.input[2]]
    assert w.shape == (C, 1, 1, 1) and b.shape == (C,) and w.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(w.reshape(-1), np.broadcast_to(src["A"].reshape(-1), (C,)))
    np.testing.assert_array_equal(b, np.broadcast_to(src["B"].reshape(-1), (C,)))


@pytest.mark.parametrize("order", [("b", "a"), ("h", "x")], ids=["add-swapped", "mul-swapped"])
def test_affine_as_depthwise_conv_takes_either_operand_order(order):
    check_fires(_affine(order=order), "affine-as-depthwise-conv", ["Conv", "HardSwish", "Conv", "Conv"],
                rtol=1e-6, atol=1e-6)


def test_affine_as_depthwise_conv_keeps_dynamic_spatial_dims():
    m = _affine(dynamic=True)
    got = check_fires(m, "affine-as-depthwise-conv", ["Conv", "HardSwish", "Conv", "Conv"], feeds=False)
    feeds = {"x": RNG.standard_normal((1, C, 12, 20)).astype(np.float32)}
    assert_same_at(m, got, feeds)


def test_affine_as_depthwise_conv_near_misses():
    check_misses(_affine(a_shape=(1, 1, 8, 1)), "affine-as-depthwise-conv")  # varies over rows: not per channel
    x = make_model([oh.make_node("Mul", ["x", "a"], ["m"]), oh.make_node("Add", ["m", "b"], ["y"])],
                   [("x", [1, "c", 8, 8])], [("y", [1, "c", 8, 8])], {"a": _w(1), "b": _w(1)})
    check_misses(x, "affine-as-depthwise-conv", "require failed: X.dims[1] > 0")  # the group needs the channels
    r, _ = fuse(_affine(), "affine-as-depthwise-conv", target="cuda")
    assert [(s.rule, s.reason) for s in r.skipped] == [("affine-as-depthwise-conv", "declared for cpu only")]


def test_affine_as_depthwise_conv_keeps_onnxruntime_in_nchwc():
    m = _affine(hw=(16, 16))
    before = _ort_reorders(m)
    if not before:
        pytest.skip("onnxruntime runs no NCHWc convolutions on this machine")
    _, got = fuse(m, "affine-as-depthwise-conv")
    after = _ort_reorders(got)
    # the affine broke the chain between the two convolutions: one ReorderOutput and one ReorderInput fewer
    assert (after["ReorderOutput"], after["ReorderInput"]) == (before["ReorderOutput"] - 1,
                                                               before["ReorderInput"] - 1), (before, after)


def assert_same_at(model, got, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    have = ort.InferenceSession(got.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(want, have, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _residual_gate(hw=(8, 8), dynamic=False, swap=False, gate_shape=None, extra_reader=False):
    """PP-OCR's RSE block: y = c + c * g, g the SE gate of c ([1, C, 1, 1]); `swap`: Add(c * g, c) and
    Mul(g, c); `gate_shape`: a constant gate of that shape instead."""
    h, w = hw
    gnodes, ginits = GATES["hardsigmoid"]
    nodes = [oh.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1])]
    inits = dict(INITS)
    if gate_shape is None:
        nodes += [oh.make_node("GlobalAveragePool", ["c"], ["p"]), oh.make_node("Conv", ["p", "w1", "b1"], ["r"]),
                  oh.make_node("Relu", ["r"], ["rr"]), oh.make_node("Conv", ["rr", "w2", "b2"], ["e"]), *gnodes]
        inits |= ginits
    else:
        inits["g"] = _w(*gate_shape)
    nodes += [oh.make_node("Mul", ["g", "c"] if swap else ["c", "g"], ["m"]),
              oh.make_node("Add", ["m", "c"] if swap else ["c", "m"], ["y"])]
    outs = [("y", [1, C, "h", "w"] if dynamic else [1, C, h, w])]
    if extra_reader:  # the product is read elsewhere too: it must stay
        outs.append(("m", outs[0][1]))
    return make_model(nodes, [("x", [1, C, "h", "w"] if dynamic else [1, C, h, w])], outs, inits)


@pytest.mark.parametrize("swap", [False, True], ids=["c+c*g", "c*g+c"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-hw"])
def test_se_residual_gate_moves_the_add_onto_the_gate(swap, dynamic):
    got = check_fires(_residual_gate(dynamic=dynamic, swap=swap), "se-residual-gate",
                      ["Conv", "GlobalAveragePool", "Conv", "Relu", "Conv", "HardSigmoid", "Add", "Mul"],
                      feeds=rand_feeds(_residual_gate(), dims={"h": 8, "w": 8}), rtol=1e-5, atol=1e-5)
    add, mul = got.graph.node[-2:]
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    assert "g" in add.input and inits[next(i for i in add.input if i != "g")].tolist() == [1.0]
    assert sorted(mul.input) == sorted(["c", add.output[0]])


def test_se_residual_gate_takes_a_constant_gate_and_chains_into_the_gate_broadcast():
    check_fires(_residual_gate(gate_shape=(1, C, 1, 1)), "se-residual-gate", ["Conv", "Constant", "Mul"])  # g + 1 folds
    # static H, W: the remaining Mul is an SE product, which se-gate-broadcast keeps in NCHWc
    check_fires(_residual_gate(), ["se-residual-gate", "se-gate-broadcast"],
                ["Conv", "GlobalAveragePool", "Conv", "Relu", "Conv", "HardSigmoid", "Add", "Resize", "Mul"],
                fired={"se-residual-gate": 1, "se-gate-broadcast": 1})


@pytest.mark.parametrize("kw, reason", [
    ({"gate_shape": (1, C, 8, 8)}, None),                           # not a gate: nothing moves off the map
    ({"hw": (1, 1)}, "X.dims[2] != 1 or X.dims[3] != 1"),          # the map is no bigger than the gate
    ({"extra_reader": True}, None),                                 # the product is read elsewhere
], ids=["map-sized", "1x1", "product-read-elsewhere"])
def test_se_residual_gate_near_misses(kw, reason):
    check_misses(_residual_gate(**kw), "se-residual-gate", reason)
