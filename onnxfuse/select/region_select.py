"""Measured selection by region, as a sequence: find the regions where rewrites act and make them units
(units.py); capture their inputs from runs of the original; time the classes of alike regions, largest
potential first, within the budget (region_run.py); time the groups decided on the whole model (on_model.py);
`decide` (decide.py) keeps or leaves out every unit from its evidence or its prior; the whole-model
confirmation guards the result and, where the whole measures no faster, falls back once, to what was kept on
its own firm measurement; the report is built from the decisions at the end.

A budget limits what is timed, never what is kept: a unit it does not reach follows its prior. Evidence is
cached (decision_cache.py), and so is the whole selection of a model, so that a second run times nothing and
writes the same bytes.
"""

from __future__ import annotations

import hashlib
import os

import onnx

from ..load.loader import load_model
from ..options import OptimizeOptions
from ..patterns.rules import Rule
from ..progress import Phase, quiet
from ..regions.cost import total
from ..regions.cut import Region, find_regions
from ..rewrite.engine import EngineOptions
from ..rewrite.rebuild import Rewritten
from ..tensors import all_tensors
from ..validate.runtime import release_memory
from ..validate.validate import Validator
from .cached_report import to_cache
from .classes import RegionClass
from .decide import Decision, Evidence, Origin, Reason, best_alone, decide, fall_back, firm_faster, why
from .decision_cache import DecisionCache, digest
from .on_model import groups_on_model, split_on_model, time_on_model
from .region_run import CAPTURE_SHARE, RegionRun, automatic_budget
from .report import GroupEffect, Key, MeasureReport, Phases
from .units import Kind, Unit, Untimeable

__all__ = ["automatic_budget", "region_selection"]

MAX_PASSES = 3  # rounds of region finding: the rewrites of the full run, then those dropped ones had shadowed
# (a bound, not measured)


def region_selection(input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
                     deny: set[Key], state: Rewritten, validator: Validator, cache: DecisionCache,
                     rewrite_s: float = 0.0, progress: Phase = quiet) -> tuple[MeasureReport, Rewritten]:
    """Keep the units that are faster (measured, or by their prior), confirm on the whole model, and return the
    report and the rewritten model to write. `rewrite_s`: what rewriting took (a rebuild costs about as much);
    `progress("measure: <step>", budget_s)` as each step starts."""
    run = RegionRun(input_path, rules, opts, base, deny, state, validator, cache, rewrite_s)
    phase = Phases(run.report.phases, run.report.phase_peaks, lambda name: progress(f"measure: {name}", run.cap))
    key = digest("selection", _file_digest(input_path, state.info.external_data),
                 repr(sorted(a.key for a in state.eng.applications)),
                 repr([sorted((k, v.dtype.str, v.shape) for k, v in f.items()) for _, f in run.profiles]), run.env)
    hit = cache.get(key, ("selection",)) if cache.enabled else None
    if hit is not None and (not hit["undecided"] or opts.measure_budget_s is None
                            or opts.measure_budget_s <= hit["budget"]):
        with phase("rebuild"):
            _, candidate = run.reuse(hit, state)
        return run.validated(candidate, phase)
    sel = _Selection(run, rules)
    candidate = sel.units_and_evidence(state, phase)
    candidate = sel.confirmed(candidate, phase)
    sel.report_rows()
    if not any(e is not None and not e.settled for e in sel.evidence.values()):  # else timed again next run
        cache.put(key, {"kind": "selection", "kept": sorted(map(list, sel.kept)),
                        "dropped": sorted(map(list, sel.all_keys - sel.kept)), "report": to_cache(run.report),
                        "undecided": run.report.undecided, "budget": run.cap,
                        "dropped_everything": run.report.dropped_everything, **run.tag,
                        "rules": sorted({k[0] for k in sel.kept})})
    cache.save()
    run.finish()
    return run.validated(candidate, phase)


