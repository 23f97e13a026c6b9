"""NHWC conversion for CUDA: runs of Conv become com.microsoft.NhwcConv with one Transpose at each boundary and
weights re-laid [M, kH, kW, C/group] offline. No GPU here, so the output is checked by emulating NhwcConv with
standard ops on the CPU (Transpose to NCHW, Conv with the weight laid back, Transpose to NHWC); the CPU target
refuses the rule with a reason."""

import numpy as np
import onnx
import onnx.helper as oh
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, optimize


def _conv_chain(tmp_path, group_last: bool = False):
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], {}, "x"
    chans = [(3, 8, 1), (8, 8, 1), (8, 16, 2 if group_last else 1)]
    for i, (ci, co, g) in enumerate(chans):
        inits[f"w{i}"] = rng.standard_normal((co, ci // g, 3, 3)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(co).astype(np.float32)
        nodes.append(oh.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1],
                                  strides=[2, 2] if i == 1 else [1, 1], group=g))
        prev = f"c{i}"
    m = make_model(nodes, [("x", [1, 3, 16, 16])], [(prev, [1, 16, 8, 8])], inits)
    return save(m, tmp_path / "chain.onnx")


def _emulate_nhwc_conv(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace each NhwcConv by standard ops with the same meaning (input, weight and output channels-last)."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    out_nodes = []
    for n in model.graph.node:
        if n.op_type != "NhwcConv":
            out_nodes.append(n)
            continue
        w = inits[n.input[1]]
        w_name = n.input[1] + "_oihw"
        model.graph.initializer.append(onnx.numpy_helper.from_array(w.transpose(0, 3, 1, 2).copy(), w_name))
        x_nchw, y_nchw = n.output[0] + "_xin", n.output[0] + "_yout"
        out_nodes.append(oh.make_node("Transpose", [n.input[0]], [x_nchw], perm=[0, 3, 1, 2]))
        conv = oh.make_node("Conv", [x_nchw, w_name, *n.input[2:]], [y_nchw])
        conv.attribute.extend(n.attribute)
        out_nodes.append(conv)
        out_nodes.append(oh.make_node("Transpose", [y_nchw], [n.output[0]], perm=[0, 2, 3, 1]))
    del model.graph.node[:]
    model.graph.node.extend(out_nodes)
    return model


def test_cuda_target_converts_a_conv_run_to_nhwc(tmp_path):
    src = _conv_chain(tmp_path, group_last=True)
    out = str(tmp_path / "out.onnx")
    # not measured: with a CUDA execution provider installed, timing would decide what fires
    r = optimize(src, out, OptimizeOptions(target="cuda", validate=False, measure=False))
    got = onnx.load(out)
    ops = op_types(got)
    assert ops.count("com.microsoft.NhwcConv") == 3 and "Conv" not in ops
    assert ops.count("Transpose") == 2  # one into NHWC before the run, one back after it
    assert r.fired["conv-nhwc"] == 3 and r.fired["transpose-cancel"] == 2
    assert r.validation == "skipped (--no-validate)"
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort_run(onnx.load(src), {"x": x})[0]
    have = ort_run(_emulate_nhwc_conv(got), {"x": x})[0]
    np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)


def test_cpu_target_refuses_nhwc_with_a_reason(tmp_path):
    src = _conv_chain(tmp_path)
    r = optimize(src, str(tmp_path / "out.onnx"), OptimizeOptions(target="cpu", measure=False))
    assert "conv-nhwc" not in r.fired and op_types(onnx.load(str(tmp_path / "out.onnx"))).count("Conv") == 3
    assert {s.rule: s.reason for s in r.skipped}["conv-nhwc"] == "declared for cuda only"


def test_cuda_target_without_cuda_provider_holds_nhwc_back_when_validating(tmp_path):
    from onnxfuse.targets import available

    if available("cuda"):
        return  # with a CUDA provider the rewrite is validated on it instead
    src = _conv_chain(tmp_path)
    r = optimize(src, str(tmp_path / "out.onnx"), OptimizeOptions(target="cuda", measure=False))
    assert r.fired == {} and r.validation == "not needed: nothing was rewritten"
    reason = {s.rule: s.reason for s in r.skipped}["conv-nhwc"]
    assert reason.startswith("com.microsoft.NhwcConv has no CPU kernel and no CUDA execution provider")


