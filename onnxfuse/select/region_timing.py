"""Timing one class of regions, or the whole model: sessions run interleaved in rotating order over the shape
profiles, within a deadline, and the fused version's verdict against the noise floor of two original sessions."""

from __future__ import annotations

import time

from .timing import Ratio, paired_ratio, profile_scale

__all__ = ["MIN_RUNS", "MIN_RUNS_FLOOR", "Filtered", "OutOfBudget", "interleaved", "verdict"]

MIN_RUNS = 20  # interleaved runs per session for a region class, budget permitting
MIN_RUNS_FLOOR = 8  # never fewer: a verdict on fewer runs is not one
MAX_RUNS = 400  # at most, when timing runs on until a minimum time


class Filtered:
    """A session that takes a superset of its inputs (regions' two versions read different values)."""

    def __init__(self, session) -> None:
        self.session = session
        self.names = [i.name for i in session.get_inputs()]

    def run(self, _outputs, feeds: dict) -> list:
        return self.session.run(None, {k: feeds[k] for k in self.names})


class OutOfBudget(Exception):
    """Not even MIN_RUNS_FLOOR runs fit before the end of the budget."""


def interleaved(sessions: dict[str, object], profiles: list[tuple[float, dict]], min_runs: int,
                 deadline: float, hard_deadline: float | None = None,
                 per_profile: dict[tuple[str, int], list[float]] | None = None,
                 min_seconds: float = 0.0) -> dict[str, list[float]]:
    """Per-run times, sessions interleaved in rotating order: at least MIN_RUNS_FLOOR runs, then up to
    `min_runs` while `deadline` allows, and more (up to MAX_RUNS) until the runs have taken `min_seconds`: on a
    model of a tenth of a millisecond, 20 runs each leave a confidence interval wider than the effect. Raises OutOfBudget when, after one warm-up run of each, MIN_RUNS_FLOOR
    more would end past `hard_deadline` (the end of the whole budget).
    With several shape profiles a run's time is the weighted sum over profiles of each profile's time relative
    to the first session's median there: prefill and decode then count by their weights, not by their
    durations (a decode step, 10-100x shorter than a prefill, would otherwise not count at all). `per_profile`
    also receives each session's seconds per profile, keyed (session, profile index)."""
    order = list(sessions)
    t0 = time.perf_counter()
    for s in sessions.values():  # warm-up
        for _, feeds in profiles:
            s.run(None, feeds)
    now = time.perf_counter()
    if hard_deadline is not None and now + (now - t0) * MIN_RUNS_FLOOR > hard_deadline:
        raise OutOfBudget
    raw: dict[tuple[str, int], list[float]] = {(k, p): [] for k in order for p in range(len(profiles))}
    i = 0
    start = time.perf_counter()
    while i < MIN_RUNS_FLOOR or (time.perf_counter() < deadline and (
            i < min_runs or (i < MAX_RUNS and time.perf_counter() - start < min_seconds))):
        rot = order[i % len(order):] + order[: i % len(order)]
        for p, (_, feeds) in enumerate(profiles):
            for k in rot:
                t = time.perf_counter()
                sessions[k].run(None, feeds)
                raw[k, p].append(time.perf_counter() - t)
        i += 1
    if per_profile is not None:
        per_profile.update(raw)
    scale = [profile_scale(w, raw[order[0], p], len(profiles) > 1) for p, (w, _) in enumerate(profiles)]
    return {k: [sum(scale[p] * raw[k, p][r] for p in range(len(profiles))) for r in range(i)] for k in order}


def verdict(times: dict[str, list[float]], a: str, b: str, f: str) -> tuple[Ratio, float]:
    """(fused / mean of the two original sessions, noise floor |b/a - 1|)."""
    ref = [(x + y) / 2 for x, y in zip(times[a], times[b], strict=True)]
    floor = abs(paired_ratio(times[b], times[a]).median - 1)
    return paired_ratio(times[f], ref), floor
