"""Layout and scalar algebra (the layout and scaled concepts' proofs): what a chain of data-movement ops and scalar factors does, proved by running it.

A chain of Reshape / Transpose / Squeeze / Unsqueeze / Flatten / Identity over a tensor only moves its
elements, and a Mul or Div by a scalar only scales them. Whatever ops spell such a chain (3-D, 4-D or 5-D,
targets constant or computed from Shape, a transpose before or after the reshape), what it does is one fact: an
einops-style rearrangement (`b s (n d) -> b n s d`: "split into n heads of d") times one number. This module
proves that fact instead of matching spellings:

* the element map is computed by running the chain on `arange` over the source's elements, with every
  symbolic dim of the graph given a concrete size (small primes that no static dim of the graph uses), then
  compared with the rearrangement of the same `arange`. It is run with two different sets of sizes: a chain
  that is the rearrangement at both is the rearrangement (its reshape targets are shape arithmetic of those
  sizes), and an axis whose size changes between the two is the symbolic dim whose prime it takes;
* a scalar factor is any one-element operand that folds to the same number at both sets of sizes: a constant,
  or shape arithmetic of static dims (`1 / Sqrt(Cast(Gather(Shape(q), -1)))`, a head size read at run time);
  Div(x, c) contributes 1/c.

The reshape targets and scalars are evaluated by a small interpreter of shape arithmetic (Shape, Gather,
Concat, Slice, Cast, Unsqueeze, arithmetic, Sqrt, ...); any other producer is opaque: only its shape (from the
graph's types) can be read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node
from .interpreter import MAX_ELEMENTS, Interpreter, Opaque, Sizes, static_dims
from .layout_text import SCALE_OPS, Layout
from .shape_ops import RankMismatch, Unprovable

__all__ = ["Proof", "prove_layout", "scalar_factor"]


@dataclass(frozen=True)
class Proof:
    """A chain proved to be `layout`: the size of every atom (an int, or the symbolic dim it is)."""

    atoms: dict[str, int | str]


def _solve(layout: Layout, src: tuple[int, ...], res: tuple[int, ...]) -> dict[str, int]:
    if len(src) != len(layout.source):
        raise RankMismatch(f"the source has rank {len(src)}, the layout names {len(layout.source)} axes "
                         f"({' '.join('(' + ' '.join(g) + ')' if len(g) > 1 else g[0] for g in layout.source)})")
    if len(res) != len(layout.result):
        raise RankMismatch(f"the result has rank {len(res)}, the layout names {len(layout.result)} axes")
    size: dict[str, int] = {}
    groups = list(zip(layout.source, src, strict=True)) + list(zip(layout.result, res, strict=True))
    progress = True
    while progress:
        progress = False
        for g, dim in groups:
            unknown = [a for a in g if a not in size]
            known = math.prod(size[a] for a in g if a in size)
            if len(unknown) == 1:
                if known == 0 or dim % known:
                    raise Unprovable(f"axis of {dim} is not a multiple of {known}")
                size[unknown[0]] = dim // known
                progress = True
    missing = [a for a in layout.atoms if a not in size]
    if missing:
        raise Unprovable(f"the sizes of {', '.join(missing)} cannot be told apart from the shapes")
    if any(math.prod(size[a] for a in g) != dim for g, dim in groups):
        raise Unprovable(f"shapes {list(src)} -> {list(res)} do not fit the layout")
    return size


def _expected(layout: Layout, x: np.ndarray, size: dict[str, int]) -> np.ndarray:
    atoms = layout.atoms
    order = [a for g in layout.result for a in g]
    y = x.reshape([size[a] for a in atoms]).transpose([atoms.index(a) for a in order])
    return y.reshape([math.prod(size[a] for a in g) for g in layout.result])


# Proofs are memoized on the graph as it is now (Graph.derived): the same chain is proved for every rule and
# alternative that reads it (a GPT-2 export with a KV cache: 7220 proofs in one rewrite, 3787 of them distinct,
# half its time), and the state after a proof's first step is reused by the proofs from the same source (_started)
_numbers: dict[int, np.ndarray] = {}
SMALL_VALUE = 1 << 12  # values a proof's first step computed that later proofs reuse: shape arithmetic, not the
# dummies it ran data movement on (kept, those held 100 MB more while a Swin export was rewritten)


def prove_layout(graph: Graph, source: str, value: str, identity: frozenset[int], layout: Layout) -> Proof:
    """Prove that `value` is `layout` applied to `source` (the nodes in `identity`, scalar factors, count as
    the identity); raises Unprovable with the reason it is not. Memoized while the graph is unchanged."""
    proofs = graph.derived("layout proofs")
    key = (source, value, identity, layout.text)
    if key not in proofs:
        try:
            proofs[key] = _prove_layout(graph, source, value, identity, layout)
        except Unprovable as e:
            proofs[key] = (type(e), e.args)  # not the exception: its traceback holds the proof's arrays
    out = proofs[key]
    if isinstance(out, tuple):
        raise out[0](*out[1])
    return out


def _numbered(n: int) -> np.ndarray:
    """0 .. n-1, read-only, the last two sizes kept (a decoder's proofs number the same millions of elements
    thousands of times: arange was half of rewriting a GPT-2 export with a KV cache)."""
    if n not in _numbers:
        if len(_numbers) >= 2:
            _numbers.pop(next(iter(_numbers)))
        _numbers[n] = np.arange(n, dtype=np.int32)  # (MAX_ELEMENTS < 2**31)
        _numbers[n].flags.writeable = False
    return _numbers[n]


def _started(graph: Graph, source: str, identity: frozenset[int], sizes: Sizes) -> Interpreter:
    """An interpreter at `sizes` that has worked out the shape of `source` (interp.shapes[source]): from the
    state an earlier proof of the unchanged graph left after the same step (the sizes its symbols got, the shapes
    and values worked out), else worked out now. The proofs from one source share its ancestors:
    hundreds of values in a decoder whose made-up dims all come from the KV cache."""
    starts = graph.derived("layout proof starts")
    key = (source, identity, sizes.variant)
    hit = starts.get(key)
    interp = Interpreter(graph, sizes, identity)
    if hit is None:
        interp.shape_of(source)
        small = {k: v for k, v in interp.memo.items() if not isinstance(v, np.ndarray) or v.size <= SMALL_VALUE}
        starts[key] = (dict(sizes.of), dict(interp.shapes), set(interp.guessed), small)
    else:
        sizes.of, interp.shapes, interp.guessed, interp.memo = dict(hit[0]), dict(hit[1]), set(hit[2]), dict(hit[3])
    return interp


def _prove_layout(graph: Graph, source: str, value: str, identity: frozenset[int], layout: Layout) -> Proof:
    avoid = static_dims(graph)
    found: list[dict[str, int]] = []
    sizes_used: list[Sizes] = []
    for variant in (0, 1):
        interp = _started(graph, source, identity, Sizes(avoid, variant))
        sizes, shape = interp.sizes, interp.shapes[source]
        if shape is None:
            raise Unprovable(f"the shape of {source!r} is not known")
        if math.prod(shape) > MAX_ELEMENTS:
            raise Unprovable(f"{source!r} is too large to prove its layout ({math.prod(shape)} elements)")
        x = _numbered(math.prod(shape)).reshape(shape)
        interp.memo[source] = x
        out = interp.value(value)
        if isinstance(out, Opaque):
            raise Unprovable(f"{value!r} is not computed from {source!r} by data movement alone")
        size = _solve(layout, x.shape, out.shape)
        want = _expected(layout, x, size)
        if out.shape != want.shape or not np.array_equal(out, want):
            raise Unprovable(f"the elements are not arranged as {layout.text!r}")
        found.append(size)
        sizes_used.append(sizes)
    atoms: dict[str, int | str] = {}
    for a in layout.atoms:
        s0, s1 = found[0][a], found[1][a]
        if s0 == s1:
            atoms[a] = s0
            continue
        sym0, sym1 = sizes_used[0].symbol_of(s0), sizes_used[1].symbol_of(s1)
        # a product of run-time sizes (Swin's windows folded into the batch): a run-time dim of its own,
        # named by its sizes at the two proofs
        atoms[a] = sym0 if sym0 is not None and sym0 == sym1 else f"~{s0}|{s1}"
    return Proof(atoms)


def scalar_factor(graph: Graph, node: Node, rank: int | None) -> tuple[str, float] | None:
    """(data input, factor) when `node` is Mul or Div by a one-element operand that folds to one number at
    every size (Div(x, c): 1/c), else None."""
    if node.domain != "" or node.op_type not in SCALE_OPS or len(node.inputs) != 2:
        return None
    sides = [(0, 1), (1, 0)] if node.op_type == "Mul" else [(0, 1)]
    avoid = static_dims(graph)
    for data, other in sides:
        t = graph.type_of(node.inputs[other])
        if t is None or t.shape is None or any(d != 1 for d in t.shape):
            continue
        if rank is not None and len(t.shape) > rank:
            continue  # would broadcast the data to a higher rank
        values = []
        for variant in (0, 1):
            try:
                v = Interpreter(graph, Sizes(avoid, variant)).value(node.inputs[other])
            except Unprovable:
                v = None
            if not isinstance(v, np.ndarray) or v.size != 1 or v.dtype.kind not in "fiu":
                values = []
                break
            values.append(float(v.reshape(-1)[0]))
        if not values or not math.isclose(values[0], values[1], rel_tol=1e-6) or not math.isfinite(values[0]):
            continue
        f = values[0]
        if node.op_type == "Div":
            if f == 0:
                return None
            f = 1.0 / f
        return node.inputs[data], f
    return None
