"""Inputs that run: the shapes onnxfuse feeds a model when the user gives none, read from the model itself,
kept within a memory budget and settled by probing the original.

Each dynamic input dim gets a *role* from the graph (batch, text sequence, past/total length of a KV cache,
image side, audio samples, other) and a realistic first value for it (text 128, image 224, audio 1 s),
bounded by what the graph says (a position table of 64 rows caps a text sequence at 64; past + new must fit
it too). A candidate set of shapes is first estimated (inputs plus the largest activation that shape
inference gives) and skipped when it exceeds the memory budget; then the original model runs on it. When it
fails, the next, smaller rung of every dim's ladder is tried (a short, bounded search). The plan records which
shapes were used and why; when nothing runs, one error names the dims to give with --shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import InputSpecError
from ..tensors import is_inexact, iter_nodes
from .budget import default_budget_bytes, estimate_bytes, fmt_bytes, skeleton
from .shapes import (
    BATCH_DEFAULT,
    InputInfo,
    ShapeSpec,
    check_spec_names,
    dim_key,
    model_inputs,
    np_dtype,
    resolve_one,
)
from .synth import PASS_THROUGH, GraphIndex, gather_axis, make_inputs, synthesize

__all__ = ["DimChoice", "InputPlan", "default_budget_bytes", "discover", "fmt_bytes", "plan_dims", "shapes_at"]

# role -> ladder of values, most realistic first; the probe walks down them together
LADDERS: dict[str, tuple[int, ...]] = {
    "seq": (128, 64, 32, 16, 8),
    "image": (224, 192, 160, 128, 96, 64, 32),
    "audio": (16000, 8000, 4000, 2048, 1024, 512, 256),
    "frames": (3000, 1500, 1000, 500, 256, 128, 64),  # feature frames (10 ms each): Whisper's 30 s is 3000
    "other": (16, 64, 256, 1024, 8, 1),  # unknown meaning: up first (minimums from pads, windows), then down
}
MAX_PROBES = 8
_PAST_WORDS = ("past", "cache")
_MEMORY_WORDS = ("encoder", "cross", "memory")
_FEATURE_WORDS = ("feature", "mel", "fbank", "spectrogram")
_TOTAL_WORDS = ("total", "+")


@dataclass
class DimChoice:
    """One dynamic dim: the name users give with --shape, its role, the value used and why."""

    key: str  # the dim_param, or "input[axis]" for an unnamed dim
    role: str
    value: int
    why: str

    def to_json(self) -> dict:
        return {"dim": self.key, "role": self.role, "value": self.value, "why": self.why}


@dataclass
class InputPlan:
    """The feeds onnxfuse runs the model on, with the reasons and the search that found them."""

    feeds: dict[str, np.ndarray]
    dims: list[DimChoice] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # candidates that did not run, with why
    source: str = "discovered"  # "discovered", "--shape", "--inputs"
    estimate_bytes: int = 0
    budget_bytes: int = 0

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {k: list(v.shape) for k, v in self.feeds.items()}

    def summary(self) -> str:
        """One line: the shapes used, e.g. `input_ids[2x128] (sequence=128: position table of 512 rows)`."""
        shapes = ", ".join(f"{k}[{'x'.join(map(str, v.shape)) or 'scalar'}]" for k, v in self.feeds.items())
        why = "; ".join(f"{d.key}={d.value}: {d.why}" for d in self.dims)
        return shapes + (f" ({why})" if why else "") + (f"; {len(self.tried)} smaller try(s) before" if self.tried
                                                          else "")

    def to_json(self) -> dict:
        return {"source": self.source, "shapes": self.shapes, "dims": [d.to_json() for d in self.dims],
                "tried": self.tried, "estimate_bytes": self.estimate_bytes, "budget_bytes": self.budget_bytes}


# ---- roles --------------------------------------------------------------------------------------------------


@dataclass
class _Dim:
    key: str
    role: str
    ladder: tuple[int, ...]
    why: str
    fixed: int | None = None  # bound by the user or tied: not walked down


def _words(name: str) -> str:
    return name.lower()


def _role(name: str | None, info: InputInfo, axis: int, rank: int, model_kind: str,
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


def _model_kind(inputs: list[InputInfo]) -> str:
    """'audio' when a float input of rank 2-3 has a dynamic last axis and no input is an image."""
    floats = [i for i in inputs if i.shape is not None and is_inexact(np_dtype(i)) and not _is_cache(i)]
    if any(len(i.shape) == 4 for i in floats):
        return "image"
    for i in floats:
        if len(i.shape) in (2, 3) and not isinstance(i.shape[-1], int) and not any(
                w in _words(i.name) for w in ("hidden", "embed", "state", "past", "cache", "feature")):
            return "audio"
    return "text" if any(not is_inexact(np_dtype(i)) for i in inputs if i.elem_type) else "other"


def memory_caches(model: onnx.ModelProto, inputs: list[InputInfo]) -> frozenset[str]:
    """Cache inputs that no Concat appends to (through reshapes, transposes, casts and splits): the keys and
    values a cross-attention reads from an encoder's sequence, whose length is the same at prefill and decode.
    A self-attention cache (past_key -> Concat with the new keys -> present) is not one; neither is a cache input
    whose name says it is a self-attention cache while the graph says nothing."""
    index = GraphIndex.build(model)
    walk = PASS_THROUGH | {"Split", "Gather", "Slice"}
    out = set()
    for info in inputs:
        if not _is_cache(info):
            continue
        seen, frontier, appended = {info.name}, [info.name], False
        for _ in range(4):
            nxt = []
            for v in frontier:
                for node in index.consumers.get(v, []):
                    if node.op_type == "Concat":
                        appended = True
                    elif node.op_type in walk:
                        nxt += [o for o in node.output if o and o not in seen]
                        seen.update(node.output)
            frontier = nxt
        reached = any(index.consumers.get(v) for v in seen)
        if not appended and reached:
            out.add(info.name)
    return frozenset(out)


def _is_cache(info: InputInfo) -> bool:
    """A KV-cache input (past_key_values.0.key, past_key, cache_v, ...)."""
    return any(w in _words(info.name) for w in _PAST_WORDS)


def _sample_rate_hint(inputs: list[InputInfo]) -> int | None:
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
        elif len(free) == len([d for d in left.values() if not isinstance(d, int)]) and k % fixed == 0:
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
        frontier, seen = [info.name], set()
        while frontier:
            value = frontier.pop()
            if value in seen:
                continue
            seen.add(value)
            for node in index.consumers.get(value, []):
                if node.op_type in _SAME_SHAPE:
                    frontier.extend(node.output[:1])
                    continue
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


def _round_to(ladder: tuple[int, ...], m: int) -> tuple[int, ...]:
    """Each rung rounded to the nearest multiple of m (at least m), duplicates dropped."""
    return tuple(dict.fromkeys(max(m, round(v / m) * m) for v in ladder))


# ---- what a failed run says ---------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _retry_from_error(message: str, values: dict[str, int], dims: dict[str, _Dim]) -> list[tuple[dict, str]]:
    """Next tries a failed run suggests, with why, for one free dim: a Reshape whose target is fully known needs
    exactly its element count (scale the dim by requested/actual: {33,2,256} -> {20,8,64} takes 15840 samples to
    9600); one with a -1 needs a multiple of the known dims' product (the largest multiple below); a broadcast of
    v against k takes k."""
    out_eq = _equalize(message, values, dims)
    free = [k for k, d in dims.items() if d.fixed is None and d.role not in ("past", "total")]
    if len(free) != 1:
        return out_eq
    key = free[0]
    v = values[key]
    out: list[tuple[dict, str]] = []
    m = re.search(r"Input shape:\s*\{([-\d, ]*)\},\s*requested shape:\s*\{([-\d, ]+)\}", message)
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", message)
    where = (f"{node[-1][0]} '{node[-1][1]}'" if node[-1][1] else node[-1][0]) if node else "a Reshape"
    if m:
        have, want = _ints(m.group(1)), _ints(m.group(2))
        want = [have[i] if w == 0 and i < len(have) else w for i, w in enumerate(want)]
        n_have = int(np.prod(have, dtype=np.int64)) if have else 1
        if -1 not in want:
            n_want = int(np.prod(want, dtype=np.int64))
            if n_have and (v * n_want) % n_have == 0 and v * n_want // n_have > 0:
                out.append(({**values, key: v * n_want // n_have},
                            f"{where} needs exactly {'x'.join(map(str, want))} elements"))
        else:
            p = int(np.prod([w for w in want if w != -1], dtype=np.int64))
            if p > 0 and n_have % v == 0:
                step = p // math.gcd(p, n_have // v)
                if v // step * step > 0 and v % step:
                    out.append(({**values, key: v // step * step}, f"{where} cuts it into multiples of {step}"))
        for k in sorted({w for w in want if w > 1 and v % w}, reverse=True):  # frames of a size named there
            if v // k * k > 0 and all(t[key] != v // k * k for t, _ in out):
                out.append(({**values, key: v // k * k}, f"{where} cuts it into frames of {k}"))
    b = re.search(r"broadcast an axis by a dimension other than 1\. (\d+) by (\d+)", message)
    if b and v in (int(b.group(1)), int(b.group(2))):
        k = int(b.group(2)) if int(b.group(1)) == v else int(b.group(1))
        if k > 1:
            out.append(({**values, key: k}, f"broadcast against {k} ({where})"))
    return out + [t for t in out_eq if all(t[0] != o[0] for o in out)]


def _equalize(message: str, values: dict[str, int], dims: dict[str, _Dim]) -> list[tuple[dict, str]]:
    """Tries from an error that says two dims must be equal, whatever the number of free dims: an LSTM/GRU state
    that 'must have shape {1,2,128}. Actual:{1,1,128}', a Concat's 'mismatched dimensions of 2 and 1', a
    broadcast of 3 by 5. Each dim (free, or the default batch) now at the wrong value is tried at the right one;
    for the symmetric messages, both ways."""
    pairs: list[tuple[int, int]] = []  # (wanted, given)
    m = re.search(r"must have shape\s*\{([-\d, ]*)\}\.?\s*Actual:?\s*\{([-\d, ]*)\}", message)
    if m:
        pairs += [(w, h) for w, h in zip(_ints(m.group(1)), _ints(m.group(2)), strict=False) if w != h and w > 0]
    for pat in (r"mismatched dimensions of (\d+) and (\d+)", r"broadcast an axis by a dimension other than 1\. "
                r"(\d+) by (\d+)"):
        for a, b in re.findall(pat, message):
            pairs += [(int(a), int(b)), (int(b), int(a))]
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", message)
    where = (f"{node[-1][0]} '{node[-1][1]}'" if node[-1][1] else node[-1][0]) if node else "a node"
    movable = [k for k, d in dims.items() if d.role not in ("past", "total") and (d.fixed is None or d.why == "batch")]
    out: list[tuple[dict, str]] = []
    for want, have in dict.fromkeys(pairs):
        for k in movable:
            if values[k] == have and want > 0:
                tried = {**values, k: want}
                if all(t != tried for t, _ in out):
                    out.append((tried, f"{where} needs {want} where {have} was given"))
    return out


def _short(message: str, limit: int = 160) -> str:
    """onnxruntime's innermost status message (it nests one per If/Loop level), on one line."""
    text = " ".join(message.removeprefix("onnxruntime failed to run the model: ").split())
    inner = text.rsplit("Status Message: ", 1)[-1]
    inner = re.sub(r"^/\S+:\d+ .*? was false\. ", "", inner)  # onnxruntime's source line and failed condition
    inner = re.sub(r"^/\S+:\d+ \S+\(.*?\) ", "", inner)
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", text)
    where = f"{node[-1][0]} '{node[-1][1]}': " if node else ""
    out = where + inner
    return out if len(out) <= limit else out[: limit - 3] + "..."


