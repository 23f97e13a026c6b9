"""One region selection's state and steps (the sequence is region_select.py): the regions' inputs captured from
runs of the original, each class of alike regions timed (measure/: sessions, one interleave, one verdict) into
its Evidence, the kept selection rebuilt and confirmed on the whole model, all within one budget counted on the
budget clock (measure/budget.py; `automatic_budget` when none is given). Nothing here decides: decide.py does."""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import OnnxfuseError
from ..inputs.budget import default_budget_bytes
from ..ir import Model
from ..measure.budget import budget_clock
from ..measure.clock import WALL, estimator_for, now
from ..measure.sessions import timing_sessions
from ..measure.stats import UNDECIDED, Ratio
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
from ..measure.verdicts import aa_contrast, model_settled, model_verdict, region_verdict, verdict
from ..options import OptimizeOptions
from ..patterns.rules import Rule
from ..regions.cut import Region
from ..regions.model import region_model, signature
from ..rewrite.engine import EngineOptions
from ..rewrite.fold import CLEANUP_STEPS
from ..rewrite.rebuild import Rewritten, rebuild
from ..validate.runtime import Candidate, release_memory, session_with_outputs
from ..validate.validate import Validator
from .cached_report import from_cache
from .classes import RegionClass
from .decide import Evidence, Origin
from .decision_cache import DecisionCache, digest, environment_key
from .report import Key, MeasureReport, Phases

__all__ = ["Comparison", "RegionRun", "automatic_budget"]

MIN_RUNS = 20  # interleaved rounds per region class, budget permitting, more while undecided (chosen, not measured)
SESSIONS = 4  # in a whole-model comparison: two of the candidate, two of its base (measure/sessions.py)
UNDECIDED_MAX_RUNS = 2000  # rounds at most while a class is undecided (a bound, not measured: its share of the
# deadline usually ends it first)
CAPTURE_CHUNK = 32  # region inputs fetched per run of the original (bounds their memory; a bound, not measured)
CONFIRM_RUNS = 20  # whole-model confirmation, budget permitting (and COMPARE_MIN_S of runs at least)
ON_MODEL_ROUNDS = 20  # rounds reserved per group decided on the whole model (8 left YOLOv8n's 6% layout gain at
# [0.89, 0.99], dropped in one run of two)
SHORT_MODEL_ROUNDS = 16  # rounds at least for a model shorter than MODEL_ROUND_S (with 10, cnn_small's A/A p90
# under load was 1.016-1.021 in 3 runs of 4; with 16, 1.002-1.005 in 3 of 3)
CONFIRM_GRACE = 0.5  # the confirmation may end this share of the deadline past it (the rest's deadline is the
# budget / 1.5): a kept selection is never left unconfirmed for want of a few seconds (chosen, not measured)
COMPARE_MIN_S = 1.0  # and runs on to about this many seconds (a 0.2 ms BERT block's 20 runs read 0.979-1.083
# around a real 1.14 and kept a slower selection)
# The automatic budget, on the budget clock: AUTO_BASE_S plus AUTO_RUNS runs of the model, within AUTO_MIN_S and
# AUTO_MAX_S (times the GiB of weights past 1 GiB). On 7 models of realistic size (selection_stability.py)
# measuring spent 22-62 s of budgets of 26-90 s quiet or loaded; a wall-time 40 s kept nothing on a loaded PicoDet
AUTO_BASE_S = 12.0
AUTO_RUNS = 225
AUTO_MIN_S = 12.0
AUTO_MAX_S = 90.0
CAPTURE_SHARE = 0.3  # capture stops at this share of the deadline, the rest follow their prior (a PicoDet's
# 1493-node capture took 1.0 s of its 36 s); region timing gets this share at least, whatever is reserved


