"""Timing sessions: one onnxruntime session per model at ORT_ENABLE_ALL (as deployed), and the A/A control, a
second session of one of them, whose difference from its twin is the noise floor (verdicts.py)."""

from __future__ import annotations

from collections.abc import Callable

from ..validate.runtime import make_session

__all__ = ["Source", "timing_sessions"]

Source = str | bytes  # a model file's path, or its bytes


def timing_sessions(sources: dict[str, Source], provider: str, threads: int,
                    control: tuple[str, str] | list[tuple[str, str]] | None = None,
                    wrap: Callable[[object], object] | None = None, reverse: bool = False) -> dict[str, object]:
    """Sessions of `sources` (label -> model) in their order; `control` = (label, twin), or several: a second session
    of that label's model under the twin's label, made after the sources (A B B2 A2). `reverse` makes them in the
    opposite order (in_generations); the mapping keeps the first. `wrap` wraps each session (e.g. Filtered)."""
    controls = [control] if isinstance(control, tuple) else list(control or [])
    todo = list(sources.items()) + [(twin, sources[label]) for label, twin in controls]
    made = {}
    for label, src in (todo[::-1] if reverse else todo):
        s = make_session(src, "all", provider, threads)
        made[label] = wrap(s) if wrap else s
    return {label: made[label] for label, _ in todo}
