"""One region selection's state and steps (the sequence is region_select.py): the regions' inputs captured from
runs of the original, each class of alike regions timed (measure/: sessions, one interleave, one verdict),
decisions cached, the kept selection rebuilt and confirmed on the whole model, all within one budget
(`automatic_budget` when none is given)."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import OnnxfuseError
from ..inputs.budget import default_budget_bytes
from ..ir import Model
from ..measure.clock import WALL, estimator_for, now
from ..measure.sessions import timing_sessions
from ..measure.stats import NOISE_PREFIX, SIGNIFICANT, UNDECIDED, Ratio
from ..measure.timing import (
    MIN_RUNS_FLOOR,
    MODEL_ROUND_S,
    Filtered,
    OutOfBudget,
    generations,
    in_generations,
    interleave,
    model_round_s,
)
from ..measure.verdicts import Verdict, verdict
from ..options import OptimizeOptions
from ..patterns.rules import Rule
from ..rewrite.engine import EngineOptions
from ..rewrite.fold import CLEANUP_STEPS
from ..rewrite.rebuild import Rewritten, rebuild
from ..validate.runtime import Candidate, peak_rss_bytes, release_memory, session_with_outputs
from ..validate.validate import Validator
from ..words import count
from .cached_report import from_cache
from .decision_cache import DecisionCache, digest, environment_key
from .op_prior import OpCost
from .regions import Region, region_model, signature
from .rounds import GroupEffect, Key, MeasureReport

__all__ = ["Comparison", "Phases", "RegionClass", "RegionRun", "automatic_budget"]

MIN_RUNS = 20  # interleaved rounds per region class, budget permitting (more while its verdict is undecided)
SESSIONS = 4  # in a whole-model comparison: two of the candidate, two of its base (measure/sessions.py)
UNDECIDED_MAX_RUNS = 2000  # rounds at most while a class's verdict is undecided (a small region's are cheap)
CAPTURE_CHUNK = 32  # region inputs fetched per run of the original (bounds the memory they take)
CONFIRM_RUNS = 20  # whole-model confirmation, budget permitting
ON_MODEL_ROUNDS = 20  # rounds reserved for each group decided on the whole model (the 8 of a confirmation left
# YOLOv8n's 6% layout gain at [0.89, 0.99]: not significant, dropped in one run of two)
SHORT_MODEL_ROUNDS = 16  # a model shorter than a round (MODEL_ROUND_S) runs several times in each: as many of its
# rounds as take the time that the rounds above take of one of MODEL_ROUND_S, or this many at least (with 10,
# cnn_small's reported A/A p90 under load was 1.016-1.021 in 3 runs of 4: the p90 of ten rounds is their largest
# but one; with 16, 1.002-1.005 in 3 of 3, its confirmation 4-8 s of a 10 s budget, was 2.4-5.5)
CONFIRM_GRACE = 0.5  # the whole-model confirmation may end this share of the budget past it
COMPARE_MIN_S = 1.0  # and runs on to about this many seconds (a small model's 20 runs are a few milliseconds)
REGION_BUDGET_S = 10.0  # the automatic budget at most (models up to 1 GiB)
AUTO_MIN_S = 4.0  # and at least, for timing alone (finding regions, capture and rebuilds come on top)
AUTO_MAX_S = 40.0  # the automatic budget with those steps at most (per GiB past 1 GiB): else nothing is timed
TOTAL_TARGET_S = 12.0  # the whole optimize the automatic budget aims at
CAPTURE_SHARE = 0.6  # capture may take at most this share of the budget, or nothing is measured
SHAPE_VALUES = 64  # a region whose inputs are all integers this small computes shapes (see RegionClass.shape_only)


def _integer(elem_type: int) -> bool:
    """An integer or bool element type (shape arithmetic's)."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).kind in "iub"
    except (KeyError, ValueError):
        return False


@dataclass
class RegionClass:
    """Alike regions, timed once through the first."""

    sig: str
    regions: list[Region]
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)  # per profile, the first region's inputs
    decision: GroupEffect | None = None
    measured_why: str | None = None  # the decision's `why` before a prior added to it (follow_peers)

    @property
    def shape_only(self) -> bool:
        """The region reads only a few integers and writes integers (shape arithmetic): there is nothing to time;
        it is kept. (An embedding lookup also reads a few integers at a short sequence, but writes floats.)"""
        rep = self.regions[0]
        outs = [rep.types.get(v) for v in rep.outputs]
        return all(t is not None and _integer(t.elem_type) for t in outs) and all(
            a.size <= SHAPE_VALUES and a.dtype.kind in "iu" for feeds in self.feeds for a in feeds.values())

    @property
    def keys(self) -> list[Key]:
        return [k for r in self.regions for k in r.keys]

    @property
    def weight(self) -> int:
        """Its regions times their nodes (once the regions are decided and their nodes gone: its regions)."""
        return len(self.regions) * max(1, len(self.regions[0].original))


