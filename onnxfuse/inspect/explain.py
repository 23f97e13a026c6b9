"""explain(): why fusions did not happen. The rules run to a fixed point; then, for every candidate node left,
the most advanced attempt of each rule and the node and constraint where it failed; plus the conv/matmul dims
that leave vector lanes idle on the target."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace

from ..errors import OnnxfuseError
from ..options import check_strings, check_target
from ..rewrite.engine import NearMiss, RuleSkip, near_misses
from ..rewrite.fold import CLEANUP_STEPS
from ..rewrite.rebuild import rebuild
from ..rewrite.ruleset import load_rules
from ..targets import HOST
from ..validate.facts import run_facts
from .alignment import Misaligned, alignment_report, vector_width

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """What `explain` found: rules that would fire, near misses with their reasons, rules not usable on the
    target, and misaligned dims."""

    fired: dict[str, int]  # rules only (folding and the other cleanup steps are not rules); what rewriting alone
    # fires, every rule allowed: optimize's "rules fired" is what it keeps after validation and measured selection
    near_misses: list[NearMiss]  # closest first (the share of the pattern matched); `hidden` says why a row is
    # left out by default (its rule cannot apply on this model and target)
    skipped: list[RuleSkip]
    misaligned: list[Misaligned] = field(default_factory=list)
    vector_width: int = 8

    def to_json(self) -> dict:
        return {"schema": "onnxfuse.explain/1", "fired": self.fired,
                "near_misses": [{**m.__dict__, "fraction": round(m.fraction, 3)} for m in self.near_misses],
                "skipped_rules": [s.__dict__ for s in self.skipped],
                "vector_width": self.vector_width,
                "misaligned": [{**m.__dict__, "padded": m.padded, "waste": m.waste} for m in self.misaligned]}


def explain(model: str | os.PathLike, patterns: list[str] | None = None, target: str = HOST,
            rule: str | None = None, builtin: bool = True) -> Explanation:
    """Apply the rules to a fixed point, then report for every candidate left why its best attempt failed
    (only `rule`'s attempts, all of them, when given)."""
    check_target("target", target)
    rules = load_rules(check_strings("patterns", patterns), builtin, only=None)
    if rule is not None and rule not in {r.id for r in rules}:
        raise OnnxfuseError("no rule with that id", hint="see `onnxfuse patterns list`", option="rule", value=rule)
    base = run_facts(os.fspath(model), target)
    state = rebuild(os.fspath(model), rules, base, set())
    asked = [r for r in rules if rule is None or r.id == rule]
    least = 1 if rule else 2
    misses = near_misses(state.model, asked, target, min_progress=least)
    # A second look before the fusion rules ran (folding and early canonicalisations only): a smaller rule
    # that fired first (a score MatMul made a FusedMatMul) hides how far a bigger one got, and why it stopped.
    before = rebuild(os.fspath(model), [r for r in rules if r.early], base, set())
    # candidates some rule took in the end are not misses; asked about one rule, a candidate another rule took is
    # still that rule's miss (why GroupQueryAttention did not take what MultiHeadAttention did)
    fused = {a.root for a in state.eng.applications if rule is None or a.rule == rule}
    misses = _deepest(misses, [replace(m, graph="before fusions") for m in near_misses(
        before.model, asked, target, min_progress=least) if m.value not in fused])
    cannot = {s.rule: s.reason for s in state.eng.skipped}  # outside the opset range, not for the target, no kernel
    misses = _rank([replace(m, hidden=f"rule cannot apply here: {cannot[m.rule]}") if m.rule in cannot else m
                   for m in misses])
    width = vector_width(target)
    return Explanation(dict(Counter(a.rule for a in state.eng.applications if a.rule not in CLEANUP_STEPS)), misses, state.eng.skipped,
                       alignment_report(state.model, width), width)


def _rank(misses: list[NearMiss]) -> list[NearMiss]:
    """Closest misses first: by the share of the pattern matched, then by the nodes matched."""
    return sorted(misses, key=lambda m: (-m.fraction, -m.progress, m.rule, m.node))


def _deepest(after: list[NearMiss], before: list[NearMiss]) -> list[NearMiss]:
    """Per rule and candidate (by its root value), the attempt that got further; a candidate seen only before
    the fusions is kept where it got further than every attempt of that rule after them."""
    best: dict[tuple[str, str], NearMiss] = {}
    for m in after + before:
        key = (m.rule, m.value or m.node)
        if key not in best or m.progress > best[key].progress:
            best[key] = m
    top_after: dict[str, int] = {}
    for m in after:
        top_after[m.rule] = max(top_after.get(m.rule, 0), m.progress)
    keys_after = {(m.rule, m.value or m.node) for m in after}
    return [m for k, m in best.items() if k in keys_after or m.progress > top_after.get(m.rule, 0)]
