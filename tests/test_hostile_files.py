"""Files that are not regular files (a FIFO, /dev/zero) or are too large, where the user names a file: a pattern
file, the decision cache, --inputs. Each is refused (or, the cache, ignored with a warning) before it is read;
a regression would hang or read until memory runs out, so each runs the real CLI in a subprocess with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import MODELS

CNN = os.path.join(MODELS, "cnn_small.onnx")
pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")


def _cli(*args, env=None, timeout=120) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "onnxfuse.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pattern_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = _fifo(tmp_path / "p.yaml") if kind == "fifo" else "/dev/zero"
    what = "a FIFO" if kind == "fifo" else "a character device"
    code, _, stderr = _cli("optimize", CNN, tmp_path / "o.onnx", "--no-measure", "--patterns", path)
    assert code == 1
    assert _one_line(stderr) == (f"onnxfuse: error: {path}: is {what}, not a pattern file (a pattern file must be "
                                 "a regular file)")
    assert not (tmp_path / "o.onnx").exists()


def test_patterns_check_refuses_a_fifo(tmp_path):
    path = _fifo(tmp_path / "p.yaml")
    code, _, stderr = _cli("patterns", "check", path)
    assert code == 1
    assert _one_line(stderr) == f"{path}: is a FIFO, not a pattern file (a pattern file must be a regular file)"


def test_a_pattern_file_over_16_mb_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate((16 << 20) + 1)
    code, _, stderr = _cli("patterns", "check", path)
    assert code == 1
    assert _one_line(stderr) == f"{path}: larger than 16 MB, the most a pattern file may hold (refused)"


def test_a_fifo_as_the_decision_cache_is_ignored_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    fifo = _fifo(cache / "decisions.json")
    env = {"ONNXFUSE_CACHE_DIR": str(cache)}
    warning = (f"onnxfuse: warning: {fifo}: is a FIFO, not a regular file; the decision cache ignores it and leaves "
               "it as it is (`onnxfuse cache clear` removes it)")
    code, _, stderr = _cli("optimize", CNN, tmp_path / "o.onnx", "--measure-budget", "2", env=env)
    assert code == 0, stderr
    assert [line for line in stderr.splitlines() if "warning" in line] == [warning]
    assert (tmp_path / "o.onnx").exists()
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # left as it is
    code, stdout, stderr = _cli("cache", "show", env=env)
    assert code == 0 and _one_line(stderr) == warning
    assert "0 decision(s)" in stdout


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_inputs_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = _fifo(tmp_path / "in.npz") if kind == "fifo" else "/dev/zero"
    what = "a FIFO" if kind == "fifo" else "a character device"
    code, _, stderr = _cli("optimize", CNN, tmp_path / "o.onnx", "--no-measure", "--inputs", path)
    assert code == 1
    assert _one_line(stderr) == (f"onnxfuse: error: {path}: is {what}, not an .npz file (an inputs file must be a "
                                 "regular file)")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_model_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = _fifo(tmp_path / "m.onnx") if kind == "fifo" else "/dev/zero"
    what = "a FIFO" if kind == "fifo" else "a character device"
    code, _, stderr = _cli("optimize", path, tmp_path / "o.onnx", "--no-measure")
    assert code == 1
    assert _one_line(stderr) == (f"onnxfuse: error: {path}: is {what}, not an ONNX model file (a model must be a "
                                 "regular file)")
    assert not (tmp_path / "o.onnx").exists()
