"""Validation with rollback: while the candidate fails, find the rewrite responsible and deny it. A failure
that names a node a rule created (an onnxruntime kernel rejecting its attributes or shapes) blames that rewrite
directly; otherwise bisection over the rules' rewrites finds the first failing prefix."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..errors import OnnxfuseError
from ..patterns.rules import Rule
from ..rewrite.apply import Application
from ..rewrite.engine import EngineOptions, EngineResult
from ..rewrite.rebuild import Rewritten, rebuild
from .validate import Outcome, Validator

__all__ = ["MAX_NAMED_ROLLBACKS", "MAX_ROLLBACKS", "Rollback", "validate_with_rollback"]

MAX_ROLLBACKS = 16  # rewrites found by bisection (each costs about log2(rewrites) validations)
MAX_NAMED_ROLLBACKS = 256  # in all, rewrites whose node onnxruntime names included (one validation each)


@dataclass
class Rollback:
    """A rewrite validation rejected and the run left out."""

    rule: str
    root: str
    reason: str
    node: str = ""  # the node onnxruntime (or onnx.checker) named, created by this rewrite; "" if found by bisection


def validate_with_rollback(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
                           state: Rewritten, validator: Validator) -> tuple[Rewritten, Outcome, list[Rollback]]:
    """Validate `state`; roll back culprits until it passes. `deny` gains them. Raises when the original itself
    (or its repaired copy) fails, or when too many rollbacks did not help."""
    outcome = validator.check(state.proto, state.info)
    rolled_back: list[Rollback] = []
    bisections = 0
    while not outcome.ok and state.eng.applications:
        culprit = creator(outcome.node, state.eng, rules)
        if culprit is not None and len(rolled_back) < MAX_NAMED_ROLLBACKS:
            rolled_back.append(Rollback(culprit.rule, culprit.root, f"the failure names node {outcome.node!r}, "
                                        f"created by this rewrite: {outcome.reason}", outcome.node))
        else:
            if bisections >= MAX_ROLLBACKS or len(rolled_back) >= MAX_NAMED_ROLLBACKS:
                by_rule = Counter(b.rule for b in rolled_back)
                which = ", ".join(f"{r} x{k}" for r, k in by_rule.most_common(4))
                raise OnnxfuseError(f"validation still fails after rolling back {len(rolled_back)} rewrites "
                                    f"({which}), each of which moved the outputs: {outcome.reason}; nothing written",
                                    hint="if the model's own numerics are that loose (run-time quantization or "
                                    "reduced precision onnxfuse did not recognize), give the tolerance with --rtol "
                                    "and --atol; --skip RULE leaves a rule out")
            bisections += 1
            culprit = bisect(input_path, rules, base, deny, validator, outcome.reason)
            rolled_back.append(Rollback(culprit.rule, culprit.root, outcome.reason))
        deny.add(culprit.key)
        state = rebuild(input_path, rules, base, deny)
        outcome = validator.check(state.proto, state.info)
    if not outcome.ok:
        what = "the repaired model" if state.info.repairs and not state.eng.applications else "the original model itself"
        raise OnnxfuseError(f"{what} does not pass validation: {outcome.reason}")
    return state, outcome, rolled_back


def creator(node: str, eng: EngineResult, rules: list[Rule]) -> Application | None:
    """The rule rewrite that created `node` (the node a failure names), or None: no node named, an original
    node, or one only an exact pass (folding) created. A node a rule created and If inlining later copied out
    of a branch is still that rule's."""
    if not node:
        return None
    ids = {r.id for r in rules}
    return next((a for a in reversed(eng.applications) if a.rule in ids and node in a.created), None)


def _first_failing(n: int, fails) -> int:
    """The smallest k in 1..n with fails(k), given fails(n) (binary search; fails(0) assumed false)."""
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi


def bisect(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
           validator: Validator, reason: str) -> Application:
    """The culprit among the rules' rewrites: the last rewrite of the smallest failing prefix. A prefix is the
    first k rule rewrites with the exact passes (folding) before and after them, as in the full run, so a fused
    node is checked with the inputs folding gives it and an exact pass is never blamed for a rule's node. Only
    when folding alone fails (no rule rewrite at all) is a folding step the culprit (bisect_exact). `reason`: the
    failure, said if no rewrite is left to blame."""
    ids = {r.id for r in rules}

    def rule_apps(k: int | None) -> list[Application]:
        return [a for a in rebuild(input_path, rules, base, deny, max_rewrites=k).eng.applications if a.rule in ids]

    def fails(k: int) -> bool:
        s = rebuild(input_path, rules, base, deny, max_rewrites=k)
        return not validator.check(s.proto, s.info).ok

    hi = _first_failing(len(rule_apps(None)), fails)
    if hi == 0 or (hi == 1 and fails(0)):
        return bisect_exact(input_path, rules, base, deny, validator, reason)
    return rule_apps(hi)[hi - 1]


def bisect_exact(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
                 validator: Validator, reason: str) -> Application:
    """Folding alone fails validation: the exact step whose prefix (the later steps denied) first fails."""
    steps = rebuild(input_path, rules, base, deny, max_rewrites=0).eng.applications
    if not steps:
        raise OnnxfuseError(f"validation fails ({reason}), but no rewrite is left to roll back; nothing written")

    def fails(k: int) -> bool:
        s = rebuild(input_path, rules, base, deny | {a.key for a in steps[k:]}, max_rewrites=0)
        return not validator.check(s.proto, s.info).ok

    return steps[_first_failing(len(steps), fails) - 1]
