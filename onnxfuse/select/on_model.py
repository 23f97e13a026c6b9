"""Rewrites decided on the whole model: those of rules that declare `measure: model`, whose benefit is non-local.
A gate broadcast that keeps onnxruntime's NCHWc layout across the convolutions around it is pure cost in its
region alone, and pays only through its neighbours; no region context short of the whole model shows that.

Region selection (region_select.py) does not time their regions. Once the region decisions are made and the
kept selection rebuilt without them, each group of them (regions alike by rules and fused ops) is timed on the
whole model: the selection with the group against without it, interleaved, two sessions of the "with" version
giving the noise floor (RegionRun.compare, as the confirmation does). A group is kept if it is faster beyond
SIGNIFICANT plus that floor, left out if slower beyond it, and otherwise follows its prior (region_run.prior),
as a class timed alone does; the next group is timed on top of what is kept. One report row per group
(source "model": how "whole model"); decisions are cached like the confirmation's, so a rerun writes the same
bytes. A group the budget does not reach (its rebuild and comparison, with the confirmation's reserve after
it) follows its prior too, and its row says so; the confirmation judges what a prior kept.
"""

from __future__ import annotations

import time

from ..rewrite.rebuild import Rewritten
from .decision_cache import digest
from .op_prior import total
from .region_run import RegionClass, RegionRun, measured, measured_peers, prior
from .regions import Region
from .rounds import GroupEffect, Key

__all__ = ["NOT_ALONE", "decide_on_model", "groups_on_model", "split_on_model"]

RUNS = 60  # interleaved runs per comparison, budget permitting: what these rewrites save is a few percent


# regions that cannot be timed alone for these reasons (regions.py) are decided on the whole model too, all in
# one group: a chain of rewrites that read each other's values (Transposes moved below a run of ops, a
# BatchNorm folded after them) was otherwise left as the original whatever it was worth
NOT_ALONE = ("reads a value another rewrite renamed", "its new nodes were rewritten again by a later rule",
             "replaces nodes that folding had made")
NOT_ALONE_LABEL = "(rewrites that cannot be timed alone)"


def _whole(r: Region, on_model: set[str]) -> bool:
    return bool(on_model & set(r.rules)) or r.untimeable in NOT_ALONE


def split_on_model(regions: list[Region], on_model: set[str]) -> tuple[list[Region], list[Region]]:
    """(regions timed alone, regions decided on the whole model: those holding a rewrite of a `measure: model`
    rule, and those that cannot be timed alone because they read what other rewrites made)."""
    return [r for r in regions if not _whole(r, on_model)], [r for r in regions if _whole(r, on_model)]


def groups_on_model(regions: list[Region]) -> dict[tuple[str, tuple[str, ...]], list[Region]]:
    """The regions decided together on the whole model: alike by fused ops and rules; those that cannot be
    timed alone form one group (their rules, all of them)."""
    groups: dict[tuple[str, tuple[str, ...]], list[Region]] = {}
    alone = [r for r in regions if r.untimeable in NOT_ALONE]
    for r in regions:
        if r.untimeable not in NOT_ALONE:
            groups.setdefault((r.label, tuple(r.rules)), []).append(r)
    if alone:  # last: the rules that declare `measure: model` are decided first where the budget runs short
        groups[(NOT_ALONE_LABEL, tuple(sorted({x for r in alone for x in r.rules})))] = alone
    return groups


def decide_on_model(run: RegionRun, regions: list[Region], kept: set[Key], dropped: set[Key],
                    without: Rewritten, rule_ids: set[str], fingerprint: str,
                    reserve_s: float, classes: list[RegionClass] = ()) -> tuple[Rewritten, list[GroupEffect]]:
    """Time each group of `regions` on the whole model on top of `without` (the kept selection, rebuilt without
    them), in order; `kept` and `dropped` are updated in place. `reserve_s`: time left for the confirmation
    after the last group. A group measured with no change beyond the noise floor follows its prior
    (region_run.prior: the `classes` timed alone of the same rules, measured faster or slower; the rules'
    expectation; the op-cost prior). Returns the selection to write and one row per group."""
    rows = []
    current = without
    expects = {r.id: r.expect for r in run.rules}
    # classes of the same rules timed alone and measured either way, where they change enough of the model
    peers, _ = measured_peers(classes, lambda d: tuple(sorted(d.rules)))
    groups = list(groups_on_model(regions).items())
    for i, ((label, rules), rs) in enumerate(groups):
        keys = {k for r in rs for k in r.keys}
        row = GroupEffect(label, list(rules), len(keys), False, None, source="model", instances=len(rs))
        rows.append(row)
        applied = sorted(a.key for a in current.eng.applications if a.rule in rule_ids)
        key = digest("on model", fingerprint, repr(applied), repr(sorted(keys)), run.env)
        c = run.compared(key)
        now = time.perf_counter()
        # this group's share of what is left bounds its runs past their minimum; it is left out only when its
        # rebuild and sessions do not fit what is left at all (a share too small for them went to the last group)
        deadline = now + (run.deadline - reserve_s - now) / (len(groups) - i)
        with_group = None
        if c is None and now + run.rebuild_s + run.comparison_s() > run.deadline - reserve_s:
            row.source, row.why = "budget", f"whole model: not reached within {run.budget:g} s"
            run.cache.put(key, {"kind": "on model", "source": "budget", "budget": run.budget, "why": row.why,
                                **run.tag, "rules": list(rules)})
        else:
            if c is None:
                with_group = run.build(kept | keys, dropped - keys)
                c = run.compare(current, with_group, key, "on model", {**run.tag, "rules": list(rules)}, deadline,
                                RUNS)
            else:
                row.why = "cached"
            if c.ratio is None:
                row.source, row.why = "budget", f"whole model: {c.status}"
            else:
                row.effect, row.floor = c.ratio, c.floor
        m = measured(row.effect, row.floor)
        if m is not None:
            row.kept = m == "faster"
        else:  # not reached, or no change beyond the noise floor: a prior decides, as for a class timed alone
            row.kept, why = prior(list(rules), peers.get(tuple(sorted(rules)), []), expects,
                                  total([r.cost for r in rs]))
            lead = row.why if row.source == "budget" else f"{row.why + '; ' if row.why else ''}no significant change"
            row.why = f"{lead}; {why}"
        if row.kept:
            kept |= keys
            dropped -= keys
            current = with_group or run.build(kept, dropped)
    return current, rows