class _Selection:
    """The units found so far, their evidence and decisions, and the rewrites those keep."""

    def __init__(self, run: RegionRun, rules: list[Rule]) -> None:
        self.run = run
        self.rule_ids = {r.id for r in rules}
        self.on_model_ids = {r.id for r in rules if r.measure == "model"}
        self.expects = {r.id: r.expect for r in rules}
        self.units: list[Unit] = []
        self.evidence: dict[str, Evidence] = {}
        self.seconds_each: dict[str, float] = {}
        self.decisions: dict[str, Decision] = {}
        self.fingerprint = ""
        self.built: tuple[frozenset[Key], Rewritten] | None = None  # the last rebuild: its kept rewrites, model
        self.other_spellings: set[Key] = set()  # denied in every later pass (_same_ops_there)

    def build(self, kept: set[Key], deny_unmeasured: bool = True) -> Rewritten:
        """The model with `kept` and none of the other rewrites found (one rebuild per distinct selection)."""
        if self.built is None or self.built[0] != kept:
            self.built = frozenset(kept), self.run.build(kept, self.all_keys - kept, deny_unmeasured)
        return self.built[1]

    def decide(self) -> dict[str, Decision]:
        self.decisions = decide(self.units, self.evidence, self.expects)
        return self.decisions

    @property
    def all_keys(self) -> set[Key]:
        return {k for u in self.units for k in u.keys}

    @property
    def kept(self) -> set[Key]:
        return {k for u in self.units if self.decisions[u.id].kept for k in u.keys}

    def _same_ops_there(self, dropped: set[Key], made: dict[Key, object], outputs_of: dict[str, tuple]) -> set[Key]:
        """Keys of the other spellings of what was dropped: every rule that makes a fused op a dropped rewrite made,
        rooted on a node that rewrite replaced. The op measured no faster there, so no later pass times it again
        under another rule's name (MultiHeadAttention dropped from cross-attention: not the heads rules' on the
        same block), and what they shadowed gets the pass (its scores' FusedMatMul)."""
        out: set[Key] = set()
        for key in dropped:
            a = made.get(key)
            fused = {op for op in getattr(a, "ops", ()) if "." in op}  # contrib ops, not the Reshapes around them
            if not fused:
                continue
            roots = {v for name in a.replaced for v in outputs_of.get(name, ())}
            out.update((r.id, v) for r in self.rules_making(fused) for v in roots)
        return out

    def rules_making(self, ops: set[str]) -> list:
        """The rules whose rewrite makes one of `ops` (qualified op types)."""
        return [r for r in self.run.rules if any(rn.call is not None and rn.call.qualified in ops
                                                 for rn in r.rewrite)]

    def units_and_evidence(self, state: Rewritten, phase: Phases) -> Rewritten:
        """The passes: regions found, captured and timed, decided; rules a dropped rewrite had shadowed fire in
        the next pass (a FusedMatMul inside an Attention that did not pay); then the groups on the whole model.
        Returns the candidate with the kept rewrites."""
        run = self.run
        current, apps, whole_units = state, state.eng.applications, []
        reserve = region_deadline = 0.0
        for pass_no in range(MAX_PASSES):
            pass_t0 = run.clock()
            with phase("regions"):
                original, _ = load_model(run.input_path)
                self.fingerprint = run.fingerprint(original)
                others, whole = split_on_model(find_regions(original, current.model, apps, self.rule_ids),
                                               self.on_model_ids)
                outputs_of = {n.name: tuple(n.output) for n in original.proto.graph.node}
                made = {a.key: a for a in current.eng.applications}
                timeable = [r for r in others if r.untimeable is None]
            with phase("capture"):
                classes, uncaptured = run.capture(original, timeable) if timeable else ([], [])
                del original
            if pass_no == 0:  # keep time for the confirmation and each group on the whole model
                reserve = run.whole_model_s() + run.rebuild_s
                region_deadline = max(run.deadline - reserve - run.group_s() * len(groups_on_model(whole)),
                                      run.clock() + CAPTURE_SHARE * run.deadline)
            with phase("time regions"):
                run.time_classes(classes, region_deadline)
            for r in others:  # timed: what timing needed (the models' constants, captured inputs) goes
                r.drop_models()
            release_memory()
            self._add(pass_no, classes, uncaptured, [r for r in others if r.untimeable is not None])
            whole_units += _group_units(f"m{pass_no}", groups_on_model(whole).items(), Kind.ON_MODEL)
            self.decide()
            dropped = (self.all_keys - self.kept) | {k for u in whole_units for k in u.keys}
            if not dropped:
                return current
            last = pass_no == MAX_PASSES - 1 or not run.time_for_pass(run.clock() - pass_t0)
            with phase("rebuild"):
                state.__dict__.pop("proto", None)  # the full rewrite's export is re-made if it is written
                self.built = None  # the previous pass's candidate goes before the next is built (peak memory)
                self.other_spellings |= self._same_ops_there(dropped, made, outputs_of)
                candidate = run.build(self.kept, dropped | self.other_spellings, deny_unmeasured=last)
                self.built = frozenset(self.kept), candidate
            new = {a.key for a in candidate.eng.applications if a.rule in self.rule_ids} - self.kept
            if not new or last:
                break
            current, apps = candidate, [a for a in candidate.eng.applications if a.key in new]
        self.units += whole_units
        self.decide()
        if whole_units:
            with phase("on model"):
                time_on_model(run, whole_units, self.kept - {k for u in whole_units for k in u.keys}, self.build,
                              self.fingerprint, reserve, self.rule_ids, self.evidence, self.decide)
            self.decide()
        with phase("rebuild"):
            return self.build(self.kept)

    def _add(self, pass_no: int, classes: list[RegionClass], uncaptured: list[Region], untimeable: list[Region]
             ) -> None:
        for c in classes:
            rep = c.regions[0]
            kind = Kind.EXACT if c.shape_only else Kind.UNTIMEABLE if c.failed else Kind.CLASS
            u = Unit(f"c{pass_no}:{c.sig}", rep.label, tuple(rep.rules), kind, frozenset(c.keys), len(c.regions),
                     c.weight, rep.cost is not None and rep.cost.removes_work,
                     rep.cost.phrase() if rep.cost is not None else "",
                     Untimeable.FAILED if c.failed else None, c.failed)
            self.units.append(u)
            if c.evidence is not None:
                self.evidence[u.id] = c.evidence
                self.seconds_each[u.id] = c.seconds_each
        alike: dict[tuple, list[Region]] = {}
        for r in uncaptured:
            alike.setdefault((r.label, tuple(r.rules)), []).append(r)
        self.units += _group_units(f"u{pass_no}", alike.items(), Kind.CLASS)
        for kind in (Kind.EXACT, Kind.UNTIMEABLE):
            alike = {}
            for r in untimeable:
                if r.untimeable.exact == (kind is Kind.EXACT):
                    alike.setdefault((r.label, tuple(r.rules), r.untimeable, r.detail), []).append(r)
            self.units += _group_units(('e' if kind is Kind.EXACT else 'x') + str(pass_no), alike.items(), kind)

    def confirmed(self, candidate: Rewritten, phase: Phases) -> Rewritten:
        """The kept selection against the original on the whole model; where it measures no faster, one
        fallback: only what was kept on its own firm measurement, confirmed in turn; where neither is faster
        and the whole is no better than the original, the exact rewrites alone."""
        run, report = self.run, self.run.report
        applied = _applied(candidate, self.rule_ids)
        exact_only = all(self.decisions[u.id].reason is Reason.EXACT for u in self.units
                         if self.decisions[u.id].kept)
        if not applied:
            report.dropped_everything = True
            report.confirmed = "not needed: no rewrite kept"
            return candidate
        room = run.cap - run.clock()
        if exact_only and run.whole_model_s() > room:
            report.confirmed = "not needed: only exact rewrites kept"
            return candidate
        with phase("confirm"):
            ratio = report.final = run.confirm(candidate, digest("model", self.fingerprint, repr(sorted(applied)),
                                                                 run.env))
        if ratio is None or ratio.faster_beyond(report.floor):
            return candidate
        slower, no_better = ratio.slower_beyond(report.floor), ratio.no_better(report.floor)
        how = "slower" if slower else "no faster than the original" if no_better else "within the noise floor"
        if exact_only:
            if slower:  # no evidence that even these help: none is made
                report.note = f"only exact rewrites were kept, and they measured {ratio.median:.3f} as a whole " \
                              "(slower): none is made"
                return self._undo(phase, how, exact_too=True)
            return candidate
        said = f"the kept selection measured {ratio.median:.3f} as a whole ({how})"
        fallback = self._fallback(how)
        if fallback is not None:
            what, decisions = fallback
            keys = {k for u in self.units if decisions[u.id].kept for k in u.keys}
            with phase("rebuild"):
                trial = self.build(keys)
            with phase("confirm"):
                alone = run.confirm(trial, digest("model", self.fingerprint,
                                                  repr(sorted(_applied(trial, self.rule_ids))), run.env))
            if alone is not None and alone.faster_beyond(report.floor):
                report.note = f"{said}; {what} measured {alone.median:.3f} alone: kept alone"
                report.final, self.decisions = alone, decisions
                return trial
            said += f"; {what} measured {alone.median:.3f} alone" if alone else ""
            report.final = ratio
        if not no_better:
            report.note = f"{said}: kept as it is"
            return candidate
        report.note = f"{said}: every timed rewrite is undone"
        return self._undo(phase, how, exact_too=False)

    def _fallback(self, how: str) -> tuple[str, dict[str, Decision]] | None:
        """The one fallback by groups: what was kept on its own firm measurement, where priors kept more; else
        the rewrite that saved the most alone (decide.best_alone). None where neither differs from the whole."""
        firm = fall_back(self.units, self.decisions, how)
        if {u.id for u in self.units if firm[u.id].kept} != {u.id for u in self.units if self.decisions[u.id].kept} \
                and any(firm_faster(d) and d.reason is not Reason.EXACT and d.kept for d in firm.values()):
            return "what was measured faster on its own", firm
        best = best_alone(self.units, self.decisions, self.evidence, how)
        return None if best is None else (f"{best[0]}, the group that saved the most alone,", best[1])

    def _undo(self, phase: Phases, how: str, exact_too: bool) -> Rewritten:
        """Leave out every kept unit but the exact ones (or those too)."""
        self.run.report.dropped_everything = True
        self.decisions = fall_back(self.units, self.decisions, how, firm_only=False, exact_too=exact_too)
        with phase("rebuild"):
            return self.build(self.kept)

    def report_rows(self) -> None:
        report = self.run.report
        report.groups = []
        for u in self.units:
            e, d = self.evidence.get(u.id), self.decisions[u.id]
            source = {Kind.EXACT: "exact", Kind.UNTIMEABLE: "untimed"}.get(u.kind) or (
                "budget" if e is None else "model" if u.kind is Kind.ON_MODEL else "undecided" if not e.settled
                else "cached" if e.origin is Origin.CACHE else "timed")
            how = why(u, e, d, self.expects)
            if u.kind is Kind.ON_MODEL and e is not None and e.origin is Origin.CACHE and not how:
                how = "cached"
            report.groups.append(GroupEffect(
                u.label, list(u.rules), len(u.keys), d.kept, e.effect if e else None, source, u.instances,
                e.floor if e else 0.0, self.seconds_each.get(u.id, 0.0), e.share if e else None, how))
        report.undecided = sum(1 for u in self.units if u.kind in (Kind.CLASS, Kind.ON_MODEL)
                               and u.id not in self.evidence)


def _group_units(prefix: str, groups, kind: Kind) -> list[Unit]:
    """One unit per group of regions ((label, rules, ...) -> regions), with their op-cost prior."""
    out = []
    for k, rs in groups:
        label, rules = k[0], k[1]
        cost = total([r.cost for r in rs])
        out.append(Unit(f"{prefix}:{label}:{','.join(rules)}:{k[2:]}", label, tuple(rules), kind,
                        frozenset(x for r in rs for x in r.keys), len(rs), float(len(rs)),
                        cost is not None and cost.removes_work, cost.phrase() if cost is not None else "",
                        rs[0].untimeable, rs[0].detail))
    return out


def _applied(candidate: Rewritten, rule_ids: set[str]) -> set[Key]:
    return {a.key for a in candidate.eng.applications if a.rule in rule_ids}


def _file_digest(path: str, external: bool) -> str:
    """The model file's bytes; with external data, also the size and modification time of each data file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    if external:
        folder = os.path.dirname(os.path.abspath(path))
        locations = {e.value for t in all_tensors(onnx.load(path, load_external_data=False).graph)
                     for e in t.external_data if e.key == "location"}
        for loc in sorted(locations):
            st = os.stat(os.path.join(folder, loc))
            h.update(f"{loc}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()
