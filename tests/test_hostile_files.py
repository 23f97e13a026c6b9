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
