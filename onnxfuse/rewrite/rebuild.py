"""Rewrite a model again from its file: deterministic, so a rollback or a measured candidate is the same run with
some rewrites denied (or stopped after the first k)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import onnx

from ..ir import Model
from ..load.loader import LoadInfo, load_model
from ..patterns.rules import Rule
from .engine import EngineOptions, EngineResult, run

__all__ = ["Rewritten", "rebuild"]


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
    (rule, root) left out; `allow`, when given, the only rule rewrites made; `max_rewrites` stops after that many
    rule rewrites (folding still runs around them)."""
    model, info = load_model(input_path)
    result = run(model, rules, replace(base, deny=set(deny), max_rewrites=max_rewrites,
                                       allow=None if allow is None else set(allow)))
    return Rewritten(model, info, result)
