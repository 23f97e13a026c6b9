"""Measured selection: keep only the rewrites that make the model faster on the target execution provider.

Applied rewrites are grouped by the fused op they create (rules that make the same op share a fate: one
SkipLayerNormalization left in a graph is enough for onnxruntime to re-fuse the rest). Each round times the
current candidate F, F without each group, and the original, interleaved in one process at ORT_ENABLE_ALL.
The group whose removal makes F significantly faster is dropped; rounds repeat until no removal helps. If the
result is still significantly slower than the original, nothing is kept.

Statistics: per round of interleaved runs, the paired ratio t(variant) / t(reference); its median and a
bootstrap 95% confidence interval (seeded, so a given set of timings always gives the same verdict).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Source = str | bytes
# times sessions for the given sources; returns per-label lists of seconds, one entry per interleaved round
TimeFn = Callable[[dict[str, Source], dict[str, np.ndarray]], dict[str, list[float]]]

SIGNIFICANT = 0.005  # a ratio's whole CI must clear 1 -/+ this to count as a change


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.high < 1 - SIGNIFICANT:
            return "faster"
        if self.low > 1 + SIGNIFICANT:
            return "slower"
        return "no significant change"

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"


def paired_ratio(variant: list[float], reference: list[float], seed: int = 0) -> Ratio:
    r = np.asarray(variant, dtype=np.float64) / np.asarray(reference, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(r, size=(1000, r.size), replace=True), axis=1)
    return Ratio(float(np.median(r)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))


@dataclass
class GroupEffect:
    group: str  # the fused op type(s) the group creates
    rules: list[str]
    rewrites: int
    kept: bool
    without: Ratio | None = None  # time of the candidate without this group / with it (last round measured)

    @property
    def gain(self) -> float | None:
        """Fraction of latency this group saves (negative: it costs)."""
        return None if self.without is None else 1.0 - 1.0 / self.without.median


@dataclass
class MeasureReport:
    provider: str
    threads: int
    rounds: int
    groups: list[GroupEffect] = field(default_factory=list)
    final: Ratio | None = None  # kept candidate vs original
    dropped_everything: bool = False
    seconds: float = 0.0
    note: str = ""

    @property
    def dropped_rules(self) -> list[str]:
        return sorted(r for g in self.groups if not g.kept for r in g.rules)


def group_key(ops: tuple[str, ...]) -> str:
    return "+".join(sorted(set(ops)))


def select(
    groups: dict[str, list[str]],
    rewrites: dict[str, int],
    build: Callable[[set[str]], Source],
    original: Source,
    feeds: dict[str, np.ndarray],
    time_fn: TimeFn,
    provider: str,
    threads: int,
) -> MeasureReport:
    """Greedy backward elimination of rewrite groups. `build(dropped_rules)` returns a candidate model."""
    t0 = time.perf_counter()
    report = MeasureReport(provider, threads, 0)
    effects = {g: GroupEffect(g, sorted(rules), sum(rewrites.get(r, 0) for r in rules), True)
               for g, rules in sorted(groups.items())}
    dropped: set[str] = set()
    while True:
        active = [g for g in effects if effects[g].kept]
        sources: dict[str, Source] = {"original": original, "candidate": build(dropped)}
        for g in active:
            sources[f"without {g}"] = build(dropped | set(groups[g]))
        times = time_fn(sources, feeds)
        report.rounds += 1
        report.final = paired_ratio(times["candidate"], times["original"])
        best: tuple[float, str] | None = None
        for g in active:
            ratio = paired_ratio(times[f"without {g}"], times["candidate"])
            effects[g].without = ratio
            if ratio.verdict == "faster" and (best is None or ratio.median < best[0]):
                best = (ratio.median, g)
        if best is None:
            break
        effects[best[1]].kept = False
        dropped |= set(groups[best[1]])
    if report.final is not None and report.final.verdict == "slower":
        for e in effects.values():
            e.kept = False
        report.dropped_everything = True
    report.groups = list(effects.values())
    report.seconds = time.perf_counter() - t0
    return report


def make_time_fn(provider: str, threads: int, budget_s: float, min_runs: int = 20, max_runs: int = 400) -> TimeFn:
    """Interleaved timing on onnxruntime at ORT_ENABLE_ALL: warm up, then rounds of one run per session."""

    def time_fn(sources: dict[str, Source], feeds: dict[str, np.ndarray]) -> dict[str, list[float]]:
        from .validate import make_session

        sessions = {k: make_session(src, "all", provider, threads) for k, src in sources.items()}
        for s in sessions.values():
            for _ in range(3):
                s.run(None, feeds)
        t = time.perf_counter()
        for s in sessions.values():
            s.run(None, feeds)
        per_round = max(time.perf_counter() - t, 1e-6)
        runs = int(min(max_runs, max(min_runs, budget_s / per_round)))
        times: dict[str, list[float]] = {k: [] for k in sessions}
        order = list(sessions)
        for i in range(runs):
            rot = order[i % len(order):] + order[: i % len(order)]
            for k in rot:
                t = time.perf_counter()
                sessions[k].run(None, feeds)
                times[k].append(time.perf_counter() - t)
        return times

    return time_fn