# ---- discovery ----------------------------------------------------------------------------------------------


def plan_dims(model: onnx.ModelProto, inputs: list[InputInfo], spec: ShapeSpec,
               batch: int, given: str = "--shape") -> dict[str, _Dim]:
    kind = _model_kind(inputs)
    table = position_table_rows(model) if kind == "text" else None
    memory = memory_caches(model, inputs) if any(_is_cache(i) for i in inputs) else frozenset()
    has_past = False
    dims: dict[str, _Dim] = {}
    bound = dict(spec.dims)  # symbols a --shape tensor fixes bind the other inputs that share them
    for info in inputs:
        for want, value in zip(info.shape or [], spec.tensors.get(info.name, []), strict=False):
            if isinstance(want, str):
                bound.setdefault(want, value)
    for info in inputs:
        if info.shape is None or info.name in spec.tensors:
            continue
        rank = len(info.shape)
        for axis, d in enumerate(info.shape):
            if isinstance(d, int):
                continue
            key = _dim_key(info, axis)
            if key in dims:
                continue
            role = _role(d, info, axis, rank, kind, memory)
            has_past |= role == "past"
            if key in bound:
                dims[key] = _Dim(key, role, (bound[key],), given, fixed=bound[key])
            elif role == "batch":
                dims[key] = _Dim(key, role, (batch,), "batch", fixed=batch)
            elif role == "audio":
                rate = _sample_rate_hint(inputs)
                ladder = LADDERS["audio"][1:] if rate == 8000 else LADDERS["audio"]
                dims[key] = _Dim(key, role, ladder, f"1 s of audio at {rate or 16000} Hz")
            else:
                dims[key] = _Dim(key, role, LADDERS.get(role, LADDERS["seq" if role in ("past", "total", "memory")
                                                                     else "other"]), _DEFAULT_WHY[role])
    for dim in dims.values():  # what the graph bounds
        if dim.fixed is not None or dim.role not in ("seq", "past", "total") or table is None:
            continue
        rows, name = table
        limit = (rows + 1) // 2 if has_past else rows  # past + new must fit the table too
        if dim.ladder[0] > limit:
            dim.ladder = (limit, *[v for v in dim.ladder if v < limit])
            dim.why = f"position table '{name}' has {rows} rows" + (" (past + new share it)" if has_past else "")
    batch_keys = {k for k, d in dims.items() if d.role == "batch"}
    for key, (kind_, k, node) in reshape_multiples(model, inputs, batch_keys).items():
        dim = dims.get(key)
        if dim is None or dim.fixed is not None:
            continue
        if kind_ == "exact":
            dim.ladder, dim.why = (k,), f"Reshape '{node}' needs exactly {k}"
        else:
            dim.ladder = _round_to(dim.ladder, k)
            dim.why += f", rounded to a multiple of {k} (Reshape '{node}' cuts it into {k}s)"
    for key, (k, node) in fixed_by_constants(model, inputs).items():
        dim = dims.get(key)
        if dim is not None and dim.fixed is None and dim.role not in ("batch", "past", "total"):
            dim.ladder, dim.why = (k, *[v for v in dim.ladder if v != k]), f"{node} meets a constant dim of {k}"
    return dims


