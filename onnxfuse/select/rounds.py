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
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import OnnxfuseError
from ..measure.clock import estimator_for
from ..measure.sessions import timing_sessions
from ..measure.stats import SIGNIFICANT, Ratio, paired_ratio
from ..measure.timing import MODEL_ROUND_S, interleave
from ..measure.verdicts import reference, verdict
from ..options import OptimizeOptions
from ..patterns.rules import Rule
from ..rewrite.engine import EngineOptions, EngineResult
from ..rewrite.rebuild import Rewritten, rebuild
from ..validate.runtime import Candidate
from ..validate.validate import Validator

Source = str | bytes
Key = tuple[str, str]  # one applied rewrite: (rule id, root value)
# times sessions for the given sources; returns per-label lists of seconds, one entry per interleaved round
TimeFn = Callable[[dict[str, Source], dict[str, np.ndarray]], dict[str, list[float]]]

CONTROL = "current (second session)"


@dataclass
class GroupEffect:
    group: str  # the fused op type(s) the group creates
    rules: list[str]
    rewrites: int
    kept: bool
    effect: Ratio | None = None  # latency with the group / without it, in the last round that measured it
    source: str = "timed"  # timed | cached (decided by an earlier run) | exact | untimed | budget (not reached)
    # | undecided (the budget ended with its interval across the line) | model (decided on the whole model)
    instances: int = 1  # regions decided together (alike regions are one class)
    floor: float = 0.0  # the noise floor of the round that decided it
    seconds_each: float = 0.0  # a region's original version, per run (region selection)
    share: float | None = None  # |1 - effect| x its regions' time, over the model's: what it changes of the model
    why: str = ""  # why it was not timed

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
    floor: float = 0.0  # mean A/A offset of the two sessions of each model (the candidate's and its base's)
    denied: set[Key] = field(default_factory=set)  # rewrites left out of groups kept only in part (by region)
    confirmed: str = ""  # the whole-model confirmation: timed, cached, or skipped: why (region selection)
    undecided: int = 0  # region classes the budget did not reach (left as the original)
    budget_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (region selection)
    phase_peaks: dict[str, int] = field(default_factory=dict)  # the process's peak RSS at the end of each phase
    # the whole-model confirmation per shape profile (prefill, decode): (name, weight, candidate / original)
    profiles: list[tuple[str, float, Ratio]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. what the decision cache left out, one line each
    estimator: str = ""  # the clock decisions were read on (measure/clock.py): cpu or wall
    final_wall: Ratio | None = None  # the confirmation on wall time, where the estimator is CPU time
    aa_spread: tuple[float, float] | None = None  # the confirmation's A/A contrast per round, p10 and p90

    def to_json(self) -> dict:
        return {
            "provider": self.provider, "threads": self.threads, "rounds": self.rounds, "seconds": self.seconds,
            "note": self.note, "final_ratio": None if self.final is None else asdict(self.final),
            "final_verdict": None if self.final is None else self.final.final_word(self.floor),
            "noise_floor": self.floor, "denied": [list(k) for k in sorted(self.denied)],
            "dropped_everything": self.dropped_everything,
            "groups": [{"group": g.group, "rules": g.rules, "rewrites": g.rewrites, "kept": g.kept, "gain": g.gain,
                        "with_over_without": None if g.effect is None else asdict(g.effect), "source": g.source,
                        "instances": g.instances, "noise_floor": g.floor, "why": g.why} for g in self.groups],
            "strategy": self.strategy, "confirmed": self.confirmed, "undecided": self.undecided,
            "budget_s": self.budget_s, "phases": self.phases, "phase_peak_rss_bytes": self.phase_peaks,
            "profiles": [{"name": n, "weight": w, "ratio": asdict(r)} for n, w, r in self.profiles],
            "warnings": self.warnings, "estimator": self.estimator,
            "final_ratio_wall": None if self.final_wall is None else asdict(self.final_wall),
            "aa_spread": None if self.aa_spread is None else list(self.aa_spread),
        }

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
    sel = _Selection(groups, rewrites, build, original, feeds, time_fn, MeasureReport(
        provider, threads, 0, strategy="backward", estimator=estimator_for(provider, threads)))
    kept = sel.backward()
    if sel.report.final is not None and sel.report.final.verdict_beyond(sel.report.floor) == "slower":
        sel.report.strategy = "forward"
        kept = sel.forward()
    for g, e in sel.effects.items():
        e.kept = g in kept
    partial: set[str] = set()
    if members and build_denying:
        partial = _regions(sel.report, sel.effects, groups, kept, members, build_denying, sel.rules_without,
                           sel.timed, original)
    final = (build_denying(sel.rules_without(kept | partial), frozenset(sel.report.denied))
             if partial and build_denying else build(sel.rules_without(kept)))
    return sel.finish(kept, partial, t0, final)


class _Selection:
    """The state of one measured selection: the groups' effects, the report, and one timing round (step)."""

    def __init__(self, groups: dict[str, list[str]], rewrites: dict[str, int], build: Callable[[set[str]], Source],
                 original: Source, feeds: dict[str, np.ndarray], time_fn: TimeFn, report: MeasureReport) -> None:
        self.groups, self.build, self.original, self.feeds, self.time_fn = groups, build, original, feeds, time_fn
        self.report = report
        self.effects = {g: GroupEffect(g, sorted(rules), sum(rewrites.get(r, 0) for r in rules), True)
                        for g, rules in sorted(groups.items())}
        self.all_rules = {r for rules in groups.values() for r in rules}

    def rules_without(self, kept: set[str]) -> set[str]:
        return self.all_rules - {r for g in kept for r in self.groups[g]}

    def timed(self, sources: dict[str, Source]) -> tuple[dict[str, list[float]], list[float], float]:
        """Times `sources` plus a second session of "current"; returns the times, the reference (mean of the
        two "current" sessions per run) and this round's noise floor."""
        times = self.time_fn({**sources, CONTROL: sources["current"]}, self.feeds)
        final = verdict(times, ("current", CONTROL), "original")
        self.report.floor = max(self.report.floor, final.floor)
        self.report.final = final.ratio
        return times, reference(times, ("current", CONTROL)), final.floor

    def backward(self) -> set[str]:
        """Drop the group whose removal helps most, round after round, until none does."""
        kept = set(self.effects)
        while (worst := self.step(kept, sorted(kept), adding=False)) is not None:
            kept.discard(worst)
        return kept

    def forward(self) -> set[str]:
        """From nothing, add the group that helps most, round after round, until none does."""
        kept: set[str] = set()
        while (best := self.step(kept, sorted(set(self.effects) - kept), adding=True)) is not None:
            kept.add(best)
            if kept == set(self.effects):
                self.timed({"original": self.original, "current": self.build(self.rules_without(kept))})
                break
        return kept

    def step(self, kept: set[str], trials: list[str], adding: bool) -> str | None:
        """One interleaved round: the current set, each trial set, the original. Returns the best helpful
        trial (a group to add when adding, to remove otherwise). A trial whose median effect is beyond
        SIGNIFICANT but hidden by the round's noise floor is timed once more in fresh sessions, against the
        second session of the current set alone: it counts if that round is clear without a floor."""
        sources: dict[str, Source] = {"original": self.original, "current": self.build(self.rules_without(kept))}
        for g in trials:
            sources[g] = self.build(self.rules_without(kept | {g} if adding else kept - {g}))
        times, ref, floor = self.timed(sources)
        self.report.rounds += 1
        best: list[tuple[float, str]] = []
        unsure: list[str] = []
        for g in trials:
            r = self.effects[g].effect = _effect(times[g], ref, adding)
            if not self._helps(g, r, floor, adding, best) and abs(r.median - 1) > SIGNIFICANT and \
                    (r.median < 1) == adding:
                unsure.append(g)
        if not best and unsure:
            times2, _, _ = self.timed({"original": self.original, "current": sources["current"],
                                       **{g: sources[g] for g in unsure}})
            self.report.rounds += 1
            for g in unsure:
                self._helps(g, _effect(times2[g], times2[CONTROL], adding), 0.0, adding, best)
        return min(best)[1] if best else None

    def _helps(self, g: str, r: Ratio, floor: float, adding: bool, best: list[tuple[float, str]]) -> bool:
        """True if g's effect `r` helps beyond `floor`; then it is recorded and offered to `best`."""
        if r.verdict_beyond(floor) != ("faster" if adding else "slower"):
            return False
        self.effects[g].effect = r
        best.append((r.median if adding else -r.median, g))
        return True

    def finish(self, kept: set[str], partial: set[str], t0: float, final: Source) -> MeasureReport:
        """Everything dropped when the kept selection is still slower than the original: beyond the noise
        floor, or confirmed in fresh sessions when only its median says so (see slower_confirmed)."""
        report = self.report
        report.dropped_everything = not kept and not partial
        if (kept or partial) and (report.final is not None and report.final.verdict_beyond(report.floor) == "slower"
                                  or self.slower_confirmed(final)):
            for e in list(self.effects.values()) + report.groups:
                e.kept = False
            report.denied = set()
            report.dropped_everything = True
        report.groups = list(self.effects.values()) + report.groups
        report.seconds = time.perf_counter() - t0
        return report


    def slower_confirmed(self, final: Source) -> bool:
        """Never slower, where the noise floor hides it: a kept selection whose median is slower than the
        original (beyond SIGNIFICANT) is timed once more against it in fresh sessions, and counts as slower if
        both of its sessions are, each CI clear of 1 by SIGNIFICANT. The report's final ratio is that round's."""
        if self.report.final is None or self.report.final.median <= 1 + SIGNIFICANT:
            return False
        times, _, _ = self.timed({"original": self.original, "current": final})
        self.report.rounds += 1
        return all(paired_ratio(times[s], times["original"]).verdict_beyond(0.0) == "slower"
                   for s in ("current", CONTROL))


def _effect(times: list[float], ref: list[float], adding: bool) -> Ratio:
    """A trial's effect as with/without its group."""
    return paired_ratio(times, ref) if adding else paired_ratio(ref, times)


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


def make_time_fn(provider: str, threads: int, budget_s: float, profiles: list[tuple[float, dict[str, np.ndarray]]],
                 min_runs: int = 12) -> TimeFn:
    """Interleaved timing (measure/timing.py) on onnxruntime at ORT_ENABLE_ALL over the shape profiles
    (prefill, decode: a group then counts by its weighted effect on each), on the estimator for `provider` and
    `threads`; at least `min_runs` rounds, then on until `budget_s` is used. The feeds passed in are ignored."""

    def time_fn(sources: dict[str, Source], _feeds: dict[str, np.ndarray]) -> dict[str, list[float]]:
        sessions = timing_sessions(sources, provider, threads)
        return interleave(sessions, profiles, estimator=estimator_for(provider, threads), min_runs=min_runs,
                          floor_runs=min_runs, min_seconds=budget_s, max_runs=20 * min_runs, round_s=MODEL_ROUND_S)

    return time_fn


# ---- on a model: candidates built from the rules, timed on the validator's inputs --------------------------

MEASURE_MAX_BYTES = 512 * 2**20  # above this, variants side by side would hold several copies in memory


def measured_selection(input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
                       deny: set[Key], state: Rewritten, validator: Validator) -> tuple[MeasureReport, Rewritten]:
    """Time groups of `state`'s rewrites on the target and keep only those that help; the kept selection is
    validated again. Rules a dropped group had shadowed get a second pass of their own."""
    weights = state.info.size_bytes + state.info.external_bytes
    if weights > MEASURE_MAX_BYTES:
        return MeasureReport(opts.target, opts.measure_threads, 0, note=(
            f"not measured: {weights / 2**30:.1f} GiB of weights; timing variants side by side would hold "
            "several copies in memory (validation still ran, one session at a time)")), state
    profiles = validator.timing_profiles()  # settles the inputs
    time_fn = make_time_fn(opts.target, opts.measure_threads, opts.round_budget_s, profiles)
    by_id = {r.id: r for r in rules}
    allowed = {a.rule for a in state.eng.applications if a.rule in by_id}  # folding is exact: always on
    earlier: list[GroupEffect] = []  # groups dropped in the first pass
    for pass_no in range(2):
        report = _select_groups(input_path, by_id, allowed, state.eng, opts, base, deny, profiles[0][1], time_fn)
        kept = set() if report.dropped_everything else allowed - set(report.dropped_rules)
        deny = deny | report.denied  # rewrites left out of groups kept only in part (by region)
        report.groups = report.groups + earlier
        if kept == allowed:
            break
        # Rules the dropped ones had shadowed (e.g. FusedMatMul inside an Attention that did not pay) fire
        # once those are gone: time them too, in one more pass.
        state = rebuild(input_path, [r for r in rules if r.id not in allowed - kept], base, deny)
        shadowed = {a.rule for a in state.eng.applications if a.rule in by_id} - allowed
        if pass_no == 1 or not shadowed:
            break
        earlier = [g for g in report.groups if not g.kept]
        allowed = kept | shadowed
    state = rebuild(input_path, [by_id[r] for r in sorted(kept, key=lambda r: by_id[r].order)], base, deny)
    if opts.validate and state.eng.applications:
        outcome = validator.check(state.proto, state.info)
        if not outcome.ok:  # cannot happen for a subset of validated rules unless a rule depends on another
            raise OnnxfuseError(f"the measured selection does not validate: {outcome.reason}; nothing written")
    return report, state


def _select_groups(input_path: str, by_id: dict[str, Rule], allowed: set[str], eng: EngineResult,
                   opts: OptimizeOptions, base: EngineOptions, deny: set[Key], feeds: dict,
                   time_fn: TimeFn) -> MeasureReport:
    """Group the applied rewrites of the `allowed` rules by the fused ops they create and time the groups;
    candidates are built from allowed rules only, so a dropped group never lets another rule in unmeasured."""
    ops_by_rule: dict[str, set[str]] = {}
    for a in eng.applications:
        if a.rule in allowed:
            ops_by_rule.setdefault(a.rule, set()).update(a.ops)
    groups: dict[str, list[str]] = {}
    for rule_id, ops in ops_by_rule.items():
        groups.setdefault(group_key(tuple(ops)), []).append(rule_id)
    rewrites = dict(Counter(a.rule for a in eng.applications if a.rule in allowed))
    members = {g: [a.key for a in eng.applications if a.rule in rules] for g, rules in groups.items()}
    candidates: list[Candidate] = []
    cache: dict[tuple[frozenset[str], frozenset[tuple[str, str]]], Source] = {}

    def build_denying(dropped: set[str], denied: frozenset[tuple[str, str]]) -> Source:
        key = (frozenset(dropped), denied)
        if key not in cache:
            use = [r for rid, r in by_id.items() if rid in allowed and rid not in dropped]
            built = rebuild(input_path, use, base, deny | denied)
            cand = Candidate(built.proto, built.info)
            candidates.append(cand)
            cache[key] = cand.source
        return cache[key]

    def build(dropped: set[str]) -> Source:
        return build_denying(dropped, frozenset())

    try:
        return select(groups, rewrites, build, input_path, feeds, time_fn, opts.target, opts.measure_threads,
                      members, build_denying)
    finally:
        for c in candidates:
            c.close()