class RegionRun:
    """One region selection: the state shared by its steps. Times are on the budget clock (`clock`, seconds
    since the selection began): `budget` is its deadline."""

    def __init__(self, input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
                 deny: set[Key], state: Rewritten, validator: Validator, cache: DecisionCache,
                 rewrite_s: float = 0.0) -> None:
        self.input_path, self.rules, self.opts, self.base, self.deny = input_path, rules, opts, base, deny
        self.state, self.validator, self.cache = state, validator, cache
        self.wall0 = time.perf_counter()
        self.estimator = estimator_for(validator.provider, opts.measure_threads)
        self.clock = budget_clock(self.estimator)
        self.weights = state.info.size_bytes + state.info.external_bytes
        self.automatic = opts.measure_budget_s is None
        # the budget said (given, or provisional until capture has run the model once: automatic_budget); all but
        # the confirmation's share of it is the deadline of everything else (budget)
        self.cap = opts.measure_budget_s if not self.automatic else automatic_budget(0.0, self.weights)
        self.rebuild_s = rewrite_s  # one rebuild of the model (about what rewriting it took; then as measured)
        self.env = environment_key(opts.target, opts.measure_threads)
        # what `cache show` lists beside a decision (not part of its key): the model it was first taken on
        self.tag = {"model": os.path.basename(input_path), "threads": opts.measure_threads}
        self.report = MeasureReport(opts.target, opts.measure_threads, 0, strategy="regions",
                                    estimator=self.estimator)
        self.provider = validator.provider
        self.profiles = validator.timing_profiles()
        self.profile_names = [name for name, _, _ in validator.profiles()]
        self.session_s = 0.0  # creating a session of the original (measured by capture), budget clock
        self.latency_s = 0.0  # one run of the original, slowest profile (measured by capture), budget clock
        # the same run's weighted total over the profiles on the estimator's clock: what a class's share of the
        # model is of (a region's time is on that clock; wall time under load made the shares 10x smaller)
        self.model_s = 0.0

    @property
    def deadline(self) -> float:
        """The deadline of everything but the confirmation, on the budget clock."""
        return self.cap / (1 + CONFIRM_GRACE)

    # ---- capture: the values at region boundaries, from runs of the original -----------------------------------

    def capture(self, original: Model, regions: list[Region]) -> tuple[list[RegionClass], list[Region]]:
        """Run the original with the regions' inputs as extra outputs (CAPTURE_CHUNK at a time) and group the regions into
        classes by signature (a class's first region keeps its inputs); stops at CAPTURE_SHARE of the budget. Returns
        (classes, regions not captured). The first run sets the automatic budget (the model's run time is known then)."""
        # what the runs feed; an overridable initializer left unfed (its default) is fetched like any value
        feeds_names = {k for _, feeds in self.profiles for k in feeds}
        wanted = [v for v in dict.fromkeys(v for r in regions for v in r.inputs) if v not in feeds_names]
        t = self.clock()
        classes: dict[str, RegionClass] = {}
        pending = list(regions)
        with session_with_outputs(original.proto, self.state.info, wanted, self.provider,
                                  self.opts.measure_threads) as session:
            self.session_s = self.clock() - t
            model_timed = self.model_s > 0  # (by an earlier pass's capture)
            while pending and (not classes or self.clock() < CAPTURE_SHARE * self.deadline):
                chunk: list[Region] = []
                names: set[str] = set()
                while pending and (not chunk or len(names | set(pending[0].inputs)) <= CAPTURE_CHUNK):
                    chunk.append(pending.pop(0))
                    names.update(chunk[-1].inputs)
                fetch = [v for v in wanted if v in names]
                per_profile = []
                for weight, feeds in self.profiles:
                    b, (w, c) = self.clock(), now()
                    values = dict(zip(fetch, session.run(fetch, feeds), strict=True)) if fetch else {}
                    b2, (w2, c2) = self.clock(), now()
                    self.latency_s = max(self.latency_s, b2 - b)
                    if not model_timed:
                        self.model_s += weight * ((w2 - w) if self.estimator == WALL else (c2 - c))
                    values.update({k: v for k, v in feeds.items() if k in names})
                    per_profile.append(values)
                if not model_timed and self.automatic:
                    self.cap = automatic_budget(self.model_s, self.weights)
                model_timed = True
                for r in chunk:
                    shapes = [[(str(p[v].dtype), tuple(p[v].shape)) for v in r.inputs] for p in per_profile]
                    sig = signature(r, shapes)
                    if sig not in classes:
                        classes[sig] = RegionClass(sig, [], [{v: p[v] for v in r.inputs} for p in per_profile])
                    classes[sig].regions.append(r)
                del per_profile, values
            del session  # before the context releases memory
        return list(classes.values()), pending

    def reuse(self, hit: dict, state: Rewritten) -> tuple[MeasureReport, Rewritten]:
        """The whole selection of an earlier run on this very model (same file, rewrites, shapes, machine):
        rebuilt from its kept and dropped rewrites, reported as it was, every row marked cached. The kept
        selection is validated again (validated)."""
        kept = {tuple(k) for k in hit["kept"]}
        dropped = {tuple(k) for k in hit["dropped"]}
        candidate = self.build(kept, dropped) if dropped else state
        r = self.report
        from_cache(hit["report"], r)
        r.dropped_everything = hit["dropped_everything"]
        r.note = "the selection of an earlier run on this model (decision cache)"
        self.finish()
        r.budget_s = hit["budget"]
        return r, candidate

    def finish(self) -> None:
        self.report.seconds = time.perf_counter() - self.wall0
        self.report.spent_s = self.clock()
        self.report.budget_s = self.cap

    def validated(self, candidate: Rewritten, phase: Phases) -> tuple[MeasureReport, Rewritten]:
        """The kept selection validated again (a subset of validated rewrites can still interact), unless it is
        the full rewrite that was validated already."""
        if self.opts.validate and candidate is not self.state and candidate.eng.applications:
            with phase("validate"):
                outcome = self.validator.check(candidate.proto, candidate.info)
            if not outcome.ok:
                raise OnnxfuseError(f"the measured selection does not validate: {outcome.reason}; nothing written")
        return self.report, candidate

    def time_for_pass(self, pass_s: float) -> bool:
        """Whether another pass (finding regions, capture and timing about as long as the last one took, and
        a rebuild) and the rebuild of this one still end before the deadline."""
        return self.clock() + 2 * self.rebuild_s + pass_s <= self.deadline

    # ---- timing the classes ----------------------------------------------------------------------------------

    def time_class(self, c: RegionClass, deadline: float) -> Evidence:
        """The class's fused version against two sessions of its original, on its first region's inputs."""
        rep = c.regions[0]
        # building and loading its two versions (three sessions) costs about what loading that many bytes of
        # the model did in the capture session
        rate = self.weights / self.session_s if self.session_s > 0 and self.weights else float("inf")
        if self.clock() + 1.5 * rep.weight_bytes / rate > self.deadline:
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
                           settled=lambda t: region_verdict(t).decided, clock=self.clock)
        self.report.rounds += 1
        v = region_verdict(times)
        c.seconds_each = sum(w * float(np.median(times.profile("a", p))) for p, (w, _) in enumerate(profiles))
        share = abs(1 - v.ratio.median) * c.seconds_each * len(c.regions) / self.model_s if self.model_s > 0 else None
        return Evidence(v.ratio, v.floor, share, settled=v.decided or v.faster)

    def _cached(self, key: str, kinds: tuple[str, ...]) -> dict | None:
        """A cached result, unless it is weak evidence (weak_evidence) and this run can do better (a larger
        --measure-budget, or a quieter machine): runs with the same flags write the same model."""
        hit = self.cache.get(key, kinds)
        if hit is not None and weak_evidence(hit) and (self.opts.measure_budget_s is not None and self.cap > hit.get(
                "budget", float("inf")) or _load_per_core() < hit.get("load", 0.0) - QUIETER):
            return None
        return hit

    def cached_evidence(self, c: RegionClass) -> Evidence | None:
        hit = self._cached(digest("region", c.sig, self.env), ("region",))
        if hit is None or not hit.get("ratio"):
            return None
        return Evidence(Ratio(*hit["ratio"]), hit.get("floor", 0.0), hit.get("share"), Origin.CACHE,
                        settled=hit.get("source") != UNDECIDED)

    def time_classes(self, classes: list[RegionClass], region_deadline: float) -> None:
        """Each class's evidence: cached, or timed now, largest potential first, each within its share of what
        is left before `region_deadline`; what is not reached has none (its prior decides)."""
        todo = []
        for c in classes:
            c.evidence = self.cached_evidence(c)
            if c.evidence is None and not c.shape_only:
                todo.append(c)
        todo.sort(key=lambda c: -c.potential)
        for k, c in enumerate(todo):
            t = self.clock()
            share = (region_deadline - t) / (len(todo) - k)
            if share <= 0:
                break
            try:
                c.evidence = self.time_class(c, t + share)
            except OutOfBudget:
                continue
            except OnnxfuseError as e:  # a region that cannot run alone: its prior decides
                c.failed = str(e)[:200]
                continue
            e = c.evidence
            rep = c.regions[0]
            self.cache.put(digest("region", c.sig, self.env), {
                "kind": "region", "source": "timed" if e.settled else UNDECIDED,
                "ratio": [e.effect.median, e.effect.low, e.effect.high], "floor": e.floor,
                **({"share": e.share} if e.share is not None else {}), "label": rep.label, "rules": rep.rules,
                "budget": self.cap, **self.evidence(), **self.tag})

    # ---- the whole model -------------------------------------------------------------------------------------

    def build(self, kept: set[Key], dropped: set[Key], deny_unmeasured: bool = True) -> Rewritten:
        """The model with the dropped rewrites denied; with `deny_unmeasured`, the kept rewrites are the only
        rule rewrites made (one that was not measured, a rule that fires only once a dropped one is gone, is
        left out), in one rebuild."""
        t = self.clock()
        out = rebuild(self.input_path, self.rules, self.base, set(self.deny) | dropped,
                      allow=set(kept) if deny_unmeasured else None)
        self.rebuild_s = self.clock() - t
        return out

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
        """About what one whole-model comparison takes before its runs: SESSIONS sessions and a warm-up round of each
        (the capture's session and run times, else the validator's), in each generation of sessions (timing.generations)."""
        session_s = self.session_s or self.validator.session_s
        return generations(SESSIONS * session_s) * SESSIONS * (session_s + self.run_s * len(self.profiles))

    def whole_model_s(self, rounds: int = MIN_RUNS_FLOOR) -> float:
        """About what one whole-model comparison takes with `rounds` rounds of runs (model_round_s each, COMPARE_MIN_S of
        runs at least): MIN_RUNS_FLOOR for the confirmation, ON_MODEL_ROUNDS for a group on the whole model."""
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
        """`n` rounds of a whole-model comparison for a model of MODEL_ROUND_S or longer; a shorter model's rounds hold
        several runs, and as many rounds are taken as hold the runs `n` would (SHORT_MODEL_ROUNDS to `n`)."""
        if self.run_s >= MODEL_ROUND_S:
            return n
        return min(n, max(SHORT_MODEL_ROUNDS, math.ceil(n * self.run_s / MODEL_ROUND_S)))

    def group_s(self) -> float:
        """What deciding one group on the whole model takes: a rebuild and ON_MODEL_ROUNDS rounds of comparison."""
        return self.rebuild_s + self.whole_model_s(ON_MODEL_ROUNDS)

    def compared(self, key: str) -> Comparison | None:
        """A whole-model comparison decided by an earlier run (see _cached)."""
        hit = self._cached(key, ("model", "on model"))
        if hit is None or not hit.get("ratio"):
            return None
        return Comparison(Ratio(*hit["ratio"]), hit.get("floor", 0.0),
                          [(n, w, Ratio(*r)) for n, w, r in hit.get("profiles", [])], "cached")

    def compare(self, base: str | Rewritten, candidate: Rewritten, key: str, kind: str, tag: dict,
                deadline: float | None = None, runs: int = CONFIRM_RUNS) -> Comparison:
        """Candidate against `base` (the input's path, or a rebuilt selection) on the whole model, two sessions of each,
        up to `runs` rounds while `deadline` (default: the budget's) allows; the result is cached under `key`. Skipped
        (ratio None, status "skipped: why") where the budget or memory does not allow it; a skip is not cached."""
        weights = candidate.info.size_bytes + candidate.info.external_bytes
        why = ""
        # the sessions and one warm-up round must fit; whether MIN_RUNS_FLOOR runs do is decided after the warm-up
        # on the real (ORT_ENABLE_ALL) run times (interleaved), not on the capture's unoptimized ones
        cost = self.comparison_s()
        # the confirmation is what makes "never slower" true: it may run past the budget, by up to
        # CONFIRM_GRACE of it, rather than leave a kept selection unconfirmed
        limit = self.cap if kind == "model" else self.deadline
        if SESSIONS * weights > default_budget_bytes():
            why = "skipped: four sessions of the model would not fit the memory budget"
        elif self.clock() + cost > limit:
            why = f"skipped: it would take about {cost:.1f} s, past the budget"
        if why:  # not cached: a skip is no evidence
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
                settled=model_settled if kind == "model" else None, clock=self.clock)
        except OutOfBudget:
            return Comparison(None, status="skipped: its runs would end past the budget")
        finally:
            for c in cands:
                c.close()
            release_memory()
        self.report.rounds += 1
        v = model_verdict(times)
        aa = aa_contrast(times)
        out = Comparison(v.ratio, v.floor, wall=model_verdict(times.read_on(WALL)).ratio,
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


WEAK_LOAD = 1.0  # a wall-time decision taken with more runnable processes than cores is weak evidence (the
# definition of an oversubscribed machine, not a measured threshold)
QUIETER = 0.5  # weak evidence is decided afresh on a machine this much less loaded (per core), or with a larger
# --measure-budget; else it is reused as it was (an undecided class follows its prior again), so that a second
# run on the same machine, or on an identical one, times nothing and writes the same bytes


def weak_evidence(hit: dict) -> bool:
    """A cached result that is not a firm decision: one the budget left undecided, or one taken on wall time
    while other processes loaded every core (wall time then measures the load as much as the rewrite)."""
    return hit.get("source") == UNDECIDED or (hit.get("estimator") == WALL and hit.get("load", 0.0) > WEAK_LOAD)


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def automatic_budget(run_s: float, weights: int) -> float:
    """The budget when none is given, on the budget clock, for a model whose run takes `run_s` (on the
    estimator's clock: load does not change it): AUTO_BASE_S and AUTO_RUNS runs, between AUTO_MIN_S and
    AUTO_MAX_S, times the GiB of weights past 1 GiB (loading a session of the model is part of it)."""
    return min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_BASE_S + AUTO_RUNS * run_s)) * max(1.0, weights / 2**30)
