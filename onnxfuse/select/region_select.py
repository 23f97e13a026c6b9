"""Measured selection by region: each class of alike regions (see regions.py) is timed once, its original
version against its fused one, as two small models on the inputs they had when the original model ran; then one
whole-model confirmation, candidate against original. The whole phase keeps to one budget (--measure-budget):
what the budget did not reach stays as the original, and the report says so. Decisions go to the persistent
decision cache (decision_cache.py), so a second run, or a model of the same architecture, times nothing it has
decided before and writes the same output.

A region's decision: its fused version is kept where it is faster than its original by more than SIGNIFICANT plus
the noise floor (the difference between two sessions of the original version, timed alongside), and left out
where it is slower by as much. Between the two, measuring cannot tell the rewrite from what two sessions of one
model differ by, and a decision by the interval would be a coin flip that changes from run to run (and with the
load on the machine): a prior decides (region_run.prior: the classes of the same rewrite measured either way,
the rules' `expect:`, the op-cost prior), and the report says which.
"""

from __future__ import annotations

import hashlib
import os
import time

import onnx

from ..load.loader import load_model
from ..measure.stats import UNDECIDED
from ..options import OptimizeOptions
from ..patterns.rules import Rule
from ..progress import Phase, quiet
from ..rewrite.engine import EngineOptions
from ..rewrite.rebuild import Rewritten
from ..tensors import all_tensors
from ..validate.runtime import release_memory
from ..validate.validate import Validator
from .cached_report import to_cache
from .decision_cache import DecisionCache, digest
from .on_model import decide_on_model, groups_on_model, split_on_model
from .region_run import CONFIRM_GRACE, MATERIAL, Phases, RegionClass, RegionRun, automatic_budget
from .regions import Region, find_regions
from .rounds import GroupEffect, Key, MeasureReport

__all__ = ["automatic_budget", "region_selection"]

MAX_PASSES = 3  # rounds of region finding: the rewrites of the full run, then those dropped ones had shadowed


