"""Whether an additive mask is causal, proved by computing it.

`masked(scores, M, rows=Q, causal=True)` asks that M masks every key after the query's own position: with s
query rows and t keys (the last s of them the query's own tokens, after t - s cached ones), each (i, j) with
j > t - s + i must be at most -1e30 or -inf. That is what lets GroupQueryAttention apply its own causal mask on
top of M and give the same numbers. Whatever ops spell the mask (a tril buffer sliced by Shape, a Range compared
with a Range, Trilu, Where of those and of the attention mask, a position bias added), it is one fact: this
module computes M with numpy at two sets of sizes for the graph's symbolic dims (algebra.Sizes: dims written
as a sum of others, "past_sequence_length + sequence_length", are that sum) and checks it.

A graph input the mask reads by value is taken as "everything attends": ones (an int or bool attention mask of
ones marks every token as real), since padding only masks more. A floating graph input (an additive mask the
caller feeds) can be anything the caller likes: a mask that reads one is not proved causal. So is a mask computed
by an op the interpreter does not run."""

from __future__ import annotations

import numpy as np
import onnx

from ..ir import Graph, Node
from .interpreter import MAX_ELEMENTS, Interpreter, Opaque, Sizes, static_dims
from .shape_ops import Unprovable

__all__ = ["prove_causal", "prove_rows_keep_a_key"]

MASKED = -1e30  # an additive mask value at most this (or -inf) masks its key


class _Fed(Interpreter):
    """The interpreter with the graph's inputs fed: int and bool ones, as many columns as the scores have keys
    where the last dim is a symbol no other input has (an attention mask covers every key, past and new: its own
    dim name, "total_sequence", says nothing of that); a float input's values are not known."""

    keys = 0  # the scores' key count at these sizes
    ones = True  # int and bool inputs read as ones; False: every input is whatever the caller feeds

    def _own(self, name: str, symbol: str) -> bool:
        """Whether `symbol` is a dim of no other graph input (nothing but this mask ties it to a length)."""
        for i in self.g.proto.input:
            if i.name != name:
                t = self.g.type_of(i.name)
                if t is not None and t.shape is not None and symbol in t.shape:
                    return False
        return True

    def value(self, name: str, depth: int = 0):
        if name not in self.memo and name not in self.g.producer and not self.g.is_constant(name) \
                and self.g.initializer(name) is None:
            t = self.g.type_of(name)
            shape = self.shape_of(name)
            if t is None or shape is None:
                raise Unprovable(f"the mask reads {name!r}, whose shape is not known")
            if t.shape and isinstance(t.shape[-1], str) and self.keys and self._own(name, t.shape[-1]):
                shape = (*shape[:-1], self.keys)
                self.shapes[name] = shape
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            # a floating input's shape may be read (Shape of the cache), its values are whatever the caller feeds
            self.memo[name] = Opaque(shape) if dtype.kind == "f" or not self.ones else np.ones(shape, dtype=dtype)
        return super().value(name, depth)


def prove_causal(graph: Graph, terms: list[tuple[str, str | None, bool]], scores: str) -> None:
    """Raise Unprovable (with the reason) unless the mask made of `terms` masks every later key of the scores
    [.., s, t]. A term is (value, None, _): the value added; or (fill, condition, fill_first): Where(condition,
    0, fill) (Where(condition, fill, 0) when fill_first), the additive form of a masked_fill."""
    for total in _totals(graph, terms, scores):
        s, t = total.shape
        rows = np.arange(s)[:, None]
        cols = np.arange(t)[None, :]
        later = cols > t - s + rows
        open_ = later & ~(total <= MASKED)
        if open_.any():
            i, j = (int(v[0]) for v in np.nonzero(open_))
            raise Unprovable(f"query row {i} of {s} (position {t - s + i}) sees key {j} after it: the mask is not "
                             "causal")


