"""What a rule's self-test found (inspect/selftest.py): per rule, the models that fired once with equal outputs,
the mutants that did not fire, the problems; per claimed dtype, whether its fused outputs could be validated
on this machine."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from ..words import count
from .selftest_models import FLOAT

__all__ = ["NOT_VALIDATED", "DtypeReport", "RuleReport", "dtype_label"]

NOT_VALIDATED = "not validated here"  # fired as it should, but no kernel here to compare the fused outputs with


@dataclass
class DtypeReport:
    """The generated models of one claimed dtype."""

    dtype: str
    instances: int = 0  # models that fired once (and, unless held back, gave equal outputs)
    held_back: str | None = None  # why this dtype's fused outputs cannot be validated on this machine
    reference: str | None = None  # original ops with no CPU kernel for this dtype (onnxruntime ran them anyway)

    @property
    def status(self) -> str:
        return NOT_VALIDATED if self.held_back else "validated"

    @property
    def summary(self) -> str:
        if self.held_back:
            return f"{self.dtype}: {self.instances} models fired once, {NOT_VALIDATED} ({self.held_back})"
        return f"{self.dtype}: {self.instances} models fired once with equal outputs"


@dataclass
class RuleReport:
    rule: str
    instances: int = 0
    mutants: int = 0
    problems: list[str] = field(default_factory=list)
    dtypes: list[DtypeReport] = field(default_factory=list)
    skipped: str = ""  # why the rule was not tested: it is unavailable with the installed onnx/onnxruntime

    @property
    def ok(self) -> bool:
        """No problem found (the rule may still be not validated here: see `status`)."""
        return not self.problems and (self.instances > 0 or bool(self.skipped))

    @property
    def status(self) -> str:
        """"ok" (outputs compared in at least one dtype), "not validated here" (it fired as it should, but no
        dtype's fused outputs could be compared on this machine: no kernel here), or "FAIL"."""
        if not self.ok:
            return "FAIL"
        if self.skipped:
            return "skipped"
        return "ok" if any(not d.held_back for d in self.dtypes) else NOT_VALIDATED

    def dtype(self, name: str) -> DtypeReport | None:
        return next((d for d in self.dtypes if d.dtype == name), None)

    @property
    def summary(self) -> str:
        if self.skipped:
            return self.skipped
        return "; ".join([d.summary for d in self.dtypes] + [f"{count(self.mutants, 'mutant')} did not fire"])


def dtype_label(elem: int) -> str:
    """The pattern language's name of a dtype (float32, float16, float64, ...)."""
    return {FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}.get(
        elem, onnx.TensorProto.DataType.Name(elem).lower())