def region_selection(input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
                     deny: set[Key], state: Rewritten, validator: Validator,
                     cache: DecisionCache, spent_s: float = 0.0, rewrite_s: float = 0.0,
                     progress: Phase = quiet) -> tuple[MeasureReport, Rewritten]:
    """Keep the region classes that are faster (timed, or decided before), confirm on the whole model, and
    return the report and the rewritten model to write. `spent_s`: what optimize took before measuring;
    `rewrite_s`: what rewriting took (a rebuild costs about as much); `progress("measure: <step>", budget_s)` as
    each step starts."""
    run = RegionRun(input_path, rules, opts, base, deny, state, validator, cache, spent_s, rewrite_s)
    report = run.report
    phase = Phases(report.phases, report.phase_peaks, lambda name: progress(f"measure: {name}", run.budget))
    rule_ids = {r.id for r in rules}
    on_model_ids = {r.id for r in rules if r.measure == "model"}  # decided on the whole model (on_model.py)
    selection_key = digest("selection", _file_digest(input_path, state.info.external_data), repr(sorted(a.key for a in state.eng.applications)),
                           repr([sorted((k, v.dtype.str, v.shape) for k, v in f.items()) for _, f in run.profiles]),
                           run.env)
    hit = cache.get(selection_key, ("selection",)) if cache.enabled else None
    if hit is not None and (not hit["undecided"] or opts.measure_budget_s is None
                            or opts.measure_budget_s <= hit["budget"]):
        with phase("rebuild"):
            _, candidate = run.reuse(hit, state, rule_ids)
        return run.validated(candidate, phase)
    kept: set[Key] = set()
    dropped: set[Key] = set()
    all_regions: list[Region] = []
    all_classes: list[RegionClass] = []
    on_model: list[Region] = []
    current, apps = state, state.eng.applications
    for pass_no in range(MAX_PASSES):
        # later passes: rules that fire only once a dropped rewrite is gone (a MultiHeadAttention, then a
        # FusedMatMul, inside an Attention that did not pay) are measured too; after the last pass, or when
        # another would not fit the budget, they are left out
        pass_t0 = time.perf_counter()
        with phase("regions"):
            original, _ = load_model(input_path)
            fingerprint = run.fingerprint(original)
            regions, whole = split_on_model(find_regions(original, current.model, apps, rule_ids), on_model_ids)
            timeable = [r for r in regions if not r.untimeable]
        on_model += whole
        if pass_no == 0 and (why := run.plan(timeable, time.perf_counter() - pass_t0,
                                             len(groups_on_model(whole)))):
            return run.validated(run.unmeasured(why, regions + whole)[1], phase)
        with phase("capture"):
            classes = run.capture(original, timeable) if timeable else []
            del original
        if pass_no == 0:  # keep time for the confirmation (four sessions of the models and its minimum runs),
            # and for each group of rewrites decided on the whole model a rebuild and ON_MODEL_ROUNDS rounds
            reserve = run.whole_model_s() + run.rebuild_s
            region_deadline = max(run.deadline - reserve - run.group_s() * len(groups_on_model(whole)),
                                  time.perf_counter() + 0.3 * run.budget)
        with phase("time regions"):
            run.decide(classes, region_deadline)
        for r in regions:  # decided: what timing needed (constants of the models, captured inputs) goes
            r.drop_models()
        for c in classes:
            c.feeds = []
        release_memory()
        all_regions += regions
        all_classes += classes
        kept |= _kept_keys(regions, classes)
        dropped |= {k for r in regions for k in r.keys} - kept
        dropped |= {k for r in whole for k in r.keys}  # left out until decided on the whole model, below
        if not dropped:
            candidate = current
            break
        last = pass_no == MAX_PASSES - 1 or not run.time_for_pass(time.perf_counter() - pass_t0)
        with phase("rebuild"):
            current = None  # a candidate of the previous pass is not needed any more
            state.__dict__.pop("proto", None)  # nor the full rewrite's export (re-made if it is written)
            t = time.perf_counter()
            candidate = run.build(kept, dropped, deny_unmeasured=last)
            run.rebuild_s = time.perf_counter() - t
        new = {a.key for a in candidate.eng.applications if a.rule in rule_ids} - kept
        if not new or last:
            break
        current, apps = candidate, [a for a in candidate.eng.applications if a.key in new]
    if len(all_classes) > len(classes):
        # a later pass's classes are peers of the earlier passes' too: a rewrite whose one class was decided by its
        # rule's expectation in the first pass (rmsnorm-zero-skip, 1.26 alone, 0.4% of an int8 BERT) follows its
        # classes measured in the next
        run.follow(all_classes)
        now_kept = _kept_keys(all_regions, all_classes)
        if now_kept != kept:
            kept = now_kept
            dropped = ({k for r in all_regions for k in r.keys} - kept) | {k for r in on_model for k in r.keys}
            with phase("rebuild"):
                candidate = run.build(kept, dropped)
    report.groups = [c.decision for c in all_classes if c.decision is not None] + _untimed_rows(all_regions)
    on_rows: list[tuple[set[Key], GroupEffect]] = []  # the groups decided on the whole model: keys, row
    if on_model:
        with phase("on model"):
            candidate, rows = decide_on_model(run, on_model, kept, dropped, candidate, rule_ids, fingerprint,
                                              reserve, all_classes)
        report.groups += rows
        on_rows = [({k for r in rs for k in r.keys}, row)
                   for rs, row in zip(groups_on_model(on_model).values(), rows, strict=True)]
    regions = all_regions + on_model
    applied = {a.key for a in candidate.eng.applications if a.rule in rule_ids}
    report.undecided = sum(1 for g in report.groups if g.source == "budget")
    timed_kept = any(g.kept and g.source != "exact" for g in report.groups)  # (a prior's too: confirmed)
    exact_only = applied and not timed_kept  # removing nodes, shape arithmetic
    # only exact rewrites are timed too where the time a confirmation may take (the budget, and CONFIRM_GRACE of
    # it past it) allows: the effect said is then the one measured, as bench and profile of the pair measure it
    room = run.deadline + CONFIRM_GRACE * run.budget - time.perf_counter()
    if exact_only and run.whole_model_s() > room:
        report.confirmed = "not needed: only exact rewrites kept"
    elif applied:
        with phase("confirm"):
            ratio = run.confirm(candidate, digest("model", fingerprint, repr(sorted(applied)), run.env))
        report.final = ratio
        # never slower: beyond the noise floor, or with the whole interval above 1 (by SIGNIFICANT) even where two
        # sessions of one candidate differ as much: a selection measured slower has no evidence that it helps.
        # Nor has one measured no faster at all (its median at 1 or above) where something is kept for its timing
        # or a prior: its parts did not compose (transformer_small kept Attention, EmbedLayerNormalization and
        # BiasGelu at 1.008 [1.004, 1.010] with a 1% floor, where the Attention alone measured 0.893; an int8 BERT
        # kept a BiasGelu by its rule's expectation at 1.013 [1.004, 1.027])
        measured_slower = ratio is not None and ratio.slower_beyond(report.floor)
        no_better = ratio is not None and ratio.no_better(report.floor) and not exact_only
        # not measured faster (within the noise floor): the best group alone is tried as well, and kept if it
        # measures faster, whichever side of 1 the selection's median fell (transformer_small: the same regions'
        # decisions measured 0.992 as a whole quiet, kept, and 1.004 loaded, where the Attention alone measured
        # 0.913 and was kept alone: a median a hair either side of 1 decided between two outputs 8% apart)
        unproven = ratio is not None and not exact_only and ratio.verdict_beyond(report.floor) != "faster"
        everything = {k for r in regions for k in r.keys}
        if measured_slower and exact_only:  # no evidence that even these help: none is made
            report.note = (f"only exact rewrites were kept, and they measured {ratio.median:.3f} as a whole "
                           "(slower): none is made")
            report.dropped_everything = True
            for gr in report.groups:
                gr.kept = False
            kept = set()
            with phase("rebuild"):
                candidate = run.build(set(), everything)
        elif no_better or unproven:
            how = "slower" if measured_slower else "no faster than the original" if no_better else \
                "within the noise floor"
            exact = _exact_keys(all_regions, all_classes)
            # regions timed alone need not compose (a pair of fusions can let onnxruntime's own session fusions
            # make a slow kernel, as an Attention with an EmbedLayerNormalization did on Electra): the group that
            # saved the most alone is confirmed alone before all is undone
            best = _best_group(all_classes)
            alone = None
            if best is not None and applied - exact <= best[1]:
                best = None  # the group is the whole selection: measured already
            riders: set[Key] = set()
            if best is not None and time.perf_counter() + run.rebuild_s + run.whole_model_s() <= \
                    run.deadline + 0.5 * run.budget:
                label, keys = best
                riders = _riders(all_classes, keys, on_rows)
                keys = keys | riders
                with phase("rebuild"):
                    trial = run.build(exact | keys, everything - exact - keys)
                applied_alone = {a.key for a in trial.eng.applications if a.rule in rule_ids}
                with phase("confirm"):
                    alone = run.confirm(trial, digest("model", fingerprint, repr(sorted(applied_alone)), run.env))
            if alone is not None and alone.verdict_beyond(report.floor) == "faster":
                along = f" (with {len(riders)} rewrite(s) too small for the whole model to see)" if riders else ""
                report.note = (f"the kept selection measured {ratio.median:.3f} as a whole ({how}); {label}, "
                               f"the group that saved the most alone, measured {alone.median:.3f} alone{along}: "
                               "kept alone")
                report.final, candidate = alone, trial
                kept, dropped = exact | keys, everything - exact - keys
                for c in all_classes:
                    if c.decision is not None and c.decision.kept and not set(c.keys) <= keys:
                        c.decision.kept = False
                        c.decision.why = f"dropped: the selection with it measured {how} as a whole"
                for group_keys, gr in on_rows:
                    if gr.kept and not group_keys <= keys:
                        gr.kept = False
                        gr.why = f"dropped: the selection with it measured {how} as a whole"
            elif not no_better:  # the selection stays as it is: nothing measured better
                report.note = (f"the kept selection measured {ratio.median:.3f} as a whole ({how})"
                               + (f"; {best[0]}, the group that saved the most alone, measured {alone.median:.3f}"
                                  " alone" if alone is not None and best is not None else "")
                               + ": kept as it is")
            else:
                # every timed decision is undone; the exact rewrites (removing nodes, shape arithmetic), which
                # cannot have made it slower, stay, as where nothing is measured (RegionRun.unmeasured)
                report.dropped_everything = True
                report.final = ratio
                report.note = (f"the kept selection measured {ratio.median:.3f} as a whole ({how})"
                               + (f"; {best[0]}, the group that saved the most alone, measured {alone.median:.3f}"
                                  " alone" if alone is not None and best is not None else "")
                               + ": every timed rewrite is undone")
                for gr in report.groups:
                    gr.kept = gr.source == "exact"
                with phase("rebuild"):
                    candidate = run.build(exact, everything - exact)
    else:
        report.dropped_everything = True
        report.confirmed = "not needed: no rewrite kept"
    if not any(g.source == UNDECIDED for g in report.groups):  # else found again class by class (region_run)
        cache.put(selection_key, {
            "kind": "selection", "kept": sorted(map(list, kept)), "dropped": sorted(map(list, dropped)),
            "report": to_cache(report), "undecided": report.undecided, "budget": run.budget,
            "dropped_everything": report.dropped_everything, **run.tag,
            "exact": sorted(map(list, _exact_keys(all_regions, all_classes))), "rules": sorted({k[0] for k in kept})})
    cache.save()
    report.seconds = time.perf_counter() - run.t0
    report.budget_s = run.budget
    return run.validated(candidate, phase)


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


