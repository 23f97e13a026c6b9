"""The op-cost prior: what a region's rewrite does to the work its nodes describe, counted before anything runs,
for the units measuring could not decide (the last prior of select/decide.py).

A rewrite removes work when its new nodes make fewer kernel calls than the nodes they replace, and move no more
bytes and compute no more FLOPs (op_cost.py's model of one call, on the types shape inference gave the values),
at two sizes of every symbolic dim (2 and 64: a dim the model leaves free may be either). That is a prior only for
rewrites into standard ONNX ops (a Slice for Gather + Unsqueeze, a Conv with an Add folded into its bias): the
count cannot know how well a fused contrib kernel is written, and on onnxruntime 1.32's CPU provider
SkipLayerNormalization measured 1.3-4.4x slower than the Add and LayerNormalization it replaces while moving fewer
bytes in fewer calls (vit_tiny, gpt2_tiny). Those rules say what they expect themselves (`expect:`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..ir import Graph, Node
from ..op_cost import node_bytes, node_flops
from ..tensors import dtype_name

__all__ = ["SIZES", "OpCost", "op_cost", "total"]

SIZES = (2, 64)  # what a symbolic dim is taken to be (each in turn; chosen, not measured: a prior must hold at a
# small and a large size alike to count)
STANDARD = ("", "ai.onnx")


@dataclass(frozen=True)
class OpCost:
    """Kernel calls, and bytes and FLOPs at each of SIZES, of the original nodes and of the fused ones."""

    calls: tuple[int, int]
    bytes: tuple[tuple[float, float], ...]  # per size: (original, fused)
    flops: tuple[tuple[float, float], ...]
    standard: bool  # the fused nodes are all standard ONNX ops

    @property
    def removes_work(self) -> bool:
        """Fewer calls, no more bytes and no more FLOPs at every size, into standard ops only."""
        return (self.standard and self.calls[1] < self.calls[0]
                and all(f <= o for o, f in self.bytes) and all(f <= o for o, f in self.flops))

    def phrase(self) -> str:
        """The prior in words: 'op cost: 1 kernel call fewer, 1.0 KB fewer bytes moved'."""
        fewer = self.calls[0] - self.calls[1]
        saved = self.bytes[-1][0] - self.bytes[-1][1]
        moved = f", {_size(saved)} fewer moved" if saved > 0 else ", no more bytes moved"
        return f"op cost: {fewer} kernel call{'s' if fewer != 1 else ''} fewer{moved}"


def op_cost(original: Iterable[Node], fused: Iterable[Node], og: Graph, fg: Graph) -> OpCost | None:
    """The cost of the nodes a region replaced (in `og`) against the nodes its rewrite made (in `fg`); None where a
    value's type or rank is unknown."""
    orig = [n for n in original if n.op_type != "Constant"]
    new = [n for n in fused if n.op_type != "Constant"]
    per_size = []
    for size in SIZES:
        a, b = _work(orig, og, size), _work(new, fg, size)
        if a is None or b is None:
            return None
        per_size.append((a, b))
    return OpCost((len(orig), len(new)), tuple((a[0], b[0]) for a, b in per_size),
                  tuple((a[1], b[1]) for a, b in per_size), all(n.domain in STANDARD for n in new))


def total(costs: list[OpCost | None]) -> OpCost | None:
    """Several regions' costs added up (None if any is unknown)."""
    if not costs or any(c is None for c in costs):
        return None
    known = [c for c in costs if c is not None]
    return OpCost((sum(c.calls[0] for c in known), sum(c.calls[1] for c in known)),
                  tuple((sum(c.bytes[i][0] for c in known), sum(c.bytes[i][1] for c in known))
                        for i in range(len(SIZES))),
                  tuple((sum(c.flops[i][0] for c in known), sum(c.flops[i][1] for c in known))
                        for i in range(len(SIZES))),
                  all(c.standard for c in known))


def _work(nodes: list[Node], g: Graph, size: int) -> tuple[float, float] | None:
    """Bytes moved and FLOPs of `nodes`, symbolic dims taken as `size`."""
    moved = flops = 0.0
    for n in nodes:
        ins = [_entry(g, v, size) for v in n.inputs if v]
        outs = [_entry(g, v, size) for v in n.outputs if v]
        if any(e is None for e in ins + outs):
            return None
        moved += node_bytes(n.op_type, ins, outs, released=0.0)  # type: ignore[arg-type]
        flops += node_flops(n.op_type, [next(iter(e.values())) for e in ins],  # type: ignore[union-attr]
                            [next(iter(e.values())) for e in outs])  # type: ignore[union-attr]
    return moved, flops


def _entry(g: Graph, v: str, size: int) -> dict[str, list[int]] | None:
    t = g.type_of(v)
    if t is None or t.shape is None or any(d is None for d in t.shape):
        return None
    return {dtype_name(t.elem_type): [d if isinstance(d, int) and d >= 0 else size for d in t.shape]}


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} MB"
