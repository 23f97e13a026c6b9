"""Classes of alike regions (regions/): regions whose two versions are alike (same op types, attributes,
constants, and the shapes their inputs ran at: regions/model.signature) are one class, timed once through its
first region; what it could save decides the order classes are timed in."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ..regions.cut import Key, Region
from .decide import Evidence

__all__ = ["RegionClass"]

SHAPE_VALUES = 64  # a region whose inputs are all integers this small computes shapes (see RegionClass.shape_only;
# a bound, not measured: shape vectors have at most a few dozen elements)
# the order classes are timed in (RegionClass.potential) only: not measured, a roofline guess (a core moving
# ~10 GB/s and computing ~50 GFLOP/s weighs a FLOP a fifth of a byte; a node of unknown types 256 KB); a wrong
# guess times a class later, and the budget's end leaves it to its prior, never to a coin flip
FLOPS_PER_BYTE = 5.0
AVG_BYTES = 256 * 1024


def _integer(elem_type: int) -> bool:
    """An integer or bool element type (shape arithmetic's)."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).kind in "iub"
    except (KeyError, ValueError):
        return False


@dataclass
class RegionClass:
    """Alike regions, timed once through the first."""

    sig: str
    regions: list[Region]
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)  # per profile, the first region's inputs
    evidence: Evidence | None = None  # what timing it showed (None: not timed)
    seconds_each: float = 0.0  # its first region's original version, per run (estimator clock)
    failed: str = ""  # why onnxruntime could not run it alone (then its prior decides)

    @property
    def shape_only(self) -> bool:
        """The region reads only a few integers and writes integers (shape arithmetic): there is nothing to time;
        it is kept. (An embedding lookup also reads a few integers at a short sequence, but writes floats.)"""
        rep = self.regions[0]
        outs = [rep.types.get(v) for v in rep.outputs]
        return all(t is not None and _integer(t.elem_type) for t in outs) and all(
            a.size <= SHAPE_VALUES and a.dtype.kind in "iu" for feeds in self.feeds for a in feeds.values())

    @property
    def keys(self) -> list[Key]:
        return [k for r in self.regions for k in r.keys]

    @property
    def weight(self) -> int:
        """Its regions times their nodes (once the regions are decided and their nodes gone: its regions)."""
        return len(self.regions) * max(1, len(self.regions[0].original))

    @property
    def potential(self) -> float:
        """What it could save, before timing: its regions times the bytes their original nodes move plus their
        FLOPs over FLOPS_PER_BYTE (regions/cost.py count, at the larger size of a symbolic dim); by node count
        (AVG_BYTES each) where a type is unknown. Classes are timed largest first."""
        cost = self.regions[0].cost
        work = (cost.bytes[-1][0] + cost.flops[-1][0] / FLOPS_PER_BYTE) if cost is not None else \
            AVG_BYTES * max(1, len(self.regions[0].original))
        return len(self.regions) * work