def _best_group(classes: list[RegionClass]) -> tuple[str, set[Key]] | None:
    """The kept timed group (fused ops and rules alike) whose classes saved the most time alone, with its keys."""
    saved: dict[tuple, float] = {}
    keys: dict[tuple, set[Key]] = {}
    for c in classes:
        d = c.decision
        if d is None or not d.kept or d.source not in ("timed", "cached") or d.gain is None:
            continue
        g = (d.group, tuple(d.rules))
        saved[g] = saved.get(g, 0.0) + d.gain * max(d.seconds_each, 1e-9) * len(c.regions)
        keys.setdefault(g, set()).update(c.keys)
    if not saved:
        return None
    g = max(saved, key=lambda k: saved[k])
    return f"{g[0]} ({', '.join(g[1])})", keys[g]


def _riders(classes: list[RegionClass], best: set[Key], on_rows: list[tuple[set[Key], GroupEffect]]) -> set[Key]:
    """The kept rewrites outside the best group that no whole-model comparison can see: the kept classes timed
    alone whose shares of the model (what each changes of it) add up to less than MATERIAL, and the groups of the
    same rules kept on the whole model (they follow those classes). They go with the best group where it is
    confirmed alone, for they cannot be why the whole selection measured no faster; left out, which side of the
    faster line the whole selection's interval fell decided them. gpt2_tiny, with 2 busy loops on 2 cores: its
    selection measured 0.988 as a whole (the line at 0.990), its FastGelu 0.983 alone, and 49 Slices for Gather +
    Unsqueeze (0.01-0.03% of the model per class) left with the rest, where quiet they were kept (0.986)."""
    keys: set[Key] = set()
    rules: set[str] = set()
    total = 0.0
    for c in classes:
        d = c.decision
        if d is None or not d.kept or d.source not in ("timed", "cached") or d.share is None or set(c.keys) <= best:
            continue
        total += d.share
        keys.update(c.keys)
        rules.update(d.rules)
    if total >= MATERIAL:
        return set()
    for group_keys, row in on_rows:
        if row.kept and set(row.rules) <= rules:
            keys.update(group_keys)
    return keys - best