def test_transposes_move_through_concat_pad_slice_reduce_and_cancel(tmp_path):
    """TensorFlow-style: NHWC inputs are transposed to NCHW, concatenated on channels, padded, sliced on H,
    summed over channels, and transposed back. Every Transpose moves down (axes remapped) and cancels."""
    nodes = [
        oh.make_node("Transpose", ["x"], ["a"], perm=[0, 3, 1, 2]),
        oh.make_node("Transpose", ["y"], ["b"], perm=[0, 3, 1, 2]),
        oh.make_node("Concat", ["a", "b"], ["c"], axis=1),
        oh.make_node("Pad", ["c", "pads"], ["p"], mode="reflect"),
        oh.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"]),
        oh.make_node("ReduceSum", ["s", "raxes"], ["m"], keepdims=1),
        oh.make_node("Transpose", ["m"], ["out"], perm=[0, 2, 3, 1]),
    ]
    inits = {"pads": np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64), "starts": np.array([1], np.int64),
             "ends": np.array([9], np.int64), "axes": np.array([2], np.int64), "raxes": np.array([1], np.int64)}
    m = make_model(nodes, [("x", [1, 8, 8, 4]), ("y", [1, 8, 8, 4])], [("out", [1, 8, 12, 1])], inits, opset=18)
    src = save(m, tmp_path / "tf.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False))
    got = onnx.load(out)
    assert "Transpose" not in op_types(got), op_types(got)
    for rule in ("transpose-below-concat", "transpose-below-pad", "transpose-below-slice",
                 "transpose-below-reducesum", "transpose-cancel"):
        assert r.fired.get(rule) == 1, r.fired
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((1, 8, 8, 4)).astype(np.float32) for k in ("x", "y")}
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-5, atol=1e-5)


def test_transposes_move_through_batchnorm_resize_split_and_cancel(tmp_path):
    """TensorFlow-style: NHWC input to NCHW, BatchNormalization on channels, Resize by scales, Split on
    channels, each half back to NHWC. The BatchNorm becomes x·k + c along the last axis, the Resize gets its
    scales in NHWC order, the Split its axis: no Transpose is left, outputs equal."""
    rng = np.random.default_rng(0)
    nodes = [
        oh.make_node("Transpose", ["x"], ["a"], perm=[0, 3, 1, 2]),
        oh.make_node("BatchNormalization", ["a", "s", "b", "mean", "var"], ["n"], epsilon=1e-3),
        oh.make_node("Resize", ["n", "", "scales"], ["r"], mode="linear"),
        oh.make_node("Split", ["r", "sizes"], ["h0", "h1"], axis=1),
        oh.make_node("Transpose", ["h0"], ["y0"], perm=[0, 2, 3, 1]),
        oh.make_node("Transpose", ["h1"], ["y1"], perm=[0, 2, 3, 1]),
    ]
    inits = {"s": rng.uniform(0.5, 2, 4).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
             "mean": rng.standard_normal(4).astype(np.float32), "var": rng.uniform(0.5, 2, 4).astype(np.float32),
             "scales": np.array([1, 1, 2, 2], np.float32), "sizes": np.array([1, 3], np.int64)}
    m = make_model(nodes, [("x", [1, 6, 6, 4])], [("y0", [1, 12, 12, 1]), ("y1", [1, 12, 12, 3])], inits)
    src = save(m, tmp_path / "tf.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False))
    got = onnx.load(out)
    assert "Transpose" not in op_types(got), op_types(got)
    for rule in ("transpose-below-batchnorm-affine", "transpose-below-resize", "transpose-below-split"):
        assert r.fired.get(rule) == 1, r.fired
    assert r.fired.get("transpose-cancel") == 2
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    for have, want in zip(ort_run(got, {"x": x}), ort_run(onnx.load(src), {"x": x}), strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)


def test_pad_channels_is_exact_and_opt_in(tmp_path):
    """Conv(3->6) -> Relu -> Conv(6->16): with --pad-channels the middle channels become 8 (zero filters, zero
    weights in the next Conv); outputs equal. Without the flag nothing is padded."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((6, 3, 3, 3)).astype(np.float32),
             "b1": rng.standard_normal(6).astype(np.float32),
             "w2": rng.standard_normal((16, 6, 3, 3)).astype(np.float32)}
    nodes = [oh.make_node("Conv", ["x", "w1", "b1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["a"], ["r"], name="relu"),
             oh.make_node("Conv", ["r", "w2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    src = save(make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 16, 16, 16])], inits), tmp_path / "p.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False, pad_channels=True))
    assert r.fired["pad-channels-conv-relu-conv"] == 1
    got = onnx.load(out)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in got.graph.initializer}
    convs = [n for n in got.graph.node if n.op_type in ("Conv", "FusedConv")]
    assert weights[convs[0].input[1]].shape == (8, 3, 3, 3) and weights[convs[1].input[1]].shape == (16, 8, 3, 3)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(onnx.load(src), {"x": x})[0], rtol=1e-5, atol=1e-4)
    r2 = optimize(src, str(tmp_path / "out2.onnx"), OptimizeOptions(measure=False))
    assert not any(k.startswith("pad-channels") for k in r2.fired)
