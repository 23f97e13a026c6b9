"""Embedded weights loaded lazily: references into the model file itself, written back embedded, the same bytes
as an eager load writes, and nothing left beside the model."""

import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, ort_run

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.load import lazy as LZ
from onnxfuse.load import loader as L


def _model(path, width=1024):
    """MatMul -> erf-Gelu written out -> MatMul, with 2 x width^2 float32 weights (8 MB at 1024)."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((width, width)).astype(np.float32) * 0.03,
             "w2": rng.standard_normal((width, width)).astype(np.float32) * 0.03,
             "sqrt2": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["m"]), oh.make_node("Div", ["m", "sqrt2"], ["d"]),
             oh.make_node("Erf", ["d"], ["e"]), oh.make_node("Add", ["e", "one"], ["a"]),
             oh.make_node("Mul", ["m", "a"], ["p"]), oh.make_node("Mul", ["p", "half"], ["g"]),
             oh.make_node("MatMul", ["g", "w2"], ["y"])]
    onnx.save(make_model(nodes, [("x", ["batch", width])], [("y", ["batch", width])], inits), path)
    return path


def test_large_embedded_weights_are_references_into_the_file(tmp_path):
    path = _model(str(tmp_path / "m.onnx"))
    model, info = L.load_model(path)
    assert info.lazy and not info.external_data
    w1 = model.graph.initializer("w1")
    assert w1.data_location == onnx.TensorProto.EXTERNAL and not w1.HasField("raw_data")
    assert dict((e.key, e.value) for e in w1.external_data)["location"] == "m.onnx"
    expected = onnx.numpy_helper.to_array(next(t for t in onnx.load(path).graph.initializer if t.name == "w1"))
    np.testing.assert_array_equal(model.tensor_to_array(w1), expected)
    assert model.graph.initializer("one").HasField("raw_data")  # small ones stay embedded


def test_optimize_writes_the_same_bytes_as_an_eager_load(tmp_path, monkeypatch):
    path = _model(str(tmp_path / "m.onnx"))
    lazy = optimize(path, str(tmp_path / "lazy.onnx"), OptimizeOptions(measure=False))
    assert lazy.fired.get("erf-gelu") == 1
    monkeypatch.setattr(LZ, "LAZY_MIN_BYTES", 1 << 40)
    optimize(path, str(tmp_path / "eager.onnx"), OptimizeOptions(measure=False))
    assert (tmp_path / "lazy.onnx").read_bytes() == (tmp_path / "eager.onnx").read_bytes()
    out = onnx.load(str(tmp_path / "lazy.onnx"))
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in out.graph.initializer)
    x = np.random.default_rng(1).standard_normal((2, 1024)).astype(np.float32)
    np.testing.assert_allclose(ort_run(out, {"x": x})[0], ort_run(onnx.load(path), {"x": x})[0], rtol=1e-4,
                               atol=1e-4)
    assert sorted(os.listdir(tmp_path)) == ["eager.onnx", "lazy.onnx", "m.onnx"]  # no candidate left behind


def test_measured_selection_on_a_lazily_loaded_model(tmp_path, fake_timer):
    fake_timer()  # the sessions are real; timings and clock fake (a busy machine could leave every class undecided)
    path = _model(str(tmp_path / "m.onnx"))
    r = optimize(path, str(tmp_path / "o.onnx"), OptimizeOptions(cache=False, measure_budget_s=5))
    assert r.measure is not None and r.measure.strategy == "regions" and not r.measure.note
    assert any(g.source == "timed" for g in r.measure.groups)
    onnx.checker.check_model(onnx.load(str(tmp_path / "o.onnx")))
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "o.onnx"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_a_read_only_folder_loads_eagerly(tmp_path):
    path = _model(str(tmp_path / "m.onnx"))
    os.chmod(tmp_path, 0o555)
    try:
        _, info = L.load_model(path)
        assert not info.lazy
    finally:
        os.chmod(tmp_path, 0o755)


def test_a_candidate_of_an_external_data_model_in_a_read_only_folder_loads(tmp_path, monkeypatch):
    """The data file is hard-linked (or copied) beside a candidate written elsewhere: onnxruntime refuses
    symbolic links that resolve outside the model's folder."""
    from onnxfuse.validate import runtime

    src = onnx.load(_model(str(tmp_path / "m.onnx"), width=64))
    onnx.save(src, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=1024)
    model, info = L.load_model(str(tmp_path / "ext.onnx"))
    assert info.external_data
    real_access = os.access
    monkeypatch.setattr(runtime.os, "access", lambda p, m: False if str(p) == str(tmp_path) else real_access(p, m))
    cand = runtime.Candidate(model.export(), info)
    try:
        assert not str(cand.source).startswith(str(tmp_path))
        x = np.ones((1, 64), np.float32)
        got = runtime.make_session(cand.source).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ort_run(str(tmp_path / "m.onnx"), {"x": x})[0], rtol=1e-5, atol=1e-5)
    finally:
        cand.close()
