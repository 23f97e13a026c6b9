"""Every model style of the corpus (models/make_style_models.py: IR 3-10, opsets 7-23, initializers as inputs,
external data, local functions, If/Loop/Scan, QDQ/QOperator/dynamic int8, float16/bfloat16 inside, models
onnxruntime or its transformers optimizer wrote, 'ai.onnx' spelled out, unnamed dims, a silero-v5-like puzzle,
tf2onnx conversions) through the default pipeline, measured selection included: no internal error, no
refusal, validation passed, the output written and equal to the original on the validation inputs."""

import glob
import os

import numpy as np
import onnxruntime as ort
import pytest
from conftest import MODELS

from onnxfuse import ModelError, OptimizeOptions, optimize

STYLES = sorted(glob.glob(os.path.join(MODELS, "styles", "*.onnx")) + glob.glob(os.path.join(MODELS, "styles_tf",
                                                                                             "*.onnx")))


def _run(path: str, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _nchwc_runs_here(path: str) -> bool:
    """Whether onnxruntime runs this saved NCHWc model on this CPU (its inputs are static)."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in sess.get_inputs()}
    try:
        sess.run(None, feeds)
        return True
    except Exception:  # noqa: BLE001 - onnxruntime's own error types
        return False


def test_the_corpus_is_there():
    assert len(STYLES) >= 45


@pytest.mark.parametrize("path", STYLES, ids=[os.path.basename(p)[:-5] for p in STYLES])
def test_style_through_the_default_pipeline(path, tmp_path):
    out = tmp_path / "out.onnx"
    if "nchwc" in os.path.basename(path) and not _nchwc_runs_here(path):
        # onnxruntime's NCHWc ops are laid out for the vector width of the CPU that saved them (16 floats on
        # AVX-512): on another CPU onnxruntime cannot run the model, and onnxfuse says why in one line
        with pytest.raises(ModelError, match="laid out for another CPU's vector width"):
            optimize(path, out, OptimizeOptions(measure_budget_s=1.0))
        assert not out.exists()
        return
    r = optimize(path, out, OptimizeOptions(measure_budget_s=1.0))  # any other exception is an internal error
    assert r.validation.startswith(("passed", "not needed")), r.validation
    assert out.exists()
    if r.inputs is None:  # nothing was rewritten or repaired: nothing ran
        return
    tol = r.checks[0].tolerance if r.checks else None
    for a, b in zip(_run(path, r.inputs.feeds), _run(str(out), r.inputs.feeds), strict=True):
        if a.dtype.kind == "f" and tol is not None:
            assert np.all(np.abs(a - b) <= tol.atol + tol.rtol * np.abs(a)), os.path.basename(path)
        elif a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_array_equal(a, b)
