"""The measuring budget's clock. Where decisions are read on this thread's CPU time (clock.py), the budget is
counted in it too: on a loaded machine the same budget buys the same runs, sessions and rebuilds as on a quiet
one, so what is timed, and so kept, does not follow the load (on wall time a PicoDet detector's capture read as
186 s loaded, 1.0 s quiet, and nothing was kept). Wall time then runs longer, up to WALL_CAP times the budget.
With several threads or on a device, the budget is wall time, as the estimator is."""

from __future__ import annotations

import time
from collections.abc import Callable

from .clock import CPU

__all__ = ["WALL_CAP", "budget_clock"]

# wall seconds per budget second at most: on the 2-core machine every onnxfuse check runs on, two onnxruntime
# processes timing other models beside optimize (load average 3) stretched its CPU-time budget 1.5-1.7x in wall
# time; a 3x cap leaves that load alone and bounds a pathological one
WALL_CAP = 3.0


def budget_clock(estimator: str) -> Callable[[], float]:
    """A monotonic clock (seconds from now) for the budget of timings read on `estimator`: this thread's CPU
    time, or wall time divided by WALL_CAP where that is larger; wall time for any other estimator."""
    w0 = time.perf_counter()
    if estimator != CPU:
        return lambda: time.perf_counter() - w0
    c0 = time.thread_time()
    return lambda: max(time.thread_time() - c0, (time.perf_counter() - w0) / WALL_CAP)
