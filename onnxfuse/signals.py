"""Stopping a command: SIGINT (Ctrl-C) and SIGTERM (`kill`, a service manager, a CI timeout) unwind the same way.

Python turns SIGINT into KeyboardInterrupt; under `handled()` SIGTERM raises `Terminated`, a KeyboardInterrupt,
where the program is, so it runs through every `finally` and cleanup Ctrl-C runs (the atomic writer's temporary
files beside OUT, the pipeline's temporary folders) and the CLI answers both with one line: exit code 130 for
SIGINT, 143 (128 + SIGTERM) for SIGTERM. Typer turns a KeyboardInterrupt into the exit code 130 and drops the
exception, so which signal it was is remembered here (`exit_code()`, `message()`). A second SIGTERM while the first
unwinds is ignored: it must not cut the cleanup short (`kill` to a process group, then to the command again).

Standard library only: the entry point (cli/entry.py) installs this before onnx, onnxruntime and numpy load."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Terminated", "exit_code", "handled", "message", "word"]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (under `handled()`)."""


_state = {"terminated": False}


def _on_sigterm(signum, frame) -> None:
    if _state["terminated"]:  # a second SIGTERM (`kill` to the process group, then to us) must not cut the
        return  # cleanup the first one started short
    _state["terminated"] = True
    raise Terminated()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """For the `with` body, SIGTERM raises Terminated (unless SIGTERM is ignored: a caller's SIG_IGN is kept);
    the previous handler is back afterwards. Only the main thread can set handlers: elsewhere this does nothing."""
    _state["terminated"] = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
                previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        if previous is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, previous)


def exit_code(exc: BaseException | None = None) -> int:
    """143 when the command was stopped by SIGTERM, else 130 (Ctrl-C); called once the interrupt is handled.

    CPython (3.11) remembers a KeyboardInterrupt that went through an `exec()` of a string (dataclasses and
    namedtuples create their methods so, while a module imports) and at exit kills the process with SIGINT
    instead of using its exit code (the caller would see -2, not 130). Any `exec()` that completes forgets it."""
    exec("")  # an empty program: clears that flag, runs nothing
    terminated = isinstance(exc, Terminated) or _state["terminated"]
    return 128 + int(signal.SIGTERM) if terminated else 130


def word(exc: BaseException | None = None) -> str:
    """`terminated` (SIGTERM) or `interrupted` (Ctrl-C), for the one line the CLI prints."""
    return "terminated" if exit_code(exc) != 130 else "interrupted"


def message(exc: BaseException | None = None) -> str:
    """The one line for a command stopped before it wrote anything."""
    return f"onnxfuse: {word(exc)}; nothing written"
