"""Whether a rule's output runs on a target: the target checks the engine, `explain`, `patterns list --target`
and the self-test share. Read from each target's kernel facts (targets.kernel_issue); the engine only asks.

- rule_issue: why a rule cannot be used at all on a target and model opset (declared targets, opset range,
  an op ONNX does not define at the opset, no kernel for any dtype the rule allows);
- match_issue: the per-match check (the dtype actually bound);
- rule_usage: yes / partly / no for a rule on a target without a model (`patterns list --target`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir import Graph
from ..match.matcher import Binding
from ..opschema import runtime_only, undefined_at
from ..patterns.rules import RewriteNode, Rule
from ..targets import kernel_issue, kernels

__all__ = ["rule_issue", "match_issue", "rule_usage", "RuleUsage", "declared_dtypes"]


def rule_issue(rule: Rule, target: str, opset: int | None) -> str | None:
    """Why a rule cannot be used at all for this target/model (None when it can): not declared for the target,
    outside its opset range, an ONNX-domain op it emits that ONNX does not define at the model's opset (the output
    would fail onnx.checker), or an op it emits with no kernel on the target at the model's opset (`opset` None:
    at any opset of the rule's range) or for any element type the rule allows there. An op onnxruntime registers
    in the ONNX domain where ONNX has none (opschema.runtime_only: LayerNormalization below opset 17) may be made
    as a step a later rule fuses further (Add + LayerNormalization -> SkipLayerNormalization); a rewrite that
    leaves one in the result is left out (rebuild.defined_ops_only). A built-in rule naming an op the installed
    onnx/onnxruntime does not define is unavailable everywhere (Rule.unavailable says why)."""
    if rule.unavailable:
        return rule.unavailable
    if target not in rule.targets:
        return f"declared for {', '.join(rule.targets)} only"
    if opset is not None and not rule.opset_min <= opset <= rule.opset_max:
        return f"model opset {opset} outside the rule's range {rule.opset_min}..{rule.opset_max}"
    for rn in rule.rewrite:
        if rn.call is None:
            continue
        domain, op = rn.call.domain, rn.call.op
        if opset is not None and domain in ("", "ai.onnx") and not runtime_only(op, opset) and \
                undefined_at(op, opset):  # a runtime-only op is made only to be fused further: see rebuild.py
            return undefined_at(op, opset)
        issue = kernel_issue(domain, op, target, opset=opset)
        if issue is None and opset is None and not domain:  # no model: some opset of the rule's range will do
            ks = kernels(domain, op, target) or ()
            if ks and not any(k.since <= rule.opset_max and rule.opset_min <= k.until for k in ks):
                issue = kernel_issue(domain, op, target, opset=rule.opset_min)
        if issue:
            return issue
        issues = [kernel_issue(domain, op, target, d, opset, idx) for d, idx in declared_dtypes(rule, rn)]
        if issues and all(issues):
            return issues[0]
    return None


@dataclass(frozen=True)
class RuleUsage:
    """Whether a rule is used on a target, as far as can be told without a model (`patterns list --target`)."""

    used: str  # "yes", "partly" (some dtypes refused, or only under conditions) or "no"
    why: str  # the reasons: no kernel, a type the kernel does not take, the target's conditions


def rule_usage(rule: Rule, target: str) -> RuleUsage:
    issue = rule_issue(rule, target, None)
    if issue and target not in rule.targets:  # say too whether the kernels would have been there
        kernel = rule_issue(dataclasses.replace(rule, targets=(*rule.targets, target)), target, None)
        issue += f"; {kernel}" if kernel else ""
    if issue:
        return RuleUsage("no", issue)
    notes: list[str] = []
    for rn in rule.rewrite:
        if rn.call is None:
            continue
        for d, idx in declared_dtypes(rule, rn):
            refused = kernel_issue(rn.call.domain, rn.call.op, target, d, None, idx)
            if refused and refused not in notes:
                notes.append(refused)
    notes += [f"only when {text}" for _, text in rule.conditions.get(target, [])]
    return RuleUsage("partly" if notes else "yes", "; ".join(notes))


def declared_dtypes(rule: Rule, rn: RewriteNode) -> list[tuple[int, int]]:
    """(element type, input index) for every dtype the rule's `where` allows for the input of rewrite call `rn`
    whose type the match determines (see Rule.elem_source); empty when the rule does not say."""
    src = rule.elem_source(rn)
    if src is None:
        return []
    con = rule.where.get(src[0])
    return [(d, src[1]) for d in con.dtype] if con is not None and con.dtype else []


def match_issue(rule: Rule, graph: Graph, b: Binding, target: str) -> str | None:
    """Per-match kernel check: the fused op's kernel must accept the dtype actually bound (at the model's
    opset, for ONNX-domain ops)."""
    opset = graph.model.opset
    for rn in rule.rewrite:
        if rn.call is None:
            continue
        src = rule.elem_source(rn)
        value = b.values.get(src[0]) if src else None
        t = graph.type_of(value) if value else None
        issue = kernel_issue(rn.call.domain, rn.call.op, target, t.elem_type if t else None, opset,
                             src[1] if src else 0)
        if issue:
            return issue
    return None
