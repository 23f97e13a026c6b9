"""Loader and writer: external data, path traversal, truncation, atomic writes, round trips."""

import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import MODELS, make_model, ort_run

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.errors import ModelError
from onnxfuse.load.loader import load_model


def _external_model(tmp_path):
    """Conv + BN + Relu with big weights in an external data file."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((32, 16, 3, 3)).astype(np.float32),
             "scale": rng.uniform(0.5, 1.5, 32).astype(np.float32), "bias": rng.standard_normal(32).astype(np.float32),
             "mean": rng.standard_normal(32).astype(np.float32), "var": rng.uniform(0.5, 1.5, 32).astype(np.float32)}
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             oh.make_node("Relu", ["b"], ["y"], name="relu")]
    m = make_model(nodes, [("x", [1, 16, 8, 8])], [("y", [1, 32, 8, 8])], inits, opset=13)
    d = tmp_path / "src"
    d.mkdir()
    path = d / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    return path


def test_external_data_stays_external(tmp_path):
    src = _external_model(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "opt.onnx"
    r = optimize(str(src), str(out), OptimizeOptions(measure=False))
    assert r.fired == {"conv-bn-fold": 1, "conv-relu": 1}
    assert sorted(os.listdir(out_dir)) == ["opt.onnx", "opt.onnx.data"]
    proto = onnx.load(str(out), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    assert os.path.getsize(out) < 10_000  # the weights are not inline
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(ort_run(out, {"x": x})[0], ort_run(src, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_missing_external_file(tmp_path):
    src = _external_model(tmp_path)
    os.unlink(src.parent / "ext.data")
    with pytest.raises(ModelError, match="external data file 'ext.data' .* is missing"):
        load_model(str(src))


def test_truncated_external_file(tmp_path):
    src = _external_model(tmp_path)
    data = src.parent / "ext.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match="is truncated"):
        load_model(str(src))


def test_external_location_outside_folder_refused(tmp_path):
    src = _external_model(tmp_path)
    proto = onnx.load(str(src), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    bad = src.parent / "evil.onnx"
    bad.write_bytes(proto.SerializeToString())
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_model(str(bad))


def test_failed_write_leaves_nothing(tmp_path):
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    out_dir.chmod(0o500)
    try:
        if os.access(out_dir, os.W_OK):  # running as root: permissions do not bind
            pytest.skip("cannot make a folder unwritable as root")
        with pytest.raises(ModelError, match="not writable"):
            optimize(os.path.join(MODELS, "cnn_small.onnx"), str(out_dir / "o.onnx"), OptimizeOptions(measure=False))
    finally:
        out_dir.chmod(0o700)
    assert os.listdir(out_dir) == []


def test_interrupt_leaves_no_partial_file(tmp_path, monkeypatch):
    """Ctrl-C while writing: the temporary file is removed, the target never appears."""
    import onnxfuse.load.write as W

    real = W._externalize

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(W, "_externalize", boom)
    src = _external_model(tmp_path)
    out = tmp_path / "o.onnx"
    with pytest.raises(KeyboardInterrupt):
        optimize(str(src), str(out), OptimizeOptions(measure=False))
    monkeypatch.setattr(W, "_externalize", real)
    assert not out.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".onnxfuse-")] == []


def test_cycle_and_dangling_inputs_rejected(tmp_path):
    m = make_model([oh.make_node("Relu", ["nowhere"], ["y"], name="r")], [("x", [2])], [("y", [2])])
    p = tmp_path / "dangling.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="invalid model|nothing produces"):
        load_model(str(p))


def test_opset_newer_than_onnx(tmp_path):
    m = make_model([oh.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    p = tmp_path / "future.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="newer than the installed onnx"):
        load_model(str(p))


def test_roundtrip_is_byte_identical_when_nothing_fires(tmp_path):
    src = os.path.join(MODELS, "cnn_small.onnx")
    out = tmp_path / "same.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False, only=["erf-gelu"]))
    assert r.applications == []
    assert out.read_bytes() == open(src, "rb").read()
