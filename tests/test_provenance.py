"""Models of other provenance through the default (measured) path: initializers listed as graph inputs (ONNX Model
Zoo style), the default domain spelled 'ai.onnx', LayerNormalization in the ONNX domain below opset 17 (what
onnxruntime's own transformers optimizer writes). Each must optimize with equal outputs: no internal error, no
refusal."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import MODELS, op_types, ort_run, save
from onnx import TensorProto
from onnx import numpy_helper as nh

from onnxfuse import OptimizeOptions, optimize

RNG = np.random.default_rng(0)
H = 32


def _cnn() -> onnx.ModelProto:
    return onnx.load(f"{MODELS}/cnn_small.onnx")


def _same_outputs(src: str, out: str, feeds: dict) -> None:
    for a, b in zip(ort_run(onnx.load(src), feeds), ort_run(onnx.load(out), feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _cnn_feeds(m: onnx.ModelProto) -> dict:
    inits = {t.name for t in m.graph.initializer}
    x = next(i for i in m.graph.input if i.name not in inits)
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]
    return {x.name: RNG.standard_normal(shape).astype(np.float32)}


def test_initializers_as_inputs_through_the_measured_path(tmp_path, fake_timer):
    """IR >= 4 with every initializer also a graph input: overridable defaults. The measured path captures region
    inputs from a run that does not feed them (it once looked them up among the fed values: KeyError). The clock
    is fake: on a busy machine the budget's plan could skip capture ("not measured"), and nothing would be found."""
    fake_timer()
    m = _cnn()
    for t in m.graph.initializer:
        m.graph.input.append(oh.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    src = save(m, tmp_path / "zoo.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure_budget_s=2.0))
    assert r.validation.startswith("passed")
    assert r.measure is not None and r.measure.groups
    assert any("also graph inputs" in n for n in r.load_notes)
    out = onnx.load(str(tmp_path / "o.onnx"))
    assert {i.name for i in out.graph.input} >= {t.name for t in m.graph.initializer}  # still overridable
    _same_outputs(src, str(tmp_path / "o.onnx"), _cnn_feeds(m))


def test_default_domain_spelled_ai_onnx(tmp_path, fake_timer):
    fake_timer(0.8, 0.9)  # regions and selection faster: what is kept does not depend on the machine's load
    m = _cnn()
    for o in m.opset_import:
        if o.domain == "":
            o.domain = "ai.onnx"
    for n in m.graph.node:
        n.domain = "ai.onnx"
    src = save(m, tmp_path / "spelled.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure_budget_s=2.0))
    assert r.validation.startswith("passed")
    assert any("'ai.onnx'" in d for d in r.repairs)
    # conv-bn-fold is exact arithmetic, but not an exact rewrite to measured selection: it makes a Conv, and the
    # fusion that reads it (conv-relu, conv-hardswish) joins its region, timed; kept here as those are (fake timer)
    assert r.fired.get("conv-bn-fold", 0) >= 1 and r.measure.confirmed == "timed"
    assert all(g.kept for g in r.measure.groups if "conv-bn-fold" in g.rules)
    _same_outputs(src, str(tmp_path / "o.onnx"), _cnn_feeds(m))
    # the rules match the normalized nodes (FusedConv is timed when measured, so unmeasured here)
    optimize(src, tmp_path / "u.onnx", OptimizeOptions(measure=False))
    assert "com.microsoft.FusedConv" in op_types(tmp_path / "u.onnx")


def _skip_ln(opset: int) -> onnx.ModelProto:
    nodes = [oh.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), oh.make_node("Add", ["mm", "b"], ["ab"], name="ab"),
             oh.make_node("Add", ["ab", "x"], ["s"], name="res"),
             oh.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], name="ln", axis=-1, epsilon=1e-5)]
    inits = [nh.from_array(RNG.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (H, H)), ("b", (H,)), ("g", (H,)), ("beta", (H,)))]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", H])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H])], inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [13, 16])
