"""The forkserver of a batch dies with the command that started it. Imported only by that forkserver (batch.py
preloads it there), never by the command or a worker.

A forkserver exits on its own once the command's end of its `alive` pipe closes, and its workers get their
PR_SET_PDEATHSIG when it does: that leaves the workers' fate to the forkserver's exit (a Python interpreter
with onnxruntime loaded, shutting down on a loaded machine) and to every holder of that pipe. The kernel now
kills it (SIGKILL) the moment its parent dies, whatever it is doing, even stopped; its workers then die as
before. tests/test_signals.py stops the forkserver and kills the command: without this, nothing dies."""

from __future__ import annotations

import os
import signal

from .batch import COMMAND_PID_ENV, die_with_parent

__all__: list[str] = []


def _guard() -> None:
    command = os.environ.get(COMMAND_PID_ENV, "")
    if not command.isdigit() or not die_with_parent(signal.SIGKILL):
        return
    if os.getppid() != int(command):  # the command died before the line above took effect
        os._exit(128 + signal.SIGKILL)


_guard()