class RegionRun:
    """One region selection: the state shared by its steps."""

    def __init__(self, input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
                 deny: set[Key], state: Rewritten, validator: Validator, cache: DecisionCache,
                 spent_s: float = 0.0, rewrite_s: float = 0.0) -> None:
        self.input_path, self.rules, self.opts, self.base, self.deny = input_path, rules, opts, base, deny
        self.state, self.validator, self.cache = state, validator, cache
        self.t0 = time.perf_counter()
        self.weights = state.info.size_bytes + state.info.external_bytes
        self.budget = opts.measure_budget_s if opts.measure_budget_s is not None else \
            automatic_budget(self.weights, spent_s)
        self.deadline = self.t0 + self.budget
        self.automatic = opts.measure_budget_s is None
        self.rebuild_s = rewrite_s  # one rebuild of the model (about what rewriting it took; then as measured)
        self.env = environment_key(opts.target, opts.measure_threads)
        # what `cache show` lists beside a decision (not part of its key): the model it was first taken on
        self.tag = {"model": os.path.basename(input_path), "threads": opts.measure_threads}
        self.estimator = estimator_for(validator.provider, opts.measure_threads)
        self.report = MeasureReport(opts.target, opts.measure_threads, 0, strategy="regions",
                                    estimator=self.estimator)
        self.provider = validator.provider
        self.profiles = validator.timing_profiles()
        self.profile_names = [name for name, _, _ in validator.profiles()]
        self.session_s = 0.0  # creating a session of the original (measured by capture)
        self.latency_s = 0.0  # one run of the original, slowest profile (measured by capture), wall time
        # the same run's weighted total over the profiles on the estimator's clock: what a class's share of the
        # model is of (a region's time is on that clock; wall time under load made the shares 10x smaller)
        self.model_s = 0.0

    # ---- capture: the values at region boundaries, from runs of the original -----------------------------------

    def capture(self, original: Model, regions: list[Region]) -> list[RegionClass]:
        """Run the original with the regions' inputs as extra outputs (CAPTURE_CHUNK at a time) and group the
        regions into classes by signature; the first region of a class keeps its inputs for timing."""
        # what the runs feed; an overridable initializer left unfed (its default) is fetched like any value
        feeds_names = {k for _, feeds in self.profiles for k in feeds}
        wanted = [v for v in dict.fromkeys(v for r in regions for v in r.inputs) if v not in feeds_names]
        t = time.perf_counter()
        with session_with_outputs(original.proto, self.state.info, wanted, self.provider,
                                  self.opts.measure_threads) as session:
            self.session_s = time.perf_counter() - t
            classes: dict[str, RegionClass] = {}
            pending = list(regions)
            model_timed = self.model_s > 0  # (by an earlier pass's capture)
            while pending:
                chunk: list[Region] = []
                names: set[str] = set()
                while pending and (not chunk or len(names | set(pending[0].inputs)) <= CAPTURE_CHUNK):
                    chunk.append(pending.pop(0))
                    names.update(chunk[-1].inputs)
                fetch = [v for v in wanted if v in names]
                per_profile = []
                for weight, feeds in self.profiles:
                    w, c = now()
                    values = dict(zip(fetch, session.run(fetch, feeds), strict=True)) if fetch else {}
                    w2, c2 = now()
                    self.latency_s = max(self.latency_s, w2 - w)
                    if not model_timed:
                        self.model_s += weight * ((w2 - w) if self.estimator == WALL else (c2 - c))
                    values.update({k: v for k, v in feeds.items() if k in names})
                    per_profile.append(values)
                model_timed = True
                for r in chunk:
                    shapes = [[(str(p[v].dtype), tuple(p[v].shape)) for v in r.inputs] for p in per_profile]
                    sig = signature(r, shapes)
                    if sig not in classes:
                        classes[sig] = RegionClass(sig, [], [{v: p[v] for v in r.inputs} for p in per_profile])
                    classes[sig].regions.append(r)
                del per_profile, values
            del session  # before the context releases memory
        return list(classes.values())

    def reuse(self, hit: dict, state: Rewritten, rule_ids: set[str]) -> tuple[MeasureReport, Rewritten]:
        """The whole selection of an earlier run on this very model (same file, rewrites, shapes, machine):
        rebuilt from its kept and dropped rewrites, reported as it was, every row marked cached. The kept
        selection is validated again (validated)."""
        kept = {tuple(k) for k in hit["kept"]}
        dropped = {tuple(k) for k in hit["dropped"]}
        if hit["dropped_everything"]:  # the exact rewrites stay (recorded since they do; older entries: none)
            exact = {tuple(k) for k in hit.get("exact", [])}
            kept, dropped = exact, (kept | dropped) - exact
        candidate = self.build(kept, dropped) if dropped else state
        r = self.report
        from_cache(hit["report"], r)
        r.dropped_everything = hit["dropped_everything"]
        r.note = "the selection of an earlier run on this model (decision cache)"
        r.seconds = time.perf_counter() - self.t0
        r.budget_s = hit["budget"]
        return r, candidate

    def validated(self, candidate: Rewritten, phase: Phases) -> tuple[MeasureReport, Rewritten]:
        """The kept selection validated again (a subset of validated rewrites can still interact), unless it is
        the full rewrite that was validated already."""
        if self.opts.validate and candidate is not self.state and candidate.eng.applications:
            with phase("validate"):
                outcome = self.validator.check(candidate.proto, candidate.info)
            if not outcome.ok:
                raise OnnxfuseError(f"the measured selection does not validate: {outcome.reason}; nothing written")
        return self.report, candidate

    def capture_estimate(self, regions: list[Region]) -> tuple[float, int]:
        """Seconds and runs capturing the regions' inputs takes, from the validator's session and runs."""
        values = len({v for r in regions for v in r.inputs})
        runs = -(-values // CAPTURE_CHUNK) * len(self.profiles)
        return self.validator.session_s + runs * self.validator.run_s, runs

    def plan(self, regions: list[Region], regions_s: float, on_model: int = 0) -> str:
        """Fit the budget to the steps around timing, once the regions are found (`regions_s` seconds): capture
        (estimated), one rebuild (what rewriting took), and a rebuild and a whole-model comparison per group of
        rewrites decided on the whole model (`on_model` groups), come on top of at least AUTO_MIN_S of timing in
        the automatic budget, up to AUTO_MAX_S (per GiB past 1 GiB). Why nothing can be timed ("" when something
        can): capture past CAPTURE_SHARE of a given budget, or those steps past the automatic budget's ceiling."""
        est, runs = self.capture_estimate(regions)
        steps = regions_s + est + self.rebuild_s
        if on_model:  # each group's rebuild and comparison (seconds on a 50 ms model: left out, those groups went
            # undecided), and the confirmation they would otherwise crowd out of the AUTO_MIN_S of timing (without
            # groups it fits there: BERT-base's optimize stays near 20 s)
            steps += self.whole_model_s() + on_model * self.group_s()
        if self.automatic:
            ceiling = AUTO_MAX_S * max(1.0, self.weights / 2**30)
            if steps + AUTO_MIN_S <= ceiling:
                self.budget = max(self.budget, steps + AUTO_MIN_S)
                self.deadline = self.t0 + self.budget
                return ""
            return (f"not measured: finding the regions, capturing their inputs ({runs} run(s) of the model) and "
                    f"rebuilding would take about {steps:.0f} s before any timing, past the {ceiling:g} s the "
                    "automatic budget allows; only exact rewrites are kept (--measure-budget S measures anyway, "
                    "--no-measure keeps every validated rewrite)")
        if est <= CAPTURE_SHARE * self.budget:
            return ""
        return (f"not measured: capturing the regions' inputs would take about {est:.0f} s (a session of the "
                f"model and {runs} run(s)), more than {CAPTURE_SHARE:.0%} of the {self.budget:g} s budget; only "
                "exact rewrites are kept (raise --measure-budget to measure, or --no-measure keeps every "
                "validated rewrite)")

    def time_for_pass(self, pass_s: float) -> bool:
        """Whether another pass (finding regions, capture and timing about as long as the last one took, and
        a rebuild) and the rebuild of this one still end before the deadline."""
        return time.perf_counter() + 2 * self.rebuild_s + pass_s <= self.deadline

    def unmeasured(self, why: str, regions: list[Region]) -> tuple[MeasureReport, Rewritten]:
        """Nothing timed: exact regions kept, the rest left as the original."""
        self.report.note = why
        exact = {k for r in regions if r.untimeable.endswith("(exact)") for k in r.keys}
        dropped = {k for r in regions for k in r.keys} - exact
        state = self.build(exact, dropped) if dropped else self.state
        self.report.seconds = time.perf_counter() - self.t0
        self.report.budget_s = self.budget
        return self.report, state

    # ---- timing one class ------------------------------------------------------------------------------------

    def time_class(self, c: RegionClass, deadline: float) -> GroupEffect:
        rep = c.regions[0]
        # building and loading its two versions (three sessions) costs about what loading that many bytes of
        # the model did in the capture session
        rate = self.weights / self.session_s if self.session_s > 0 and self.weights else float("inf")
        if time.perf_counter() + 1.5 * rep.weight_bytes / rate > self.deadline:
            raise OutOfBudget
        m = self.state.model
        opsets, ir = dict(m.opsets), m.proto.ir_version
        orig = region_model(rep, False, opsets, ir, c.feeds)
        fused = region_model(rep, True, opsets, ir, c.feeds)
        sessions = timing_sessions({"a": orig, "f": fused}, self.provider, self.opts.measure_threads,
                                   control=("a", "b"), wrap=Filtered)
        profiles = [(w, feeds) for (w, _), feeds in zip(self.profiles, c.feeds, strict=True)]
        times = interleave(sessions, profiles, estimator=self.estimator, min_runs=MIN_RUNS, deadline=deadline,
                           hard_deadline=self.deadline, max_runs=UNDECIDED_MAX_RUNS,
                           settled=lambda t: _region_verdict(t).decided)
        self.report.rounds += 1
        v = _region_verdict(times)
        each = sum(w * float(np.median(times.profile("a", p))) for p, (w, _) in enumerate(profiles))
        row = GroupEffect(rep.label, rep.rules, len(c.keys), v.faster, v.ratio, source="timed",
                          instances=len(c.regions), floor=v.floor, seconds_each=each,
                          share=abs(1 - v.ratio.median) * each * len(c.regions) / self.model_s
                          if self.model_s > 0 else None)
        if v.outcome == UNDECIDED:  # the budget ran out with the interval across the line: not "slower"
            row.source = UNDECIDED
        elif not v.faster:  # why, in words without numbers (alike rows are one row in the report)
            row.why = NOISE_PREFIX if v.word.startswith(NOISE_PREFIX) else v.word
        return row

    def _cached(self, key: str, kinds: tuple[str, ...]) -> dict | None:
        """A cached decision, unless it is "not reached" and this run was given (--measure-budget) a larger
        budget than the run that did not reach it: then it is timed now. Runs with the automatic budget reuse
        every decision, so two runs with the same flags write the same model."""
        hit = self.cache.get(key, kinds)
        if (hit is not None and hit.get("source") == "budget" and self.opts.measure_budget_s is not None
                and self.budget > hit.get("budget", 0.0)):
            return None
        if hit is not None and weak_evidence(hit) and (self.opts.measure_budget_s is not None and self.budget > hit.get(
                "budget", float("inf")) or _load_per_core() < hit.get("load", 0.0) - QUIETER):
            return None  # weak evidence, and this run can do better: a larger budget, or a quieter machine
        return hit

    def decide(self, classes: list[RegionClass], region_deadline: float) -> None:
        todo = []
        for c in classes:
            rep = c.regions[0]
            hit = self._cached(digest("region", c.sig, self.env), ("region",))
            if hit is not None and hit.get("source") == UNDECIDED:  # as undecided: the prior decides again
                c.decision = GroupEffect(rep.label, rep.rules, len(c.keys), False,
                                         Ratio(*hit["ratio"]) if hit.get("ratio") else None, source=UNDECIDED,
                                         instances=len(c.regions), floor=hit.get("floor", 0.0))
            elif hit is not None:
                c.decision = GroupEffect(rep.label, rep.rules, len(c.keys), bool(hit["keep"]),
                                         Ratio(*hit["ratio"]) if hit.get("ratio") else None,
                                         source="cached" if hit.get("source") != "budget" else "budget",
                                         instances=len(c.regions), floor=hit.get("floor", 0.0),
                                         share=hit.get("share"),
                                         why="decided by an earlier run" if hit.get("source") != "budget" else
                                         f"not reached within {hit.get('budget', 0):g} s by an earlier run")
            elif c.shape_only:
                c.decision = GroupEffect(rep.label, rep.rules, len(c.keys), True, None, source="exact",
                                         instances=len(c.regions), why="acts on shape values only")
            else:
                todo.append(c)
        todo.sort(key=lambda c: -c.weight)
        for k, c in enumerate(todo):
            rep = c.regions[0]
            key = digest("region", c.sig, self.env)
            now = time.perf_counter()
            share = (region_deadline - now) / (len(todo) - k)
            try:
                if share <= 0:
                    raise OutOfBudget
                c.decision = self.time_class(c, now + share)
            except OutOfBudget:
                c.decision = GroupEffect(rep.label, rep.rules, len(c.keys), False, None, source="budget",
                                         instances=len(c.regions))
                self.cache.put(key, {"kind": "region", "keep": False, "source": "budget",
                                     "budget": self.budget, "label": rep.label, "rules": rep.rules, **self.tag})
                continue
            except OnnxfuseError as e:  # a region that cannot run alone stays as the original
                c.decision = GroupEffect(rep.label, rep.rules, len(c.keys), False, None, source="untimed",
                                         instances=len(c.regions), why=str(e)[:200])
                continue
            d = c.decision
            assert d.effect is not None
            self.cache.put(key, {"kind": "region", "keep": d.kept, "source": d.source,
                                 "ratio": [d.effect.median, d.effect.low, d.effect.high], "floor": d.floor,
                                 **({"share": d.share} if d.share is not None else {}),
                                 "label": d.group, "rules": d.rules, "budget": self.budget, **self.evidence(),
                                 **self.tag})
        self.follow(classes)

    def follow(self, classes: list[RegionClass]) -> None:
        """The priors of `classes` (follow_peers), with the rules' expectations."""
        follow_peers(classes, {r.id: r.expect for r in self.rules})


    # ---- the whole model -------------------------------------------------------------------------------------

    def build(self, kept: set[Key], dropped: set[Key], deny_unmeasured: bool = True) -> Rewritten:
        """The model with the dropped rewrites denied; with `deny_unmeasured`, the kept rewrites are the only
        rule rewrites made (one that was not measured, a rule that fires only once a dropped one is gone, is
        left out), in one rebuild."""
        return rebuild(self.input_path, self.rules, self.base, set(self.deny) | dropped,
                       allow=set(kept) if deny_unmeasured else None)

    def fingerprint(self, original: Model) -> str:
        h = hashlib.sha256()
        for n in original.proto.graph.node:
            h.update(n.SerializeToString())
        for t in original.proto.graph.initializer:
            h.update(f"{t.name}{t.data_type}{list(t.dims)}".encode())
        for _, feeds in self.profiles:
            h.update(repr(sorted((k, v.dtype.str, v.shape) for k, v in feeds.items())).encode())
        return h.hexdigest()

    def comparison_s(self) -> float:
        """About what one whole-model comparison takes before its runs: four sessions (SESSIONS) and a warm-up round of
        each (from the capture run; the validator's where nothing was captured), in each of its generations of
        sessions (two where four sessions are made in REMAKE_S at most: measure/timing.py in_generations)."""
        session_s = self.session_s or self.validator.session_s
        return generations(SESSIONS * session_s) * SESSIONS * (session_s + self.run_s * len(self.profiles))

    def whole_model_s(self, rounds: int = MIN_RUNS_FLOOR) -> float:
        """About what one whole-model comparison takes with its runs: comparison_s and `rounds` interleaved
        rounds of its four sessions (at least COMPARE_MIN_S of runs). The confirmation needs its minimum
        (MIN_RUNS_FLOOR); a group decided on the whole model ON_MODEL_ROUNDS, since its effect is a few percent."""
        # a round of a short model is MODEL_ROUND_S of runs per session and profile (MEDIAN_OF runs at least where
        # they fit), half in each generation of sessions; a longer model's is one run, and each generation takes
        # half the rounds (measure/timing.py model_round_s)
        return self.comparison_s() + max(COMPARE_MIN_S, SESSIONS * self.rounds(rounds)
                                         * model_round_s(self.run_s) * len(self.profiles))

    @property
    def run_s(self) -> float:
        """One run of the model: the capture run's, or the validator's where nothing was captured."""
        return self.latency_s or self.validator.run_s

    def rounds(self, n: int) -> int:
        """`n` rounds of a whole-model comparison, for a model of MODEL_ROUND_S or longer (one run each); a
        shorter model's rounds hold several runs each (measure/timing.py), and as many of them are taken as hold
        the runs that `n` rounds of the model's length would (SHORT_MODEL_ROUNDS at least, `n` at most)."""
        if self.run_s >= MODEL_ROUND_S:
            return n
        return min(n, max(SHORT_MODEL_ROUNDS, math.ceil(n * self.run_s / MODEL_ROUND_S)))

    def group_s(self) -> float:
        """What deciding one group on the whole model takes: a rebuild and ON_MODEL_ROUNDS rounds of comparison."""
        return self.rebuild_s + self.whole_model_s(ON_MODEL_ROUNDS)

    def compared(self, key: str) -> Comparison | None:
        """A whole-model comparison decided by an earlier run (see _cached)."""
        hit = self._cached(key, ("model", "on model"))
        if hit is None:
            return None
        timed = hit.get("source") != "budget"
        return Comparison(Ratio(*hit["ratio"]) if hit.get("ratio") else None, hit.get("floor", 0.0),
                          [(n, w, Ratio(*r)) for n, w, r in hit.get("profiles", [])],
                          "cached" if timed else hit.get("why", "skipped"))

    def compare(self, base: str | Rewritten, candidate: Rewritten, key: str, kind: str, tag: dict,
                deadline: float | None = None, runs: int = CONFIRM_RUNS) -> Comparison:
        """Candidate against `base` (the input model's path, or a rebuilt selection) on the whole model,
        interleaved, two sessions of the candidate giving the noise floor; up to `runs` runs while `deadline`
        (default: the budget's) allows. Skipped (ratio None, status "skipped: why") when the budget
        or memory does not allow it; that, too, is cached under `key`, so that a run with the same budget makes
        the same choice."""
        weights = candidate.info.size_bytes + candidate.info.external_bytes
        why = ""
        # the sessions and one warm-up round must fit; whether MIN_RUNS_FLOOR runs do is decided after the warm-up
        # on the real (ORT_ENABLE_ALL) run times (interleaved), not on the capture's unoptimized ones
        cost = self.comparison_s()
        # the confirmation is what makes "never slower" true: it may run past the budget, by up to
        # CONFIRM_GRACE of it, rather than leave a kept selection unconfirmed
        limit = self.deadline + (CONFIRM_GRACE * self.budget if kind == "model" else 0.0)
        if SESSIONS * weights > default_budget_bytes():
            why = "skipped: four sessions of the model would not fit the memory budget"
        elif time.perf_counter() + cost > limit:
            why = f"skipped: it would take about {cost:.1f} s, past the budget"
        if why:
            self.cache.put(key, {"kind": kind, "source": "budget", "budget": self.budget, "why": why, **tag})
            return Comparison(None, status=why)
        cands: list[Candidate] = []
        try:  # files onnxruntime maps: no copy held here
            for m in (candidate, base):
                if isinstance(m, Rewritten):
                    cands.append(Candidate(m.proto, m.info))
            sources = {"o": base if isinstance(base, str) else cands[1].source, "c": cands[0].source}
            times = in_generations(
                lambda reverse: timing_sessions(sources, self.provider, self.opts.measure_threads,
                                                control=[("c", "c2"), ("o", "o2")], reverse=reverse),
                self.profiles, estimator=self.estimator, min_runs=self.rounds(runs),
                deadline=deadline or self.deadline, hard_deadline=limit, min_seconds=COMPARE_MIN_S,
                settled=_confirmed if kind == "model" else None)
        except OutOfBudget:
            why = "skipped: its runs would end past the budget"
            self.cache.put(key, {"kind": kind, "source": "budget", "budget": self.budget, "why": why, **tag})
            return Comparison(None, status=why)
        finally:
            for c in cands:
                c.close()
            release_memory()
        self.report.rounds += 1
        v = _model_verdict(times)
        aa = aa_contrast(times)
        out = Comparison(v.ratio, v.floor, wall=_model_verdict(times.read_on(WALL)).ratio,
                         aa_spread=(float(np.percentile(aa, 10)), float(np.percentile(aa, 90))))
        if len(self.profiles) > 1:  # prefill and decode each, not only their weighted total
            for p, (weight, _) in enumerate(self.profiles):
                per = {k: times.profile(k, p) for k in ("o", "o2", "c", "c2")}
                name = self.profile_names[p] if p < len(self.profile_names) else f"profile {p + 1}"
                out.profiles.append((name, weight, verdict(per, ("c", "c2"), ("o", "o2")).ratio))
        r = out.ratio
        assert r is not None
        self.cache.put(key, {"kind": kind, "source": "timed", "ratio": [r.median, r.low, r.high], **tag,
                             "floor": out.floor, "profiles": [[n, w, [x.median, x.low, x.high]]
                                                              for n, w, x in out.profiles], **self.evidence()})
        return out

    def confirm(self, candidate: Rewritten, key: str) -> Ratio | None:
        """Candidate against the original on the whole model (compare); the report gets its ratio, noise floor
        and per-profile ratios. None when it was skipped."""
        tag = {**self.tag, "rules": sorted({a.rule for a in candidate.eng.applications} - set(CLEANUP_STEPS))}
        c = self.compared(key) or self.compare(self.input_path, candidate, key, "model", tag)
        self.report.confirmed, self.report.floor, self.report.profiles = c.status, c.floor, c.profiles
        self.report.final_wall, self.report.aa_spread = c.wall, c.aa_spread
        return c.ratio

    def evidence(self) -> dict:
        """What a timed decision is stored with besides its interval and floor: the estimator that made it and
        how loaded the machine was (1-minute load average per core)."""
        return {"estimator": self.estimator, "load": round(_load_per_core(), 2)}


@dataclass
class Comparison:
    """A candidate against a base on the whole model: candidate / base, the noise floor (two sessions of the
    candidate), per shape profile where there are several; status: timed, cached, or skipped: why."""

    ratio: Ratio | None
    floor: float = 0.0
    profiles: list[tuple[str, float, Ratio]] = field(default_factory=list)
    status: str = "timed"
    wall: Ratio | None = None  # the same comparison on wall time (the estimator may be CPU time)
    aa_spread: tuple[float, float] | None = None  # p10, p90 of the four sessions' per-round A/A contrast


WEAK_LOAD = 1.0  # a wall-time decision taken with more runnable processes than cores is weak evidence
QUIETER = 0.5  # weak evidence is decided afresh on a machine this much less loaded (per core), or with a larger
# --measure-budget; else it is reused as it was (an undecided class follows its prior again), so that a second
# run on the same machine, or on an identical one, times nothing and writes the same bytes


def weak_evidence(hit: dict) -> bool:
    """A cached result that is not a firm decision: one the budget left undecided, or one taken on wall time
    while other processes loaded every core (wall time then measures the load as much as the rewrite)."""
    return hit.get("source") == UNDECIDED or (hit.get("estimator") == WALL and hit.get("load", 0.0) > WEAK_LOAD)


PRIORED = (UNDECIDED, "budget", "untimed")  # the sources measuring could not decide: a prior decides


def measured(effect: Ratio | None, floor: float) -> str | None:
    """"faster" or "slower" where the whole interval clears 1 by SIGNIFICANT plus the noise floor; None where it
    does not (no change measuring can tell from what two sessions of one model differ by: a prior decides)."""
    if effect is None:
        return None
    word = effect.verdict_beyond(floor)
    return word if word in ("faster", "slower") else None


def _expected(rules: list[str], expects: dict[str, str] | None) -> set[str]:
    return {(expects or {}).get(r, "unknown") for r in rules}


def _expects_faster(rules: list[str]) -> str:
    return f"kept: {', '.join(rules)} expect{'s' if len(rules) == 1 else ''} faster (expect:)"


def prior(rules: list[str], peers: list[tuple[bool, float]], expects: dict[str, str] | None,
          cost: OpCost | None) -> tuple[bool, str]:
    """Whether to keep a rewrite measuring could not decide, and which prior decided, first of: the classes of
    the same rewrite measured faster or slower in this run (`peers`: (faster, weight) each; kept if most of
    them by weight were faster); the rules' declared expectation (`expect:`): kept where every rule expects
    faster, left out where one expects neutral; for rules that declare nothing, the op-cost prior (op_prior.py:
    fewer kernel calls, no more bytes or FLOPs, into standard ops); else left as the original."""
    if peers:
        keep = 2 * sum(w for faster, w in peers if faster) > sum(w for _, w in peers)
        return keep, (f"follows the {count(len(peers), 'class', 'classes')} of this rewrite measured "
                      f"{'faster' if keep else 'slower'}")
    said = _expected(rules, expects)
    if said == {"faster"}:
        return True, _expects_faster(rules)
    if said == {"unknown"} and cost is not None and cost.removes_work:
        return True, f"kept: {cost.phrase()}"
    if said == {"unknown"}:
        return False, "nothing decided to follow"
    return False, f"nothing decided to follow; {', '.join(rules)} expect {'/'.join(sorted(said))}"


# A measured effect that changes the model's time by less than this share is too small for any comparison of the
# model to see (the confirmation counts a change from SIGNIFICANT plus the floor), and its verdict, clear at the
# scale of its region, goes either way from run to run: a Slice for one Gather + Unsqueeze in GPT-2's shape
# arithmetic measured 1.003-1.012 of its 20 us region (0.003% of the model), kept on one run and not the next; a
# Conv + Relu of ResNet-mini that onnxruntime fuses itself measured 0.973-0.978, decided faster on one run (and
# four classes of its rule followed it) and undecided on the next
MATERIAL = 0.005


# ... unless the effect is far from the line: an interval that clears 1 by this many margins (SIGNIFICANT plus the
# floor) is no coin flip, whatever its share. cnn_small's Conv + HardSigmoid + Mul measured 0.838-0.848 alone,
# 0.47-0.50% of the model: kept quiet, and left out loaded as immaterial with nothing to follow
CLEAR = 3.0


def material(d: GroupEffect) -> bool:
    """Whether a measured class changes enough of the model for its own verdict to decide it (unknown: yes)."""
    return d.share is None or d.share >= MATERIAL


def far(d: GroupEffect) -> bool:
    """Whether a measured class's interval lies CLEAR margins from 1: its own verdict decides it, whatever its share."""
    e, margin = d.effect, SIGNIFICANT + d.floor
    return e is not None and (e.high < 1 - CLEAR * margin or e.low > 1 + CLEAR * margin)


def _rewrite(d: GroupEffect) -> tuple:
    return d.group, tuple(d.rules)


def measured_peers(classes: list[RegionClass], key: Callable[[GroupEffect], tuple]
                   ) -> tuple[dict[tuple, list[tuple[bool, float]]], dict[tuple, float]]:
    """The classes measured faster or slower that a prior may follow, per rewrite (`key`): (faster, weight) each,
    those far from the line (`far`) always, the others where what their rewrite's measured classes save of the
    model adds up to MATERIAL; and that sum per rewrite, signed (inf where a share is unknown)."""
    firm: dict[tuple, list[tuple[bool, float, bool]]] = {}
    net: dict[tuple, float] = {}
    for c in classes:
        d = c.decision
        if d is not None and d.source in ("timed", "cached") and (m := measured(d.effect, d.floor)):
            k = key(d)
            firm.setdefault(k, []).append((m == "faster", c.weight, far(d)))
            net[k] = net.get(k, 0.0) + (float("inf") if d.share is None else d.share if m == "faster" else -d.share)
    peers = {k: [(f, w) for f, w, clear in v if clear or abs(net[k]) >= MATERIAL] for k, v in firm.items()}
    return {k: v for k, v in peers.items() if v}, net


def follow_peers(classes: list[RegionClass], expects: dict[str, str] | None = None) -> None:
    """Decide the classes measuring could not: those the budget left undecided, did not reach, or that cannot
    run alone; those measured with no change beyond the noise floor either way (a 1-3% effect the noise
    decides run by run would otherwise be kept on one run and dropped on the next); and those whose effect is
    immaterial to the model (MATERIAL). Each follows its prior (`prior`): first the classes of the same rewrite
    measured faster or slower, by weight: those far from the line always, the others where what they change of
    the model adds up to MATERIAL or more; where nothing is left to follow, the rules' expectation and the
    op-cost prior. `why` says which decided. The source stays what it was: a prior is never cached as a
    decision, and a measured class is cached with its interval and share, from which the next run derives the
    same choice. Deciding the same classes again (with more of them) gives the same `why` as deciding once."""
    peers, net = measured_peers(classes, _rewrite)
    for c in classes:
        d = c.decision
        if d is None or d.source not in PRIORED + ("timed", "cached"):
            continue
        if c.measured_why is None:
            c.measured_why = d.why
        key = _rewrite(d)
        counts = abs(net.get(key, 0.0)) >= MATERIAL
        m = measured(d.effect, d.floor) if d.source in ("timed", "cached") else None
        if d.source in ("timed", "cached"):
            if d.effect is None:
                continue  # a cached decision without its interval, as it was
            if m and (far(d) or material(d) and counts):
                continue  # measured faster or slower, far from the line or by enough of the model to count
        lead = "" if d.source == UNDECIDED or not c.measured_why else f"{c.measured_why}; "
        if m and not material(d):
            lead = f"{m} by {d.share:.3%} of the model (immaterial); "
        elif m:
            lead = f"{m}, but its rewrite's classes change {abs(net[key]):.2%} of the model in all (immaterial); "
        d.kept, why = prior(d.rules, peers.get(key, []), expects, c.regions[0].cost)
        d.why = lead + why


def aa_contrast(times) -> np.ndarray:
    """Per round, the four sessions' A/A contrast sqrt(c2/c x o2/o): a comparison of two sessions against two in
    which no change is (each side holds one session of each model), independent of the comparison itself and with
    the same per-round noise and the same variance of session offsets. Its spread is what the comparison shows of
    a change that is not there; one pair's ratio (c2 / c) spreads sqrt(2) times as wide."""
    c, c2, o, o2 = (np.asarray(times[k]) for k in ("c", "c2", "o", "o2"))
    return np.sqrt(c2 / c * (o2 / o))


def _region_verdict(times) -> Verdict:
    """A region's fused version ("f") against the mean of two sessions of its original ("a", "b")."""
    return verdict(times, "f", ("a", "b"))


def _model_verdict(times) -> Verdict:
    """A candidate (two sessions, "c", "c2") against its base (two, "o", "o2") on the whole model."""
    return verdict(times, ("c", "c2"), ("o", "o2"))


def _confirmed(times) -> bool:
    """Whether a confirmation's verdict is clear of the faster line: while it is not, it runs on within the
    budget (a selection 1.6-2.4% faster against a 1% margin, gpt2_tiny's, was kept whole when its interval
    cleared the line and cut to its best group when it did not: two outputs for one model, by the load)."""
    return _model_verdict(times).decided


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def automatic_budget(weights: int, spent_s: float) -> float:
    """The budget when none is given: what keeps the whole optimize near TOTAL_TARGET_S (`spent_s`, what loading,
    rewriting and validating took plus the final validation still to come, is subtracted), between AUTO_MIN_S
    and REGION_BUDGET_S; past 1 GiB of weights, REGION_BUDGET_S per GiB (loading the model is part of it)."""
    if weights > 2**30:
        return REGION_BUDGET_S * weights / 2**30
    return min(REGION_BUDGET_S, max(AUTO_MIN_S, TOTAL_TARGET_S - spent_s))


class Phases:
    """Seconds per phase, added up (a phase may run twice)."""

    def __init__(self, into: dict[str, float], peaks: dict[str, int],
                 starting: Callable[[str], None] = lambda name: None) -> None:
        self.into, self.peaks, self.starting = into, peaks, starting

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.starting(name)
        t = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - t
            self.peaks[name] = peak_rss_bytes()