def test_layernormalization_below_opset_17_is_a_layernormalization(tmp_path, opset):
    """onnxruntime registers LayerNormalization in the ONNX domain before ONNX did (opset 17); onnx.checker has no
    schema there. The node is accepted, matched as the op it is, and the output validated by onnxruntime."""
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(_skip_ln(opset))
    src = save(_skip_ln(opset), tmp_path / "ln.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False))
    assert r.validation == "passed"
    assert op_types(tmp_path / "o.onnx") == ["MatMul", "com.microsoft.SkipLayerNormalization"]
    _same_outputs(src, str(tmp_path / "o.onnx"), {"x": RNG.standard_normal((2, 5, H)).astype(np.float32)})


def test_layernormalization_below_opset_17_carried_through_untouched(tmp_path):
    """A lone LayerNormalization at opset 16 next to a fusion elsewhere: written back as it was."""
    m = _cnn()
    ln_in = m.graph.output[0].name
    m.graph.output[0].name = "ln_out"
    n = m.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    m.graph.initializer.extend([nh.from_array(np.ones(n, np.float32), "ln_g")])
    m.graph.node.append(oh.make_node("LayerNormalization", [ln_in, "ln_g"], ["ln_out"], name="ln"))
    del m.opset_import[:]
    m.opset_import.extend([oh.make_opsetid("", 16)])
    src = save(m, tmp_path / "ln16.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False))
    assert r.validation == "passed"
    out = onnx.load(str(tmp_path / "o.onnx"))
    assert [x for x in out.graph.node if x.op_type == "LayerNormalization"][0].domain == ""
    _same_outputs(src, str(tmp_path / "o.onnx"), _cnn_feeds(m))


def _encoder(layers: int = 2, h: int = 64) -> onnx.ModelProto:
    """Layers of MatMul + bias + residual + LayerNormalization (and a Relu), big enough for quantize_dynamic."""
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        p = f"l{i}_"
        nodes += [oh.make_node("MatMul", [x, p + "w"], [p + "mm"], name=p + "mm"),
                  oh.make_node("Add", [p + "mm", p + "b"], [p + "ab"], name=p + "ab"),
                  oh.make_node("Relu", [p + "ab"], [p + "r"], name=p + "relu"),
                  oh.make_node("Add", [p + "r", x], [p + "s"], name=p + "res"),
                  oh.make_node("LayerNormalization", [p + "s", p + "g", p + "beta"], [p + "y"], name=p + "ln",
                               axis=-1, epsilon=1e-5)]
        inits += [nh.from_array((RNG.standard_normal((h, h)) / 8).astype(np.float32), p + "w"),
                  nh.from_array(RNG.standard_normal(h).astype(np.float32), p + "b"),
                  nh.from_array(np.ones(h, np.float32), p + "g"), nh.from_array(np.zeros(h, np.float32), p + "beta")]
        x = p + "y"
    nodes.append(oh.make_node("Identity", [x], ["y"], name="out"))
    g = oh.make_graph(nodes, "enc", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", h])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", h])], inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _quantized(tmp_path) -> str:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    save(_encoder(), tmp_path / "enc.onnx")
    quantize_dynamic(str(tmp_path / "enc.onnx"), str(tmp_path / "enc_dq.onnx"), weight_type=QuantType.QInt8)
    return str(tmp_path / "enc_dq.onnx")


def test_dynamic_quantization_tolerance_from_the_model(tmp_path, fake_timer):
    """quantize_dynamic's graph: a reordered float32 sum before DynamicQuantizeLinear moves values by a whole step.
    The tolerance is measured on the original (jittered quantizer inputs), stated, and the output is written.
    Fake timings: the output checked on other inputs below is the same selection every run."""
    fake_timer()
    src = _quantized(tmp_path)
    assert "DynamicQuantizeLinear" in op_types(src)
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure_budget_s=2.0, shapes=["s=128"]))
    assert r.validation.startswith("passed") and "quantizes at run time" in r.validation
    tol = r.checks[0].tolerance.rtol
    assert 1e-4 < tol < 0.2  # at 2x128 tokens the original's own quantization moves outputs by more than 1e-4
    x = RNG.standard_normal((2, 7, 64)).astype(np.float32)
    (a,), (b,) = ort_run(onnx.load(src), {"x": x}), ort_run(onnx.load(str(tmp_path / "o.onnx")), {"x": x})
    assert float((np.abs(a - b) / (1 + np.abs(a))).max()) <= tol


USER_WRONG = """rules:
- id: relu-is-sigmoid
  doc: A wrong rewrite, which validation must catch even with a quantized graph's tolerance.
  match:
    Y: Relu(X)
  rewrite:
    Y: Sigmoid(X)
"""


def test_dynamic_quantization_tolerance_still_catches_a_wrong_rewrite(tmp_path):
    src = _quantized(tmp_path)
    rules = tmp_path / "wrong.yaml"
    rules.write_text(USER_WRONG)
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False, patterns=[str(rules)]))
    assert "relu-is-sigmoid" in {b.rule for b in r.rolled_back}
    assert "Sigmoid" not in op_types(tmp_path / "o.onnx")


