"""Measured selection: keep only the rewrites that make the model faster on the target execution provider.

Applied rewrites are grouped by the fused op they create (rules that make the same op share a fate: one
SkipLayerNormalization left in a graph is enough for onnxruntime to re-fuse the rest). Each round times the
current candidate F, F without each group, and the original, interleaved in one process at ORT_ENABLE_ALL.
The group whose removal makes F significantly faster is dropped; rounds repeat until no removal helps. If the
result is still significantly slower than the original, nothing is kept.

Two sessions of one model can differ by a few percent for as long as they live (memory placement), which paired
ratios cannot see. So F is timed in two sessions: their mean is the reference, and the ratio between them is
the round's noise floor: a change counts only beyond it (plus SIGNIFICANT).

Statistics: per round of interleaved runs, the paired ratio t(variant) / t(reference); its median and a
bootstrap 95% confidence interval (seeded, so a given set of timings always gives the same verdict).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Source = str | bytes
Key = tuple[str, str]  # one applied rewrite: (rule id, root value)
# times sessions for the given sources; returns per-label lists of seconds, one entry per interleaved round
TimeFn = Callable[[dict[str, Source], dict[str, np.ndarray]], dict[str, list[float]]]

SIGNIFICANT = 0.005  # a ratio's whole CI must clear 1 -/+ this to count as a change
CONTROL = "current (second session)"


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
        if self.high < 1 - SIGNIFICANT - floor:
            return "faster"
        if self.low > 1 + SIGNIFICANT + floor:
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
    effect: Ratio | None = None  # latency with the group / without it, in the last round that measured it

    @property
    def gain(self) -> float | None:
        """Fraction of latency this group saves (negative: it costs)."""
        return None if self.effect is None else 1.0 - self.effect.median


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
    strategy: str = ""  # "backward" (drop what costs) or "forward" (add what helps, after backward failed)
    floor: float = 0.0  # largest A/A difference between two sessions of one candidate, over the rounds
    denied: set[Key] = field(default_factory=set)  # rewrites left out of groups kept only in part (by region)

    @property
    def dropped_rules(self) -> list[str]:
        """Rules of dropped groups, except those a group kept in part (by region) still needs."""
        needed = {r for g in self.groups if g.kept for r in g.rules}
        return sorted({r for g in self.groups if not g.kept for r in g.rules} - needed)


def group_key(ops: tuple[str, ...]) -> str:
    return "+".join(sorted(set(ops))) or "(removes nodes only)"


def select(
    groups: dict[str, list[str]],
    rewrites: dict[str, int],
    build: Callable[[set[str]], Source],
    original: Source,
    feeds: dict[str, np.ndarray],
    time_fn: TimeFn,
    provider: str,
    threads: int,
    members: dict[str, list[Key]] | None = None,
    build_denying: Callable[[set[str], frozenset[Key]], Source] | None = None,
) -> MeasureReport:
    """Backward elimination of rewrite groups; if the result is still slower than the original, forward
    selection from nothing. `build(dropped_rules)` returns a candidate model without those rules. With
    `members` (each group's rewrites, in graph order) and `build_denying` (a candidate that also leaves out the
    given rewrites), a dropped group of several rewrites gets one more chance by region: its first and its
    second half are timed alone, and a half that is faster beyond the noise floor is kept."""
    t0 = time.perf_counter()
    report = MeasureReport(provider, threads, 0, strategy="backward")
    effects = {g: GroupEffect(g, sorted(rules), sum(rewrites.get(r, 0) for r in rules), True)
               for g, rules in sorted(groups.items())}
    all_rules = {r for rules in groups.values() for r in rules}

    def rules_without(kept: set[str]) -> set[str]:
        return all_rules - {r for g in kept for r in groups[g]}

    def timed(sources: dict[str, Source]) -> tuple[dict[str, list[float]], list[float], float]:
        """Times `sources` plus a second session of "current"; returns the times, the reference (mean of the
        two "current" sessions per run) and this round's noise floor."""
        times = time_fn({**sources, CONTROL: sources["current"]}, feeds)
        ref = [(a + b) / 2 for a, b in zip(times["current"], times[CONTROL], strict=True)]
        floor = abs(paired_ratio(times[CONTROL], times["current"]).median - 1)
        report.floor = max(report.floor, floor)
        report.final = paired_ratio(ref, times["original"])
        return times, ref, floor

    def step(kept: set[str], trials: list[str], adding: bool) -> str | None:
        """One interleaved round: the current set, each trial set, the original. Returns the best helpful
        trial (a group to add when adding, to remove otherwise). A trial whose median effect is beyond
        SIGNIFICANT but hidden by the round's noise floor is timed once more in fresh sessions, against the
        second session of the current set alone: it counts if that round is clear without a floor."""
        sources: dict[str, Source] = {"original": original, "current": build(rules_without(kept))}
        for g in trials:
            sources[g] = build(rules_without(kept | {g} if adding else kept - {g}))
        times, ref, floor = timed(sources)
        report.rounds += 1

        best: tuple[float, str] | None = None

        def effect(g: str, times: dict[str, list[float]], ref: list[float]) -> Ratio:
            return paired_ratio(times[g], ref) if adding else paired_ratio(ref, times[g])

        def consider(g: str, r: Ratio, floor: float) -> bool:
            """True if g's effect `r` helps beyond `floor`; then it is recorded (the best one kept)."""
            nonlocal best
            if r.verdict_beyond(floor) != ("faster" if adding else "slower"):
                return False
            effects[g].effect = r
            score = r.median if adding else -r.median
            if best is None or score < best[0]:
                best = (score, g)
            return True

        unsure: list[str] = []
        for g in trials:
            r = effects[g].effect = effect(g, times, ref)
            if not consider(g, r, floor) and abs(r.median - 1) > SIGNIFICANT and (r.median < 1) == adding:
                unsure.append(g)
        if best is None and unsure:
            times2, _, _ = timed({"original": original, "current": sources["current"],
                                  **{g: sources[g] for g in unsure}})
            report.rounds += 1
            for g in unsure:
                consider(g, effect(g, times2, times2[CONTROL]), 0.0)
        return None if best is None else best[1]

    kept = set(effects)
    while True:
        worst = step(kept, sorted(kept), adding=False)
        if worst is None:
            break
        kept.discard(worst)
    if report.final is not None and report.final.verdict_beyond(report.floor) == "slower":
        report.strategy = "forward"
        kept = set()
        while True:
            best = step(kept, sorted(set(effects) - kept), adding=True)
            if best is None:
                break
            kept.add(best)
            if kept == set(effects):
                timed({"original": original, "current": build(rules_without(kept))})
                break
    for g, e in effects.items():
        e.kept = g in kept
    partial: set[str] = set()
    if members and build_denying:
        partial = _regions(report, effects, groups, kept, members, build_denying, rules_without, timed, original)
    report.dropped_everything = not kept and not partial
    if report.final is not None and report.final.verdict_beyond(report.floor) == "slower" and (kept or partial):
        for e in list(effects.values()) + report.groups:
            e.kept = False
        report.denied = set()
        report.dropped_everything = True
    report.groups = list(effects.values()) + report.groups
    report.seconds = time.perf_counter() - t0
    return report


