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

from ..regions.cut import Key, Untimeable

__all__ = ["Kind", "Unit", "Untimeable"]


class Kind(Enum):
    CLASS = "class"  # alike regions timed alone
    ON_MODEL = "on model"  # a group timed on the whole model, with against without it
    EXACT = "exact"  # nodes removed or shape arithmetic: kept, not timed
    UNTIMEABLE = "untimeable"  # cannot run alone: its prior decides


@dataclass(frozen=True)
class Unit:
    """One decision's subject. `rules` is the rewrite whose classes are each other's peers (the prior);
    `weight` its vote among them (regions x nodes); `removes_work`, `cost` the op-cost prior (regions/cost.py)."""

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
