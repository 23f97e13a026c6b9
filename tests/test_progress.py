"""Progress on long work: phases reach the callback in order (with the measuring budget); the CLI shows them on
a terminal's stderr only, never in a pipe and never with --json."""

from __future__ import annotations

import io
import os
import sys

from conftest import MODELS

import onnxfuse
from onnxfuse.progress import status_line

CNN = os.path.join(MODELS, "cnn_small.onnx")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_optimize_calls_progress_at_each_phase_in_order(tmp_path):
    seen = []
    onnxfuse.optimize(CNN, tmp_path / "o.onnx", onnxfuse.OptimizeOptions(measure_budget_s=0.5, cache=False),
                      progress=lambda phase, budget_s=None: seen.append((phase, budget_s)))
    top = [p for p, _ in seen if ":" not in p]
    assert top == ["patterns", "load", "rewrite", "validate", "measure", "write"]
    inside = [(p, b) for p, b in seen if p.startswith("measure: ")]
    assert inside and all(b == 0.5 for _, b in inside)  # the measuring budget travels with its steps
    first, last = seen.index(("measure", 0.5)), seen.index(("write", None))
    assert all(first < seen.index(x) < last for x in inside)


def test_profile_calls_progress_in_order():
    seen = []
    onnxfuse.profile(CNN, runs=2, progress=lambda phase, budget_s=None: seen.append(phase))
    assert seen == ["finding inputs", "profiled runs", "what onnxfuse knows"]


def test_status_line_shows_phases_on_a_terminal_only():
    tty = _Terminal()
    with status_line(stream=tty) as show:
        show("measure: time regions", 8)
    assert "measuring: time regions (budget 8 s)" in tty.getvalue()
    for stream, enabled in ((io.StringIO(), True), (_Terminal(), False)):  # a pipe; --json
        with status_line(enabled, stream=stream) as show:
            show("validate")
        assert stream.getvalue() == ""


def test_cli_progress_on_a_terminal_not_in_a_pipe_nor_with_json(cli, tmp_path, monkeypatch):
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "a.onnx")  # stderr captured: not a terminal
    assert code == 0 and stderr == ""
    code, _, stderr = cli("bench", CNN, "--budget", "0.2", "--runs", "3")
    assert code == 0 and stderr == ""
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    code, _, _ = cli("optimize", CNN, tmp_path / "b.onnx")
    shown = tty.getvalue()  # rich redraws a few times a second: some of the phases, whichever were current
    assert code == 0 and any(w in shown for w in ("loading patterns", "loading the model", "rewriting",
                                                 "validating against the original", "writing"))
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    code, stdout, _ = cli("optimize", CNN, tmp_path / "c.onnx", "--json")
    assert code == 0 and stdout.startswith("{") and tty.getvalue() == ""
    code, stdout, _ = cli("bench", CNN, "--budget", "0.2", "--runs", "3", "--json")
    assert code == 0 and stdout.startswith("{") and tty.getvalue() == ""
