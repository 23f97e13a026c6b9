"""The measuring budget's clock. Where decisions are read on this thread's CPU time (clock.py: one intra-op thread
on the CPU, where onnxruntime runs every kernel on the calling thread), the budget is counted in that CPU time
too: on a loaded machine the same seconds of budget buy the same runs, sessions and rebuilds as on a quiet one,
so what is timed, and so what is kept, does not follow the load. Wall time then runs longer than the budget by
the load, up to WALL_CAP times it: past that the wall clock counts (a machine so busy that the budget would
take hours). With several threads or on a device, the budget is wall time, as the estimator is.

Measured (benchmarks/selection_stability.py): the budget planner on wall time read a PicoDet detector's capture
as 186 s under load (1.0 s quiet) and kept nothing; on this clock the plan is the same quiet and loaded.
"""

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