def _kept_keys(regions: list[Region], classes: list[RegionClass]) -> set[Key]:
    """The rewrites of classes decided kept, and of regions kept without timing because they only remove nodes."""
    return ({k for c in classes if c.decision and c.decision.kept for k in c.keys}
            | {k for r in regions if r.untimeable.endswith("(exact)") for k in r.keys})


def _exact_keys(regions: list[Region], classes: list[RegionClass]) -> set[Key]:
    """The rewrites kept without timing because they are exact: regions that only remove nodes, and classes that
    act on shape values only."""
    return ({k for r in regions if r.untimeable.endswith("(exact)") for k in r.keys}
            | {k for c in classes if c.decision is not None and c.decision.source == "exact" for k in c.keys})


def _untimed_rows(regions: list[Region]) -> list[GroupEffect]:
    """One report row per kind of region that was not timed alone (exact ones are kept)."""
    alike: dict[tuple, list[Region]] = {}
    for r in regions:
        if r.untimeable:
            alike.setdefault((r.label, tuple(r.rules), r.untimeable), []).append(r)
    rows = []
    for (label, rules_, why), rs in alike.items():
        exact = why.endswith("(exact)")
        rows.append(GroupEffect(label, list(rules_), sum(len(r.keys) for r in rs), exact, None,
                                source="exact" if exact else "untimed", instances=len(rs), why=why))
    return rows
