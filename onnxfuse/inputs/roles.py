"""Roles and bounds read from the graph: each dynamic input dim's role (batch, text sequence, past/total length
of a KV cache, image side, audio samples, other), the bounds the graph puts on it (a position table's rows,
Reshape targets it must divide, constants it must equal). The search that uses them is discover.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from ..tensors import is_inexact, iter_nodes
from .shapes import InputInfo, np_dtype
from .shapes import dim_key as _dim_key
from .synth import PASS_THROUGH, GraphIndex, gather_axis

__all__ = ["DimState", "dim_role", "fixed_by_constants", "guess_model_kind", "is_cache", "memory_caches",
           "position_table_rows", "reshape_multiples", "round_to", "sample_rate_hint"]

_PAST_WORDS = ("past", "cache")
_MEMORY_WORDS = ("encoder", "cross", "memory")
_FEATURE_WORDS = ("feature", "mel", "fbank", "spectrogram")
_TOTAL_WORDS = ("total", "+")



# ---- roles --------------------------------------------------------------------------------------------------


@dataclass
class DimState:
    key: str
    role: str
    ladder: tuple[int, ...]
    why: str
    fixed: int | None = None  # bound by the user or tied: not walked down


def _words(name: str) -> str:
    return name.lower()


def dim_role(name: str | None, info: InputInfo, axis: int, rank: int, model_kind: str,
          memory: frozenset[str] = frozenset()) -> str:
    """batch / past / memory / total / seq / image / audio / other, from the dim's name, the input and the model.
    `memory`: the cache inputs nothing appends to (cross-attention keys and values of an encoder's sequence)."""
    is_float = is_inexact(np_dtype(info))
    low = _words(name or "")
    if axis == 0 and rank > 1 and not any(w in low for w in ("seq", "len", "token", "time", "past", "total")):
        return "batch"  # the leading dim of a tensor input, whatever the exporter named it
    if "batch" in low:
        return "batch"
    if any(w in low for w in _TOTAL_WORDS):  # first: 'past_sequence_length + 1' is a total
        return "total"
    if any(w in low for w in _PAST_WORDS) or any(w in _words(info.name) for w in _PAST_WORDS) and axis == rank - 2:
        return "memory" if info.name in memory or any(w in low for w in _MEMORY_WORDS) else "past"
    if is_float and rank == 4 and axis in (2, 3) and model_kind == "image":
        return "image"
    if is_float and rank == 3 and axis == 2 and (any(w in _words(info.name) for w in _FEATURE_WORDS)
                                                  or "frame" in low):
        return "frames"  # [batch, mel bins, frames]
    if is_float and model_kind == "audio" and axis == rank - 1:
        return "audio"
    if not is_float and rank >= 2 and axis == rank - 1:
        return "seq"
    if name and any(w in low for w in ("seq", "len", "token")):
        return "seq"
    return "other"


def guess_model_kind(inputs: list[InputInfo]) -> str:
    """'audio' when a float input of rank 2-3 has a dynamic last axis and no input is an image."""
    floats = [i for i in inputs if i.shape is not None and is_inexact(np_dtype(i)) and not is_cache(i)]
    if any(len(i.shape) == 4 for i in floats):
        return "image"
    for i in floats:
        if len(i.shape) in (2, 3) and not isinstance(i.shape[-1], int) and not any(
                w in _words(i.name) for w in ("hidden", "embed", "state", "past", "cache", "feature")):
            return "audio"
    return "text" if any(not is_inexact(np_dtype(i)) for i in inputs if i.elem_type) else "other"


# fused ops that append the new keys and values to a past cache input (its input indices): a cache they read is a
# self-attention cache, as one a Concat appends to
_APPENDS = {"GroupQueryAttention": (3, 4), "MultiHeadAttention": (6, 7), "Attention": (4,)}


def memory_caches(model: onnx.ModelProto, inputs: list[InputInfo]) -> frozenset[str]:
    """Cache inputs that no Concat appends to (through reshapes, transposes, casts and splits): the keys and
    values a cross-attention reads from an encoder's sequence, whose length is the same at prefill and decode.
    A self-attention cache (past_key -> Concat with the new keys -> present, or the past input of a fused attention
    that appends to it) is not one; neither is a cache input whose name says it is a self-attention cache while
    the graph says nothing."""
    index = GraphIndex.build(model)
    walk = PASS_THROUGH | {"Split", "Gather", "Slice"}
    out = set()
    for info in inputs:
        if not is_cache(info):
            continue
        seen, frontier, appended = {info.name}, [info.name], False
        for _ in range(4):
            nxt = []
            for v in frontier:
                for node in index.consumers.get(v, []):
                    if node.op_type == "Concat" or (node.domain == "com.microsoft" and any(
                            i < len(node.input) and node.input[i] == v for i in _APPENDS.get(node.op_type, ()))):
                        appended = True
                    elif node.op_type in walk:
                        nxt += [o for o in node.output if o and o not in seen]
                        seen.update(node.output)
            frontier = nxt
        reached = any(index.consumers.get(v) for v in seen)
        if not appended and reached:
            out.add(info.name)
    return frozenset(out)


def is_cache(info: InputInfo) -> bool:
    """A KV-cache input (past_key_values.0.key, past_key, cache_v, ...)."""
    return any(w in _words(info.name) for w in _PAST_WORDS)


def sample_rate_hint(inputs: list[InputInfo]) -> int | None:
    """An 8 kHz model (a name saying so) wants 0.5-1 s at 8000 samples per second."""
    for i in inputs:
        if "8k" in _words(i.name) or "8000" in _words(i.name):
            return 8000
    return None


# ---- bounds read from the graph -----------------------------------------------------------------------------


def position_table_rows(model: onnx.ModelProto) -> tuple[int, str] | None:
    """The smallest table (rank 2, 16+ rows) gathered on axis 0 by positions: indices from a Range, a CumSum,
    a Slice of a constant buffer (the exported arange) or a position_ids input. A text sequence (past + new
    included) cannot be longer. Tables indexed otherwise (token ids, T5's relative-position buckets) bound
    nothing."""
    index = GraphIndex.build(model)
    inputs = {i.name for i in model.graph.input}
    best: tuple[int, str] | None = None
    for node in iter_nodes(model.graph):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        shape = index.static_shape(node.input[0])
        if not shape or len(shape) != 2 or shape[0] < 16 or gather_axis(node, 2) != 0:
            continue
        if _positional(index, node.input[1], inputs) and (best is None or shape[0] < best[0]):
            best = (shape[0], node.input[0])
    return best


_INDEX_PASS = PASS_THROUGH | {"Add", "Sub", "Cast", "Expand", "Unsqueeze", "Squeeze", "Tile"}


def _positional(index: GraphIndex, value: str, inputs: set[str], depth: int = 0) -> bool:
    """Whether `value` holds positions 0, 1, 2, ... (up to an offset): see position_table_rows."""
    if value in inputs:
        return "position" in value.lower()
    node = index.producers.get(value)
    if node is None or depth > 12:
        return False
    if node.op_type in ("Range", "CumSum"):
        return True
    if node.op_type == "Slice":
        return index.static_shape(node.input[0]) is not None  # a Slice of the exported arange buffer
    if node.op_type in _INDEX_PASS and node.input:
        return any(_positional(index, i, inputs, depth + 1) for i in node.input[:2] if i)
    return False


# ---- constraints read from the graph: Reshape targets, constants a dim meets -----------------------------------


def _small_consts(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Values of small integer constants (initializers and Constant nodes of the main graph): shape targets."""
    out: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and int(np.prod(t.dims)) <= 16 \
                and t.data_location != onnx.TensorProto.EXTERNAL:
            out[t.name] = onnx.numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for a in node.attribute:
                if a.name == "value" and a.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) \
                        and int(np.prod(a.t.dims)) <= 16:
                    out[node.output[0]] = onnx.numpy_helper.to_array(a.t)
                elif a.name in ("value_int", "value_ints"):
                    out[node.output[0]] = np.array(onnx.helper.get_attribute_value(a), np.int64)
    return out


_SAME_SHAPE = {"Cast", "Identity", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Exp", "CastLike"}


def _source_input(index: GraphIndex, value: str, inputs: dict[str, InputInfo]) -> str | None:
    """The graph input `value` is (through ops that keep the shape), or None."""
    for _ in range(8):
        if value in inputs:
            return value
        node = index.producers.get(value)
        if node is None or node.op_type not in _SAME_SHAPE or not node.input:
            return None
        value = node.input[0]
    return None


def _shape_items(index: GraphIndex, consts: dict[str, np.ndarray], value: str,
                 inputs: dict[str, InputInfo]) -> list[int | tuple[str, int]] | None:
    """A Reshape target as items: an int, or (graph input, axis) for `Shape(input)[axis]`; None if unreadable."""
    if value in consts:
        return [int(v) for v in np.asarray(consts[value]).reshape(-1)]
    node = index.producers.get(value)
    if node is None:
        return None
    if node.op_type == "Concat":
        out: list[int | tuple[str, int]] = []
        for i in node.input:
            part = _shape_items(index, consts, i, inputs)
            if part is None:
                return None
            out.extend(part)
        return out
    if node.op_type in ("Unsqueeze", "Squeeze", "Cast", "Identity") and node.input:
        return _shape_items(index, consts, node.input[0], inputs)
    if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in consts:
        shape = index.producers.get(node.input[0])
        src = _source_input(index, shape.input[0], inputs) if shape is not None and shape.op_type == "Shape" \
            and not shape.attribute else None
        axes = np.asarray(consts[node.input[1]]).reshape(-1)
        if src is None or len(axes) != 1:
            return None
        rank = len(inputs[src].shape or [])
        axis = int(axes[0]) + (rank if axes[0] < 0 else 0)
        return [(src, axis)] if 0 <= axis < rank else None
    return None


def reshape_multiples(model: onnx.ModelProto, inputs: list[InputInfo],
                      batch_keys: set[str]) -> dict[str, tuple[str, int, str]]:
    """What Reshapes of a graph input require of its one free dim: ('multiple', k, node) when the target has a -1
    and constant dims of product K (`view(batch, -1, 480)`: samples must be a multiple of 480), ('exact', k, node)
    when the target is all known. Dims the target copies (0, or Shape(input)[axis]) cancel; batch dims count as 1
    (timing runs batch 1, so the rest must divide alone)."""
    index = GraphIndex.build(model)
    consts = _small_consts(model)
    by_name = {i.name: i for i in inputs if i.shape is not None}
    out: dict[str, tuple[str, int, str]] = {}
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        src = _source_input(index, node.input[0], by_name)
        items = _shape_items(index, consts, node.input[1], by_name) if src is not None else None
        if src is None or items is None or items.count(-1) > 1:
            continue
        info = by_name[src]
        left = {a: d for a, d in enumerate(info.shape or [])}
        if any(d is None for d in left.values()):
            continue
        k, readable = 1, True
        for pos, item in enumerate(items):
            if item == 0 and not any(a.name == "allowzero" and a.i for a in node.attribute):
                item = (src, pos)
            if isinstance(item, tuple):
                if item[0] != src or item[1] not in left:
                    readable = False
                    break
                left.pop(item[1])  # the same dim on both sides cancels
            elif item > 0:
                k *= item
        if not readable:
            continue
        fixed = int(np.prod([d for d in left.values() if isinstance(d, int)], dtype=np.int64))
        free = [_dim_key(info, a) for a, d in left.items() if not isinstance(d, int)]
        free = [f for f in free if f not in batch_keys]
        if len(free) != 1:
            continue
        key, name = free[0], node.name or node.output[0]
        if -1 in items:
            m = k // math.gcd(k, fixed)
            if m > 1:
                old = out.get(key)
                if old is None or old[0] == "multiple":
                    m = m if old is None else math.lcm(m, old[1])
                    out[key] = ("multiple", m, name if old is None or m == old[1] else f"{old[2]}, {name}")
        elif len(free) == len([d for d in left.values() if not isinstance(d, int)]) and fixed and k % fixed == 0:
            out[key] = ("exact", k // fixed, name)  # no batch left over: the size is fully known
    return out


_BROADCAST_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Sum", "Equal", "Less", "Greater",
                  "Where", "And", "Or"}


def fixed_by_constants(model: onnx.ModelProto, inputs: list[InputInfo]) -> dict[str, tuple[int, str]]:
    """Dims of no role that a constant fixes: broadcast against a constant's dim k > 1 (Add/Mul/... with an
    initializer), the inner dim of a MatMul/Gemm with a constant weight, a Conv's input channels. Such a dim runs
    at k (or, for a broadcast, 1: a toy size) and nothing else."""
    index = GraphIndex.build(model)
    by_name = {i.name: i for i in inputs if i.shape is not None}
    out: dict[str, tuple[int, str]] = {}
    for info in by_name.values():
        rank = len(info.shape or [])
        for node, value in index.readers(info.name, lambda n, v: list(n.output[:1]) if n.op_type in _SAME_SHAPE
                                         else None):
            for axis, d in enumerate(info.shape or []):
                if isinstance(d, int):
                    continue
                k = _constant_dim(index, node, value, axis, rank)
                if k is not None and k > 1:
                    out.setdefault(_dim_key(info, axis), (k, f"{node.op_type} '{node.name or node.output[0]}'"))
    return out


def _constant_dim(index: GraphIndex, node: onnx.NodeProto, value: str, axis: int, rank: int) -> int | None:
    """The size a constant operand of `node` gives `value`'s `axis` (see fixed_by_constants), or None."""
    others = [i for i in node.input if i and i != value]
    if node.op_type in _BROADCAST_OPS:
        for o in others:
            shape = index.static_shape(o)
            if shape is not None and o in index.const_shapes:
                i = axis - (rank - len(shape))
                if 0 <= i < len(shape) and shape[i] > 1:
                    return shape[i]
        return None
    if len(node.input) < 2 or node.input[0] != value:
        return None
    w = index.const_shapes.get(node.input[1])
    if w is None:
        return None
    if node.op_type == "MatMul" and axis == rank - 1 and len(w) >= 2:
        return w[-2]
    if node.op_type == "Gemm" and axis == 1 and len(w) == 2:
        trans_a = any(a.name == "transA" and a.i for a in node.attribute)
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return None if trans_a else w[1] if trans_b else w[0]
    if node.op_type == "Conv" and axis == 1 and len(w) >= 3:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        return w[1] * group
    return None


def round_to(ladder: tuple[int, ...], m: int) -> tuple[int, ...]:
    """Each rung rounded to the nearest multiple of m (at least m), duplicates dropped."""
    return tuple(dict.fromkeys(max(m, round(v / m) * m) for v in ladder))