MAX_REGION_GROUPS = 4  # dropped groups given a second chance by region (one timing round each)
REGION_MAX_COST = 1.05  # a group that costs more than 5% as a whole is not split: halves rarely pay then


Timed = Callable[[dict[str, Source]], tuple[dict[str, list[float]], list[float], float]]


def _regions(report: MeasureReport, effects: dict[str, GroupEffect], groups: dict[str, list[str]],
             kept: set[str], members: dict[str, list[Key]],
             build_denying: Callable[[set[str], frozenset[Key]], Source],
             rules_without: Callable[[set[str]], set[str]], timed: Timed, original: Source) -> set[str]:
    """Split each dropped group of several rewrites in two halves (graph order) and keep a half that pays.
    Returns the groups kept in part."""
    denied: frozenset[Key] = frozenset()
    partial: set[str] = set()
    tried = [g for g in sorted(effects) if g not in kept and len(members.get(g, ())) >= 2
             and (effects[g].effect is None or effects[g].effect.median < REGION_MAX_COST)][:MAX_REGION_GROUPS]
    for g in tried:
        keys = members[g]
        halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
        base_drop = rules_without(kept | partial)
        sources: dict[str, Source] = {"original": original, "current": build_denying(base_drop, denied)}
        labels = []
        spans = [(1, len(halves[0])), (len(halves[0]) + 1, len(keys))]
        for k, half in enumerate(halves):
            other = frozenset(halves[1 - k])
            label = f"{g} [rewrites {spans[k][0]}-{spans[k][1]} of {len(keys)}]"
            sources[label] = build_denying(base_drop - set(groups[g]), denied | other)
            labels.append((label, half, other))
        times, ref, floor = timed(sources)
        report.rounds += 1
        best: tuple[float, str, list[Key], frozenset[Key]] | None = None
        for label, half, other in labels:
            effect = paired_ratio(times[label], ref)
            row = GroupEffect(label, effects[g].rules, len(half), False, effect)
            report.groups.append(row)
            if effect.verdict_beyond(floor) == "faster" and (best is None or effect.median < best[0]):
                best = (effect.median, label, half, other)
        if best is not None:
            next(r for r in report.groups if r.group == best[1]).kept = True
            partial.add(g)
            denied = denied | best[3]
    if partial:
        report.denied = set(denied)
        timed({"original": original, "current": build_denying(rules_without(kept | partial), denied)})
    return partial


def weighted_time_fn(time_fn: TimeFn, profiles: list[tuple[float, dict[str, np.ndarray]]]) -> TimeFn:
    """Times every shape profile (prefill, decode) and adds them per interleaved round, weighted: a group then
    counts by its effect on the weighted total latency. The feeds passed in are ignored."""

    def timed(sources: dict[str, Source], _feeds: dict[str, np.ndarray]) -> dict[str, list[float]]:
        total: dict[str, list[float]] = {}
        for weight, feeds in profiles:
            times = time_fn(sources, feeds)
            for label, ts in times.items():
                prev = total.get(label)
                total[label] = [weight * t for t in ts] if prev is None else [
                    a + weight * b for a, b in zip(prev, ts, strict=False)]
        return total

    return timed


def make_time_fn(provider: str, threads: int, budget_s: float, min_runs: int = 30) -> TimeFn:
    """Interleaved timing on onnxruntime at ORT_ENABLE_ALL, with the bench protocol (bench.py)."""

    def time_fn(sources: dict[str, Source], feeds: dict[str, np.ndarray]) -> dict[str, list[float]]:
        from .bench import run_times, time_interleaved
        from .validate import make_session

        sessions = {k: make_session(src, "all", provider, threads) for k, src in sources.items()}
        for s in sessions.values():
            run_times(s, feeds, 0, warmup=3)
        return time_interleaved(sessions, feeds, min_runs, budget_s)

    return time_fn