def test_float16_inside_tolerance(tmp_path):
    """float16 inside, float32 at the edges (convert_float_to_float16(keep_io_types=True)): the float16 tolerance,
    stated, and the skip norms fuse."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = save(convert_float_to_float16(_encoder(), keep_io_types=True), tmp_path / "enc16.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False))
    assert r.validation.startswith("passed") and "computes in float16 inside" in r.validation
    assert r.checks[0].tolerance.rtol == 1e-2
    assert "com.microsoft.SkipLayerNormalization" in op_types(tmp_path / "o.onnx")


def _silero_like() -> onnx.ModelProto:
    """silero VAD v5's shape puzzle: `input [?, ?]`, `state [2, ?, 128]`, `sr`; an If on sr runs an LSTM whose
    initial state is sliced from `state`, so state's unnamed dim is tied to input's batch only by the LSTM."""
    hd = 128

    def vi(name, elem, shape):
        v = oh.make_tensor_value_info(name, elem, None)
        for d in shape:
            dim = v.type.tensor_type.shape.dim.add()
            if d is not None:
                dim.dim_value = d
        return v

    def branch(tag):
        w = nh.from_array((RNG.standard_normal((1, 4 * hd, 64)) / 8).astype(np.float32), f"W{tag}")
        r = nh.from_array((RNG.standard_normal((1, 4 * hd, hd)) / 8).astype(np.float32), f"R{tag}")
        p = nh.from_array(RNG.standard_normal((1, 64)).astype(np.float32), f"P{tag}")
        nodes = [oh.make_node("Mul", ["m", f"P{tag}"], [f"f{tag}"]),
                 oh.make_node("Unsqueeze", [f"f{tag}", "ax0"], [f"X{tag}"]),
                 oh.make_node("LSTM", [f"X{tag}", f"W{tag}", f"R{tag}", "", "", "h0", "c0"], ["", f"yh{tag}", f"yc{tag}"],
                              hidden_size=hd),
                 oh.make_node("Concat", [f"yh{tag}", f"yc{tag}"], [f"st{tag}"], axis=0),
                 oh.make_node("Squeeze", [f"yh{tag}", "ax0"], [f"o{tag}"])]
        return oh.make_graph(nodes, f"b{tag}", [], [vi(f"o{tag}", TensorProto.FLOAT, [None, hd]),
                                                    vi(f"st{tag}", TensorProto.FLOAT, [2, None, hd])], [w, r, p])

    nodes = [oh.make_node("ReduceMean", ["input"], ["m"], axes=[1], keepdims=1),
             oh.make_node("Slice", ["state", "s0", "s1", "ax0"], ["h0"]),
             oh.make_node("Slice", ["state", "s1", "s2", "ax0"], ["c0"]),
             oh.make_node("Equal", ["sr", "k16"], ["is16"]),
             oh.make_node("If", ["is16"], ["out", "stateN"], then_branch=branch("a"), else_branch=branch("b"))]
    inits = [nh.from_array(np.array(v, np.int64), k) for k, v in
             (("ax0", [0]), ("s0", [0]), ("s1", [1]), ("s2", [2]), ("k16", 16000))]
    g = oh.make_graph(nodes, "silero_like", [vi("input", TensorProto.FLOAT, [None, None]),
                                             vi("state", TensorProto.FLOAT, [2, None, hd]),
                                             oh.make_tensor_value_info("sr", TensorProto.INT64, [])],
                      [vi("out", TensorProto.FLOAT, [None, hd]), vi("stateN", TensorProto.FLOAT, [2, None, hd])], inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 16)], ir_version=8)


def test_inputs_from_the_runtimes_own_words(tmp_path):
    """Three unnamed free dims; onnxruntime's 'Input initial_h must have shape {1,2,128}. Actual:{1,16,128}' says
    which value the state's dim needs: it is retried at that value, and the model optimizes."""
    from onnxfuse import find_inputs

    src = save(_silero_like(), tmp_path / "vad.onnx")
    plan = find_inputs(src)
    assert plan.feeds["state"].shape[1] == plan.feeds["input"].shape[0]
    assert any("LSTM needs" in c.why for c in plan.dims if c.key == "state[1]")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure_budget_s=2.0))
    assert r.validation.startswith("passed") or r.validation.startswith("not needed")


def test_freeze_weights_makes_listed_initializers_constants(tmp_path):
    """Model Zoo style: weights listed as inputs stay overridable by default (BatchNormalization does not fold);
    freeze_weights drops them from the inputs, the folds and fusions happen, and the outputs are the original's
    with its defaults."""
    m = _cnn()
    for t in m.graph.initializer:
        m.graph.input.append(oh.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    src = save(m, tmp_path / "zoo.onnx")
    plain = optimize(src, tmp_path / "plain.onnx", OptimizeOptions(measure=False))
    frozen = optimize(src, tmp_path / "frozen.onnx", OptimizeOptions(measure=False, freeze_weights=True))
    assert "conv-bn-fold" not in plain.fired and frozen.fired.get("conv-bn-fold", 0) >= 1
    assert any("made constants (freeze_weights)" in n for n in frozen.load_notes)
    out = onnx.load(str(tmp_path / "frozen.onnx"))
    assert [i.name for i in out.graph.input] == [i.name for i in _cnn().graph.input]
    _same_outputs(src, str(tmp_path / "frozen.onnx"), _cnn_feeds(m))
