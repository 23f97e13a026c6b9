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


def test_an_address_nothing_answers_is_one_line_at_once(cli, tmp_path):
    import socket

    import pytest

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = cli("optimize", CNN, str(tmp_path / "out"), "--ray", f"127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"onnxfuse: error: --ray 127.0.0.1:{port}: cannot connect to the Ray cluster: nothing answers at "
        f"127.0.0.1:{port} (Connection refused) (hint: `ray status` on the head node shows its address; `auto` "
        "uses a running cluster or starts one here)"]
    assert not os.path.exists(tmp_path / "out")