def prove_rows_keep_a_key(graph: Graph, terms: list[tuple[str, str | None, bool]], scores: str, masked: float) -> None:
    """Raise Unprovable unless every query row keeps a key the mask of `terms` leaves open (above `masked`), in
    every batch and head row: what makes a finite fill (GPT-2's Where(causal, w, -10000)) a mask minimum, since
    a softmax row with one open key gives the masked ones exp(fill - max) = 0 where the open scores are within
    the fill's reach (float32: exp underflows to 0 below -104)."""
    for total in _totals(graph, terms, scores, least=False, ones=False):
        shut = ~(total > masked).any(axis=-1)
        if shut.any():
            i = int(np.nonzero(shut)[0][0])
            raise Unprovable(f"query row {i} of {total.shape[0]} has every key masked")


def _totals(graph: Graph, terms: list[tuple[str, str | None, bool]], scores: str, least: bool = True,
            ones: bool = True):
    """The mask of `terms` as [s, t] at each of two sets of sizes: of every batch and head row, the least masked
    one (`least`) or the most masked one. `ones`: int and bool graph inputs read as ones (padding only masks
    more: right for causality), else a mask that reads one is not computed (padding may mask a whole row)."""
    avoid = static_dims(graph)
    for variant in (0, 1):
        interp = _Fed(graph, Sizes(avoid, variant), big_constants=True)
        interp.ones = ones
        shape = interp.shape_of(scores)
        if shape is None or len(shape) < 2:
            raise Unprovable("the scores' shape is not known")
        s, t = shape[-2], shape[-1]
        interp.keys = t
        if s * t > MAX_ELEMENTS:
            raise Unprovable("the scores are too large to compute the mask at the proof's sizes")
        total = np.zeros((s, t), dtype=np.float64)
        for value, where, fill_first in terms:
            term = _computed(interp, value)
            if where is not None:
                cond = _computed(interp, where).astype(bool)
                zero = np.zeros((), dtype=np.float64)
                term = np.where(cond, term, zero) if fill_first else np.where(cond, zero, term)
            term = np.asarray(term, dtype=np.float64)
            try:
                full = np.broadcast_to(term, (*term.shape[:-2], s, t)) if term.ndim >= 2 else \
                    np.broadcast_to(term, (s, t))
            except ValueError:
                raise Unprovable(f"the mask's shape {list(term.shape)} does not broadcast to the scores' "
                                 f"[.., {s}, {t}]") from None
            # every batch and head row of it (the least masked one decides causality, the most masked one
            # whether a row keeps a key)
            rows_of = full.reshape(-1, s, t) if full.ndim > 2 else full[None]
            total = total + (rows_of.max(axis=0) if least else rows_of.min(axis=0))
        yield total


def _computed(interp: Interpreter, value: str) -> np.ndarray:
    try:
        out = interp.value(value)
    except Unprovable as e:
        raise Unprovable(f"the mask cannot be computed: {e}") from None
    if isinstance(out, Opaque):
        node, name = _first_opaque(interp, value)
        if node is None and name is not None:
            kind = "floating input" if interp.ones else "graph input"
            raise Unprovable(f"the mask reads the {kind} {name!r}: it is whatever the caller feeds")
        what = f"{node.op_type} {node.name!r}" if node is not None else repr(value)
        raise Unprovable(f"the mask cannot be computed: the proof does not run {what}")
    return np.asarray(out)


def _first_opaque(interp: Interpreter, value: str, depth: int = 0) -> tuple[Node | None, str | None]:
    """Where an opaque value on the way to `value` comes from: (the node nearest the graph's inputs the
    interpreter did not run, None), or (None, the floating graph input whose values it reads)."""
    node = interp.g.producer.get(value)
    if node is None:
        return None, value
    if depth > 64:
        return node, None
    if node.op_type not in ("Shape", "Size"):
        for i in node.inputs:
            if i and isinstance(interp.memo.get(i), Opaque):
                return _first_opaque(interp, i, depth + 1)
    return node, None