_dim_key = dim_key


def shapes_at(inputs: list[InputInfo], spec: ShapeSpec, values: dict[str, int]) -> dict[str, list[int]]:
    """Every input's shape: --shape tensors as given, the rest from fixed dims and the dims' values."""
    return {i.name: list(spec.tensors[i.name]) if i.name in spec.tensors else
            [d if isinstance(d, int) else values[_dim_key(i, a)] for a, d in enumerate(i.shape or [])]
            for i in inputs}


_DEFAULT_WHY = {"seq": "text length 128", "past": "KV cache length (new length - 1)",
                "memory": "cross-attention memory (an encoder's sequence, nothing appends to it): length 128",
                "total": "past + new length", "image": "image side 224", "batch": "batch",
                "other": "no role from the graph (not batch, text, image or audio) and no constant fixes it: "
                         "a mid-size default",
                "frames": "30 s of 10 ms feature frames"}


def _values_at(dims: dict[str, _Dim], level: int) -> dict[str, int]:
    values = {k: d.fixed if d.fixed is not None else d.ladder[min(level, len(d.ladder) - 1)]
              for k, d in dims.items()}
    seq = next((values[k] for k, d in dims.items() if d.role == "seq"), None)
    past = None
    for k, d in dims.items():  # a KV cache: past = new - 1 (one decode step short of 2x), total = past + new
        if d.role == "past" and d.fixed is None and seq is not None:
            values[k] = max(seq - 1, 0)
        if d.role == "past":  # fixed (a --shape, a profile) or just set: the total follows it either way
            past = values[k]
    for k, d in dims.items():
        if d.role == "total" and d.fixed is None:
            values[k] = _total_of(k, values, dims) if _total_of(k, values, dims) else (
                (past or 0) + (seq or values[k]))
    return values


