"""Units: what measured selection decides, one at a time.

A unit is the rewrites that share one fate: a class of alike regions timed alone (its signature), a group of
rewrites timed on the whole model (rules that declare `measure: model`, and regions that cannot be timed alone
because they read what other rewrites made), the exact rewrites (nodes removed, shape arithmetic), or the
regions that cannot run alone at all. Why a region cannot be timed alone is an `Untimeable`, never a sentence:
decisions read the enum, and messages are made from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Kind", "Unit", "Untimeable"]

Key = tuple[str, str]  # one applied rewrite: (rule id, root value)


class Untimeable(Enum):
    """Why a region cannot be timed alone; the value is its message (a detail may follow it)."""

    IN_SUBGRAPH = "inside a subgraph"
    FOLDED = "replaces nodes that folding had made"
    REMOVES_ONLY = "removes nodes only (exact)"
    REWRITTEN_AGAIN = "its new nodes were rewritten again by a later rule"
    HOLDS_SUBGRAPH = "holds a subgraph"
    READS_RENAMED = "reads a value another rewrite renamed"
    WRITES_NEW = "writes a value the original nodes do not"
    SELF_CONTEXT = "its context depends on itself"
    MISSING_OUTPUT = "the fused nodes do not write a value its readers need"
    NO_ARRAY = "reads or writes a type onnxruntime's Python API cannot hand over as an array"
    FAILED = "onnxruntime could not run its two versions alone"

    @property
    def exact(self) -> bool:
        """Its rewrite only removes nodes: nothing to time, and it cannot make the model slower."""
        return self is Untimeable.REMOVES_ONLY

    @property
    def on_model(self) -> bool:
        """It reads or rewrites what other rewrites made: decided with them on the whole model (a chain of
        Transposes moved below a run of ops, a BatchNorm folded after them), not left as the original."""
        return self in (Untimeable.FOLDED, Untimeable.REWRITTEN_AGAIN, Untimeable.READS_RENAMED)


class Kind(Enum):
    CLASS = "class"  # alike regions timed alone
    ON_MODEL = "on model"  # a group timed on the whole model, with against without it
    EXACT = "exact"  # nodes removed or shape arithmetic: kept, not timed
    UNTIMEABLE = "untimeable"  # cannot run alone: its prior decides


@dataclass(frozen=True)
class Unit:
    """One decision's subject. `rules` is the rewrite whose classes are each other's peers (the prior);
    `weight` its vote among them (regions x nodes); `removes_work`, `cost` the op-cost prior (op_prior.py)."""

    id: str
    label: str  # the fused op types it creates
    rules: tuple[str, ...]
    kind: Kind
    keys: frozenset[Key] = frozenset()
    instances: int = 1
    weight: float = 1.0
    removes_work: bool = False
    cost: str = ""  # the op-cost prior in words, where it removes work
    untimeable: Untimeable | None = None
    detail: str = ""  # what the untimeable reason names (a value)

    @property
    def rewrite(self) -> tuple[str, ...]:
        return tuple(sorted(self.rules))
