"""Layout facts: channel and inner dimensions that are not a multiple of the target's vector width (those
leave SIMD lanes or tensor-core tiles partly idle), with the fraction of lanes wasted."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..ir import Model
from ..targets import get


@dataclass(frozen=True)
class Misaligned:
    node: str
    op: str
    dim: str  # "out channels", "in channels", "K", "N"
    value: int
    width: int

    @property
    def padded(self) -> int:
        return math.ceil(self.value / self.width) * self.width

    @property
    def waste(self) -> float:
        """Fraction of vector lanes idle on this dimension."""
        return (self.padded - self.value) / self.padded


@functools.cache
def vector_width(target: str) -> int:
    """fp32 lanes: the target's own (Target.vector_width: CUDA tensor cores tile by 8), else this CPU's: 16 with
    AVX-512, else 8 (AVX2/NEON pairs)."""
    width = get(target).vector_width
    if width is not None:
        return width
    try:
        with open("/proc/cpuinfo") as f:
            return 16 if " avx512f" in f.read() else 8
    except OSError:
        return 8


def alignment_report(model: Model, width: int) -> list[Misaligned]:
    out: list[Misaligned] = []
    for g in model.graphs():
        for n in g.live_nodes():
            if n.op_type in ("Conv", "FusedConv", "ConvTranspose") and len(n.inputs) > 1:
                t = g.type_of(n.inputs[1])
                if t is None or t.shape is None or len(t.shape) < 3 or not all(isinstance(d, int) for d in t.shape):
                    continue
                m, c = int(t.shape[0]), int(t.shape[1])
                dims = [("out channels", m), ("in channels (per group)", c)]
            elif n.op_type in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm") and len(n.inputs) > 1:
                t = g.type_of(n.inputs[1])
                if t is None or t.shape is None or len(t.shape) != 2 or not all(isinstance(d, int) for d in t.shape):
                    continue
                k, nn = int(t.shape[0]), int(t.shape[1])
                trans = n.attr("transB")
                if trans is not None and trans.i:
                    k, nn = nn, k
                dims = [("K", k), ("N", nn)]
            else:
                continue
            for dim, value in dims:
                if value > 1 and value % width:
                    out.append(Misaligned(n.name or n.outputs[0], n.op_type, dim, value, width))
    return out
