"""--ray's errors that need no cluster: Ray not installed, --ray with --jobs."""

from __future__ import annotations

import os
import sys

from conftest import MODELS

CNN = os.path.join(MODELS, "cnn_small.onnx")


def test_ray_not_installed_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, out, err = cli("optimize", CNN, str(tmp_path / "out"), "--ray", "auto")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == ["onnxfuse: error: --ray needs Ray, which is not installed "
                                        "(hint: pip install 'onnxfuse[ray]')"]
    assert not os.path.exists(tmp_path / "out")


def test_ray_and_jobs_together_is_one_line(cli, tmp_path):
    code, out, err = cli("optimize", CNN, CNN, str(tmp_path / "out"), "--ray", "auto", "--jobs", "2")
    assert code == 1 and out == ""
    assert err.strip().splitlines()[0].startswith("onnxfuse: error: --jobs and --ray are two ways of running a "
                                                  "batch: give one")
    assert not os.path.exists(tmp_path / "out")
