"""What a timing measures: the estimator. With one intra-op thread onnxruntime runs every kernel on the calling
thread, so that thread's CPU time is the work a rewrite changed, without the time other processes took the core
(loaded, a BERT-tiny A/A pair spread 0.74-1.27 in wall time, 0.92-1.08 in CPU time: docs/measured-selection.md,
"The estimator"). With several threads, or on a device, wall time is the truth. `bench`'s latencies are wall
time always; its verdict, like optimize's decisions, uses the estimator."""

from __future__ import annotations

import time

from ..targets import get

__all__ = ["CPU", "WALL", "describe", "estimator_for", "now"]

CPU = "cpu"  # the calling thread's CPU time
WALL = "wall"  # elapsed time
_NAMES = {CPU: "thread CPU time", WALL: "wall time"}


def estimator_for(provider: str, threads: int) -> str:
    """CPU when onnxruntime runs on the CPU on the calling thread alone (one intra-op thread on a target that
    runs its kernels there: Target.calling_thread), else WALL."""
    return CPU if get(provider).calling_thread and threads == 1 else WALL


def describe(estimator: str) -> str:
    return _NAMES.get(estimator, estimator)


def now() -> tuple[float, float]:
    """(wall, this thread's CPU) seconds."""
    return time.perf_counter(), time.thread_time()
