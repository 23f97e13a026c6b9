"""Result: what one `optimize` did (rewrites, rollbacks, validation, measuring, inputs, timings), with the
optimized model in memory; `to_json()` is the `--json` output (docs/json.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import onnx

from .inputs import InputPlan
from .rewrite.apply import Application
from .rewrite.engine import RuleSkip
from .rewrite.fold import CLEANUP_STEPS
from .select.report import MeasureReport
from .tensors import iter_nodes
from .validate.compare import OutputCheck
from .validate.rollback import Rollback

__all__ = ["Result", "op_counts"]


def op_counts(model: onnx.ModelProto) -> Counter:
    """{op: count} over every graph, subgraphs included; contrib ops as `com.microsoft.Op`."""
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in iter_nodes(model.graph))


@dataclass
class Result:
    """The outcome of `onnxfuse.optimize`. `model` is the optimized ModelProto (external data left as
    references to the files it was loaded from)."""

    input: str
    output: str | None
    target: str
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    applications: list[Application]
    skipped: list[RuleSkip]
    rolled_back: list[Rollback]
    checks: list[OutputCheck]
    validation: str
    timings: dict[str, float]
    written: list[str]
    sweeps: int
    measure: MeasureReport | None = None
    repairs: list[str] = field(default_factory=list)  # harmless defects repaired on load (repair.py)
    load_notes: list[str] = field(default_factory=list)  # what loading noticed and kept
    inputs: InputPlan | None = None  # the shapes validation and measuring ran on, and why (first profile)
    profiles: list[tuple[str, float, InputPlan]] = field(default_factory=list)  # every profile validated
    peak_rss_bytes: int = 0  # of this process, at the end
    warnings: list[str] = field(default_factory=list)  # what the run says without failing, one line each
    model: onnx.ModelProto | None = field(default=None, repr=False)

    @property
    def fired(self) -> dict[str, int]:
        """{rule id: rewrites kept}: the YAML rules only (the ids `patterns show`, `--only` and `--skip` take)."""
        return dict(Counter(a.rule for a in self.applications if a.rule not in CLEANUP_STEPS))

    @property
    def cleanups(self) -> dict[str, int]:
        """{step: times applied} for the exact steps that are not rules (constant-fold, if-inline,
        merge-duplicates, identity-drop, if-version, if-squeeze-unguard); `--no-fold` turns them off."""
        return dict(Counter(a.rule for a in self.applications if a.rule in CLEANUP_STEPS))

    def to_json(self) -> dict:
        return {
            "schema": "onnxfuse.optimize/1",
            "input": self.input, "output": self.output, "target": self.target,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "fired": self.fired, "cleanups": self.cleanups,
            "applications": [asdict(a) for a in self.applications],
            "skipped_rules": [asdict(s) for s in self.skipped],
            "rolled_back": [asdict(r) for r in self.rolled_back],
            "validation": {"status": self.validation, "outputs": [_check_json(c) for c in self.checks]},
            "timings_s": self.timings, "written": self.written, "sweeps": self.sweeps,
            "measure": None if self.measure is None else self.measure.to_json(),
            "inputs": self.inputs.to_json() if self.inputs is not None else None,
            "profiles": [{"name": n, "weight": w, "inputs": p.to_json()} for n, w, p in self.profiles],
            "peak_rss_bytes": self.peak_rss_bytes,
            "load": {"repairs": self.repairs, "notes": self.load_notes},
            "warnings": self.warnings,
        }


def _check_json(c: OutputCheck) -> dict:
    d = asdict(c)
    d["shape"] = list(c.shape)
    return d
