"""Rewrite a model again from its file: deterministic, so a rollback or a measured candidate is the same run with
some rewrites denied (or stopped after the first k)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import onnx

from ..errors import OnnxfuseError
from ..ir import Model
from ..load.loader import LoadInfo, load_model
from ..opschema import undefined_at
from ..patterns.rules import Rule
from .engine import EngineOptions, EngineResult, RuleSkip, run

__all__ = ["Rewritten", "Source", "defined_ops_only", "rebuild", "undefined_left"]

# what a run loads again: the input model's file, or (a model in memory: rewrite/in_memory.py) a function
# giving a fresh (Model, LoadInfo) of it each call
Source = str | Callable[[], tuple[Model, LoadInfo]]


@dataclass
class Rewritten:
    """One rewrite of the input model: the graph, how its file was loaded, what the engine did, the export."""

    model: Model
    info: LoadInfo
    eng: EngineResult

    @functools.cached_property
    def proto(self) -> onnx.ModelProto:
        """The rewritten model exported, on first use (bisection and measuring often need only `eng`)."""
        return self.model.export()


def rebuild(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
            max_rewrites: int | None = None, allow: set[tuple[str, str]] | None = None) -> Rewritten:
    """Load and rewrite again: `base` gives the target, folding and probed branches; `deny` the rewrites
    (rule, root) left out; `allow`, when given, the only rule rewrites made (besides those of rules that only
    remove nodes); `max_rewrites` stops after that many rule rewrites (folding still runs around them; such a
    prefix, made for bisection, is never written and may
    hold a step a later rewrite would have fused further). A complete run writes only ops the model's opset
    defines (defined_ops_only)."""
    state = _run(input_path, rules, base, deny, max_rewrites, allow)
    return state if max_rewrites is not None else defined_ops_only(input_path, rules, base, deny, state, allow)


def _run(input_path: Source, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
         max_rewrites: int | None = None, allow: set[tuple[str, str]] | None = None) -> Rewritten:
    model, info = load_model(input_path) if isinstance(input_path, str) else input_path()
    result = run(model, rules, replace(base, deny=set(deny), max_rewrites=max_rewrites,
                                       allow=None if allow is None else set(allow)))
    return Rewritten(model, info, result)


MAX_DEFINED_RUNS = 4  # reruns leaving out what the previous one left undefined (one is the usual case)


def undefined_left(model: Model) -> dict[tuple[str, str], str]:
    """The rule rewrites (rule, root) whose nodes left in the graph are ONNX-domain ops the model's opset does not
    define, each with why: a LayerNormalization at opset 12 that no later rule fused into a SkipLayerNormalization
    (rule_issue lets a rule make such a runtime-only op only as such a step)."""
    opset = model.opset
    made: dict[str, str] = {}  # node name -> why, for the live rule-made nodes of an undefined op
    for g in model.graphs():
        for n in g.live_nodes():
            if n.provenance is not None and n.domain == "" and undefined_at(n.op_type, opset):
                made[n.name] = undefined_at(n.op_type, opset)
    return made


def defined_ops_only(input_path: Source, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
                     state: Rewritten, allow: set[tuple[str, str]] | None = None) -> Rewritten:
    """`state`, or the same run again with the rewrites left out whose result keeps an op the model's opset does
    not define (undefined_left): the output passes onnx.checker. The rules left out that way are reported in
    `eng.skipped`, with the reason."""
    denied = set(deny)
    left: dict[tuple[str, str], str] = {}
    for _ in range(MAX_DEFINED_RUNS):
        made = undefined_left(state.model)
        keys = {a.key: made[c] for a in state.eng.applications for c in a.created if c in made}
        if not keys:
            break
        left.update(keys)
        denied |= set(keys)
        state = _run(input_path, rules, base, denied, None, allow)
    else:
        raise OnnxfuseError(f"rewrites keep leaving ops the model's opset does not define: "
                            f"{'; '.join(sorted(set(left.values())))}", hint="skip the rules named with --skip")
    by_rule: dict[str, list[tuple[str, str]]] = {}
    for (rule, root), why in sorted(left.items()):
        by_rule.setdefault(rule, []).append((root, why))
    for rule, at in by_rule.items():
        roots = ", ".join(r for r, _ in at[:3]) + (f" and {len(at) - 3} more" if len(at) > 3 else "")
        state.eng.skipped.append(RuleSkip(rule, f"left out at {roots}: {at[0][1]}"))
    return state
