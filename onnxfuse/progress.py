"""Progress on long work: the phase a command is in (and its measuring budget, where it has one) as one
transient status line on stderr, shown only when stderr is a terminal; nothing in a pipe, a log or `--json`.

The pipeline knows nothing of terminals: `optimize(..., progress=)`, `profile(..., progress=)` and
`bench(..., progress=)` call a plain callback at their phase boundaries, and the CLI passes `status_line()`'s."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = ["Phase", "counts_bar", "quiet", "status_line"]

Phase = Callable[..., None]
"""`progress(phase, budget_s=None)`: `phase` names the step starting now (optimize's are its `timings_s` keys:
patterns, load, rewrite, validate, measure (with `measure: <step>` inside it), write); `budget_s` the seconds it
may take, where it has a budget."""

_WORDS = {"patterns": "loading patterns", "load": "loading the model", "rewrite": "rewriting",
          "validate": "validating against the original", "measure": "measuring", "write": "writing"}


def quiet(phase: str, budget_s: float | None = None) -> None:
    """The callback that shows nothing."""


def describe(phase: str, budget_s: float | None = None) -> str:
    """`measuring: time regions (budget 8 s)`: the words a phase shows as."""
    head, _, rest = phase.partition(": ")
    text = _WORDS.get(head, head) + (f": {rest}" if rest else "")
    return text + (f" (budget {budget_s:.3g} s)" if budget_s else "")


def counts_bar(done: int, failed: int, running: int, queued: int, width: int = 20) -> str:
    """`[######--------------] 6/20: 5 done, 1 failed, 2 running, 12 queued`: a batch's state in one line."""
    total = done + failed + running + queued
    filled = round(width * (done + failed) / total) if total else width
    return (f"[{'#' * filled}{'-' * (width - filled)}] {done + failed}/{total}: {done} done, {failed} failed, "
            f"{running} running, {queued} queued")


@contextlib.contextmanager
def status_line(enabled: bool = True, stream: TextIO | None = None) -> Iterator[Phase]:
    """A callback that shows each phase on a transient rich status line on `stream` (stderr), erased when the
    block ends; `quiet` when not `enabled` (--json) or when the stream is not a terminal."""
    stream = stream if stream is not None else sys.stderr
    if not enabled or not stream.isatty():
        yield quiet
        return
    from rich.console import Console

    with Console(file=stream, highlight=False).status("starting", spinner="dots") as status:
        def show(phase: str, budget_s: float | None = None) -> None:
            status.update(describe(phase, budget_s))

        yield show
