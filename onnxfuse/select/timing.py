"""The timing protocol and its statistics: runs of one session, warm-up until timings settle, sessions
interleaved round by round in one process (rotating order), and the paired ratio of two sessions' times with a
seeded bootstrap 95% confidence interval (a given set of timings always gives the same verdict)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["NOISE_PREFIX", "SIGNIFICANT", "judge", "Progress", "Ratio", "paired_ratio", "percentile", "profile_scale", "run_times",
           "time_interleaved", "warm_up"]

Progress = Callable[[str, float], None]  # (what, fraction done)

SIGNIFICANT = 0.005  # a ratio's whole CI must clear 1 -/+ this to count as a change


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        return self.verdict_beyond(0.0)

    def verdict_beyond(self, floor: float) -> str:
        """faster/slower only if the whole CI clears 1 by SIGNIFICANT plus `floor` (an A/A difference)."""
        return judge(self, SIGNIFICANT + floor)

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"


NOISE_PREFIX = "within the noise floor"


def judge(ratio: Ratio, margin: float) -> str:
    """"faster" / "slower" when the whole CI clears 1 by `margin`; a CI that excludes 1 but not by the margin
    is "within the noise floor (±X%)", not "no significant change", which would contradict the CI itself;
    "no significant change" is for a CI that contains 1."""
    if ratio.high < 1 - margin:
        return "faster"
    if ratio.low > 1 + margin:
        return "slower"
    if ratio.high < 1 or ratio.low > 1:
        return f"{NOISE_PREFIX} (±{margin:.1%}): not counted as {'faster' if ratio.high < 1 else 'slower'}"
    return "no significant change"


def paired_ratio(variant: list[float], reference: list[float], seed: int = 0) -> Ratio:
    r = np.asarray(variant, dtype=np.float64) / np.asarray(reference, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(r, size=(1000, r.size), replace=True), axis=1)
    return Ratio(float(np.median(r)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))


def profile_scale(weight: float, reference: list[float], several: bool) -> float:
    """A shape profile's factor in a weighted total of run times: with several profiles, its weight divided by
    the reference's median time there, so that each profile counts by its weight and not by its duration (a
    decode step is 10-100x shorter than a prefill); with one, its weight."""
    return weight / max(float(np.median(reference)), 1e-12) if several else weight


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def run_times(session, feeds: dict, runs: int, warmup: int = 0) -> list[float]:
    """Seconds per run, after `warmup` untimed runs."""
    for _ in range(warmup):
        session.run(None, feeds)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        ts.append(time.perf_counter() - t)
    return ts


def warm_up(session, feeds: dict, max_runs: int = 200) -> int:
    """Runs in blocks of 10 until two consecutive block medians agree within 5%."""
    previous = None
    for block in range(max_runs // 10):
        med = statistics.median(run_times(session, feeds, 10))
        if previous is not None and abs(med - previous) <= 0.05 * previous:
            return (block + 1) * 10
        previous = med
    return max_runs


def time_interleaved(sessions: dict[str, object], feeds: dict, min_runs: int, budget_s: float,
                     progress: Progress | None = None) -> dict[str, list[float]]:
    """Rounds of one run per session, rotating the order; at least min_runs, then until the budget is used."""
    times: dict[str, list[float]] = {k: [] for k in sessions}
    order = list(sessions)
    start = time.perf_counter()
    i = 0
    while i < min_runs or (time.perf_counter() - start < budget_s and i < 20 * min_runs):
        rot = order[i % len(order):] + order[: i % len(order)]
        for k in rot:
            t = time.perf_counter()
            sessions[k].run(None, feeds)
            times[k].append(time.perf_counter() - t)
        i += 1
        if progress is not None and i % 10 == 0:
            done = max(i / min_runs if i < min_runs else 0, (time.perf_counter() - start) / budget_s)
            progress("timing", min(done, 1.0))
    return times
