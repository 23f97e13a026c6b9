"""rewrite_model(): the rewrite alone, on a ModelProto in memory, for pipelines that compose passes (onnx-ir's
PassManager, onnxscript's rewriter, Olive, Optimum): the rules to a fixed point with optimize's exact cleanups,
and nothing else (no validation, no measuring, no file written)."""

from __future__ import annotations

import functools
import os
from collections import Counter
from dataclasses import dataclass, field, replace

import onnx

from ..load.from_proto import load_proto
from ..load.write import drop_unused_initializers
from ..options import check_target
from ..targets import HOST
from .apply import Application
from .engine import EngineOptions, RuleSkip, run
from .fold import CLEANUP_STEPS
from .rebuild import Rewritten, defined_ops_only
from .ruleset import RulesArg, chosen_rules

__all__ = ["RewriteResult", "rewrite_model"]


@dataclass
class RewriteResult:
    """What rewrite_model did: `model` is the rewritten ModelProto (a new one: the input is never changed),
    `fired` {rule id: rewrites}, `cleanups` {exact step: times}; `skipped` names the rules that could not apply
    here, and why; `repairs` the harmless defects repaired in the copy (they are in `model` too)."""

    model: onnx.ModelProto = field(repr=False)
    target: str
    applications: list[Application]
    skipped: list[RuleSkip]
    sweeps: int
    repairs: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # initializers nothing reads any more (or did not), removed
    warnings: list[str] = field(default_factory=list)  # one line each: rules still firing at the sweep limit

    @property
    def fired(self) -> dict[str, int]:
        """{rule id: rewrites}: the YAML rules only (as Result.fired)."""
        return dict(Counter(a.rule for a in self.applications if a.rule not in CLEANUP_STEPS))

    @property
    def cleanups(self) -> dict[str, int]:
        """{step: times applied} for the exact steps that are not rules (constant-fold, if-inline, ...)."""
        return dict(Counter(a.rule for a in self.applications if a.rule in CLEANUP_STEPS))

    @property
    def changed(self) -> bool:
        """Whether `model` differs from the input: a rewrite, a cleanup, a repair or an unread initializer removed."""
        return bool(self.applications or self.repairs or self.dropped)


def rewrite_model(model: onnx.ModelProto, rules: RulesArg = None, *, target: str = HOST, fold: bool = True,
                  base_dir: str | os.PathLike | None = None) -> RewriteResult:
    """Rewrite `model` (an onnx.ModelProto, never changed) with `rules` to a fixed point, with optimize's exact
    cleanups (constant folding, If inlining, merging; `fold=False` turns them off), for `target`. Nothing is
    validated or measured: `onnxfuse.optimize` does that. `rules`: None for the built-in rules, else Rule objects
    (`onnxfuse.load_rules()`, `onnxfuse.rules_from_yaml(text)`, filtered in Python) and pattern file or folder
    paths, in order. `base_dir`: the folder of the model's file, where tensors whose data is external are read
    from (the result holds their data). As optimize, it leaves out a rewrite that would leave an op the model's
    opset does not define. Raises OnnxfuseError (one line) for a bad model, rule or option."""
    check_target("target", target)
    chosen = chosen_rules(rules)
    # each run loads its own copy (a rerun leaving out rewrites starts from the input again, as optimize's
    # rebuilds reload the file): in memory, so no file is written
    source = functools.partial(load_proto, model, base_dir)
    loaded, info = source()
    base = EngineOptions(target=target, fold=bool(fold))
    first = Rewritten(loaded, info, run(loaded, chosen, replace(base)))
    state = defined_ops_only(source, chosen, base, set(), first)
    out = state.proto
    dropped = drop_unused_initializers(out.graph)  # what the rewrites left unread, as optimize's output
    eng = state.eng
    return RewriteResult(out, target, list(eng.applications), list(eng.skipped), eng.sweeps,
                         list(state.info.repairs), dropped, list(eng.warnings))
