"""Rewrites decided on the whole model: those of rules that declare `measure: model`, whose benefit is non-local
(a gate broadcast that keeps onnxruntime's NCHWc layout across the convolutions around it is pure cost in its
region alone), and regions that cannot be timed alone because they read what other rewrites made
(Untimeable.on_model: a chain of Transposes moved below a run of ops).

Once the region classes are decided and the kept selection rebuilt without them, each group (regions alike by
fused ops and rules; those that cannot be timed alone form one group, last) is timed on the whole model: the
selection with the group against without it (RegionRun.compare, as the confirmation). Its Evidence (share: the
whole model's |1 - effect|) goes to decide.py like a class's; the next group is timed on top of what is kept.
"""

from __future__ import annotations

from collections.abc import Callable

from ..regions.cut import Region
from ..rewrite.rebuild import Rewritten
from .decide import Decision, Evidence, Origin
from .decision_cache import digest
from .region_run import RegionRun
from .report import Key
from .units import Unit

__all__ = ["RUNS", "groups_on_model", "split_on_model", "time_on_model"]

RUNS = 60  # interleaved runs per comparison, budget permitting: what these rewrites save is a few percent
# (chosen, not measured: three confirmations' worth; the verdict's interval, not this count, decides)
NOT_ALONE_LABEL = "(rewrites that cannot be timed alone)"


def _not_alone(r: Region) -> bool:
    return r.untimeable is not None and r.untimeable.on_model


def split_on_model(regions: list[Region], on_model: set[str]) -> tuple[list[Region], list[Region]]:
    """(the other regions, regions decided on the whole model: those holding a rewrite of a `measure: model`
    rule, and those that cannot be timed alone because they read what other rewrites made)."""
    whole = [r for r in regions if on_model & set(r.rules) or _not_alone(r)]
    return [r for r in regions if r not in whole], whole


def groups_on_model(regions: list[Region]) -> dict[tuple[str, tuple[str, ...]], list[Region]]:
    """The regions decided together on the whole model: alike by fused ops and rules; those that cannot be
    timed alone form one group (their rules, all of them), last: the `measure: model` rules are timed first."""
    groups: dict[tuple[str, tuple[str, ...]], list[Region]] = {}
    alone = [r for r in regions if _not_alone(r)]
    for r in regions:
        if not _not_alone(r):
            groups.setdefault((r.label, tuple(r.rules)), []).append(r)
    if alone:
        groups[(NOT_ALONE_LABEL, tuple(sorted({x for r in alone for x in r.rules})))] = alone
    return groups


def time_on_model(run: RegionRun, units: list[Unit], kept: set[Key], build: Callable[[set[Key]], Rewritten],
                  fingerprint: str, reserve_s: float, rule_ids: set[str], evidence: dict[str, Evidence],
                  decide_now: Callable[[], dict[str, Decision]]) -> None:
    """Time each on-model unit (in order) on top of the kept selection, its evidence into `evidence`, and keep it
    where `decide_now()` (decide over every unit's evidence so far) says so. `build(kept)`: the model with those
    rewrites and no other (memoized by the caller)."""
    for i, u in enumerate(units):
        base = build(kept)
        applied = sorted(a.key for a in base.eng.applications if a.rule in rule_ids)
        key = digest("on model", fingerprint, repr(applied), repr(sorted(u.keys)), run.env)
        hit = run.compared(key)
        t = run.clock()
        # this group's share of what is left bounds its runs past their minimum
        deadline = t + (run.deadline - reserve_s - t) / (len(units) - i)
        if hit is not None:
            evidence[u.id] = Evidence(hit.ratio, hit.floor, abs(1 - hit.ratio.median), Origin.CACHE)
        elif t + run.rebuild_s + run.comparison_s() <= run.deadline - reserve_s:
            with_group = build(kept | u.keys)
            c = run.compare(base, with_group, key, "on model", {**run.tag, "rules": list(u.rules)}, deadline, RUNS)
            if c.ratio is not None:
                evidence[u.id] = Evidence(c.ratio, c.floor, abs(1 - c.ratio.median))
        if decide_now()[u.id].kept:
            kept = kept | u.keys
