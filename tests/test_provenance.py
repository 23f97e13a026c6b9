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


def test_initializers_as_inputs_through_the_measured_path(tmp_path):
    """IR >= 4 with every initializer also a graph input: overridable defaults. The measured path captures region
    inputs from a run that does not feed them (it once looked them up among the fed values: KeyError)."""
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


def test_default_domain_spelled_ai_onnx(tmp_path):
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
    assert "com.microsoft.FusedConv" in op_types(tmp_path / "o.onnx")
    _same_outputs(src, str(tmp_path / "o.onnx"), _cnn_feeds(m))


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