def _total_of(key: str, values: dict[str, int], dims: dict[str, _Dim]) -> int | None:
    """'past_sequence_length + 1', 's0 + s1': a sum of known dims and integers, as exporters write them."""
    parts = [p.strip() for p in key.split("+")]
    if len(parts) < 2:
        return None
    total = 0
    for p in parts:
        if p.isdigit():
            total += int(p)
        elif p in values and p != key:
            total += values[p]
        else:
            return None
    return total


def _why(d: _Dim, value: int, decided: str, tried: list[str]) -> str:
    """What decided a dim's value: its default and bounds, and, after failed tries, what the failure said."""
    if d.fixed is not None or not tried:
        return d.why
    if decided:
        return f"{d.why}; {value}: {decided} (after {len(tried)} failed try(s))"
    if d.role == "other" and value <= 8 and value < d.ladder[0]:
        return (f"{d.why}; only {value} ran after {len(tried)} failed try(s) (a toy size: a dim that only broadcasts? "
                "give the real one with --shape)")
    return f"{d.why}; {value} after {len(tried)} failed try(s)"


def discover(model: onnx.ModelProto, probe: Callable[[dict], object] | None, spec: ShapeSpec | None = None,
             npz_path: str | None = None, batch: int = BATCH_DEFAULT, budget_bytes: int | None = None,
             seed: int = 0, given: str = "--shape") -> tuple[InputPlan, object]:
    """Feeds for the model and the probe's result on them. `probe(feeds)` runs the original (raising
    InputSpecError when it cannot); None skips probing (the first candidate within budget is used). With
    --inputs the file is used as it is; --shape values are kept and only the other dims searched."""
    spec = spec or ShapeSpec()
    if npz_path is not None:
        feeds = make_inputs(model, spec, npz_path)
        return InputPlan(feeds, source="--inputs"), (probe(feeds) if probe else None)
    inputs = model_inputs(model)
    check_spec_names(spec, inputs)
    dims = plan_dims(model, inputs, spec, batch, given)
    budget = budget_bytes if budget_bytes is not None else default_budget_bytes()
    dtypes = {i.name: np_dtype(i) for i in inputs}
    skel: onnx.ModelProto | None = None
    tried: list[str] = []
    first_error: InputSpecError | None = None
    levels = max([len(d.ladder) for d in dims.values() if d.fixed is None], default=1)
    # (values, what decided them, the values of the failed try that suggested them)
    queue: list[tuple[dict[str, int], str, dict[str, int]]] = [(_values_at(dims, level), "", {})
                                                                 for level in range(levels)]
    seen: set[tuple] = set()
    probes = 0
    while queue and probes < MAX_PROBES:
        values, decided, parent = queue.pop(0)
        if tuple(sorted(values.items())) in seen:
            continue
        seen.add(tuple(sorted(values.items())))
        for i in inputs:
            if i.shape is None and i.name not in spec.tensors:
                resolve_one(i, {})  # rank unknown: the error says to give it with --shape
        shapes = shapes_at(inputs, spec, values)
        cand = ShapeSpec(tensors=shapes, dims={k: v for k, v in values.items() if "[" not in k})
        if skel is None:
            skel = skeleton(model)
        est = estimate_bytes(skel, shapes, dtypes)
        label = ", ".join(f"{k}={v}" for k, v in values.items() if dims[k].fixed is None) or "given shapes"
        if est > budget:
            tried.append(f"{label}: needs ~{fmt_bytes(est)}, over the memory budget of {fmt_bytes(budget)}")
            continue
        feeds = synthesize(model, inputs, cand, seed)
        probes += 1
        try:
            result = probe(feeds) if probe else None
        except InputSpecError as e:
            first_error = first_error or e
            tried.append(f"{label}: {_short(e.message)}")
            if not [d for d in dims.values() if d.fixed is None]:
                raise
            queue[:0] = [(t, why, values) for t, why in _retry_from_error(e.message, values, dims)]
            continue
        choices = [DimChoice(k, d.role, values[k], _why(d, values[k], decided if parent.get(k) != values[k] else "",
                                                         tried)) for k, d in dims.items()]
        return InputPlan(feeds, choices, tried, given if spec.tensors or spec.dims else "discovered",
                         est, budget), result
    free = [k for k, d in dims.items() if d.fixed is None]
    last = tried[-1] if tried else "no candidate"
    flags = sorted({k if not re.search(r"\[\d+\]$", k) else k.rsplit("[", 1)[0] for k in free})
    raise InputSpecError(
        f"no input shapes found that the original model runs on ({len(tried)} tried; last: {last})",
        hint=("give them with " + " ".join(f"--shape {f}=N" if f in dims else f"--shape {f}:DIMS" for f in flags))
        if free else "check --shape / --inputs") from first_error
