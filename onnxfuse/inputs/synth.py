"""Made-up input values: token ids inside the tables they index, masks of ones, positions 0..n-1, a sample
rate where a model takes one, normal floats elsewhere; and make_inputs, feeds from an .npz or synthesized."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from ..errors import InputSpecError
from ..tensors import is_inexact, iter_nodes
from .npz import check_npz_against_spec, load_npz
from .shapes import InputInfo, ShapeSpec, check_spec_names, model_inputs, np_dtype, resolve_shapes

# --------------------------------------------------------------------------------------------------------------
# make_inputs
# --------------------------------------------------------------------------------------------------------------


def make_inputs(
    model: onnx.ModelProto,
    shapes: ShapeSpec | None = None,
    npz_path: str | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Feeds for every real graph input: loaded from ``npz_path`` (validated) or synthesized.

    When ``npz_path`` is given the arrays come from the file; tensor shapes in ``shapes`` must then agree
    with the file.
    """
    inputs = model_inputs(model)
    if shapes is not None:
        check_spec_names(shapes, inputs)
    if npz_path is not None:
        feeds = load_npz(npz_path, inputs)
        if shapes is not None:
            check_npz_against_spec(feeds, shapes)
        return feeds
    return synthesize(model, inputs, shapes or ShapeSpec(), seed)


# ---- Gather bounds (embedding table sizes) ---------------------------------------------------------------------

PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Transpose", "Expand"}
_SHAPE_PRESERVING = {"Cast", "Identity", "DequantizeLinear"}
# com.microsoft.EmbedLayerNormalization: (ids input, table input) for input_ids, segment_ids and position_ids
_EMBED_TABLES = ((0, 2), (1, 4), (8, 3))


@dataclass
class GraphIndex:
    consumers: dict[str, list[onnx.NodeProto]]
    producers: dict[str, onnx.NodeProto]
    const_shapes: dict[str, tuple[int, ...]]

    @classmethod
    def build(cls, model: onnx.ModelProto) -> GraphIndex:
        consumers: dict[str, list[onnx.NodeProto]] = {}
        producers: dict[str, onnx.NodeProto] = {}
        const_shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
        for node in iter_nodes(model.graph):
            for name in node.input:
                if name:
                    consumers.setdefault(name, []).append(node)
            for name in node.output:
                producers[name] = node
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                shape = _constant_node_shape(node)
                if shape is not None:
                    const_shapes[node.output[0]] = shape
        return cls(consumers, producers, const_shapes)

    def readers(self, name: str, follow: Callable[[onnx.NodeProto, str], list[str] | None]
                ) -> Iterator[tuple[onnx.NodeProto, str]]:
        """The nodes that read `name`, and through it the values `follow(node, value)` passes it on to (the
        outputs to go on from; None: the node is a reader to report), each value once: (node, value it reads)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            for node in self.consumers.get(value, []):
                through = follow(node, value)
                if through is None:
                    yield node, value
                else:
                    stack.extend(o for o in through if o)

    def static_shape(self, name: str, depth: int = 0) -> tuple[int, ...] | None:
        if name in self.const_shapes:
            return self.const_shapes[name]
        node = self.producers.get(name)
        if node is None or depth > 8 or node.op_type not in _SHAPE_PRESERVING or not node.input:
            return None
        return self.static_shape(node.input[0], depth + 1)


def _constant_node_shape(node: onnx.NodeProto) -> tuple[int, ...] | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return tuple(attr.t.dims)
    return None


def gather_axis(node: onnx.NodeProto, rank: int) -> int:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    return axis + rank if axis < 0 else axis


def gather_bound(index: GraphIndex, name: str) -> int | None:
    """Smallest table size over Gathers whose (constant) data this value indexes, through pass-through ops."""
    bounds: list[int] = []

    def follow(node: onnx.NodeProto, value: str) -> list[str] | None:
        return list(node.output) if node.op_type in PASS_THROUGH and node.input and node.input[0] == value else None

    for node, value in index.readers(name, follow):
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
            shape = index.static_shape(node.input[0])
            if shape:
                axis = gather_axis(node, len(shape))
                if 0 <= axis < len(shape):
                    bounds.append(shape[axis])
        elif node.op_type == "EmbedLayerNormalization" and node.domain == "com.microsoft":
            for ids, table in _EMBED_TABLES:  # ids indexing a fused embedding table
                if len(node.input) > max(ids, table) and node.input[ids] == value:
                    shape = index.static_shape(node.input[table])
                    if shape:
                        bounds.append(shape[0])
    return min(bounds) if bounds else None


# ---- shape and index operands (Expand's shape, Reshape's target, Slice's bounds, ...) ----------------------------

# (op, input index) -> what the values there mean; an integer graph input read there (through Casts) gets values
# valid for it, not random ones: a random Expand shape is "invalid expand shape" in onnxruntime
_SHAPE_OPERANDS = {("Expand", 1): "expand shape", ("Tile", 1): "tile repeats", ("Reshape", 1): "reshape target",
                   ("ConstantOfShape", 0): "output shape", ("Slice", 1): "slice starts", ("Slice", 2): "slice ends",
                   ("Slice", 3): "slice axes", ("Slice", 4): "slice steps"}
_SHAPE_PASS = {"Cast", "Identity"}


def shape_operand(index: GraphIndex, name: str) -> str | None:
    """What a value is to the ops that read it (through Casts) when it is a shape or index operand of one
    (see _SHAPE_OPERANDS); None when it is none, or two different ones."""
    roles: set[str] = set()

    def follow(node: onnx.NodeProto, value: str) -> list[str] | None:
        return list(node.output[:1]) if node.domain in ("", "ai.onnx") and node.op_type in _SHAPE_PASS else None

    for node, value in index.readers(name, follow):
        if node.domain in ("", "ai.onnx"):
            roles.update(r for (op, k), r in _SHAPE_OPERANDS.items()
                         if op == node.op_type and k < len(node.input) and node.input[k] == value)
    return roles.pop() if len(roles) == 1 else None


def _operand_values(role: str, shape: list[int]) -> np.ndarray:
    """Values valid for a shape or index operand whatever the data: ones for an Expand shape, Tile repeats or a
    ConstantOfShape's shape (broadcasts and copies that change nothing); [-1, 1, ...] for a Reshape target (the
    data flattened, then ones); Slice bounds that take everything (starts 0, ends past the end, axes 0..k-1, steps
    1)."""
    n = int(np.prod(shape, dtype=np.int64))
    if role == "reshape target":
        flat = np.ones(n, dtype=np.int64)
        flat[:1] = -1
    elif role == "slice starts":
        flat = np.zeros(n, dtype=np.int64)
    elif role == "slice ends":
        flat = np.full(n, np.iinfo(np.int32).max, dtype=np.int64)
    elif role == "slice axes":
        flat = np.arange(n, dtype=np.int64)
    else:
        flat = np.ones(n, dtype=np.int64)
    return flat.reshape(shape)


# ---- value synthesis ------------------------------------------------------------------------------------------


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def _is_sample_rate(name: str) -> bool:
    low = name.lower()
    return "sample_rate" in low or "samplerate" in low or "sr" in _tokens(name)


def _int_values(
    name: str, shape: list[int], dtype: np.dtype, bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    low = name.lower()
    if "mask" in low:
        values = np.ones(shape, dtype=np.int64)
    elif _is_sample_rate(name) and bound is None:
        values = np.full(shape, 16000, dtype=np.int64)
    elif "position" in low:
        last = shape[-1] if shape else 1
        values = np.broadcast_to(np.arange(last, dtype=np.int64), shape).copy() if shape else np.array(0)
    elif bound is not None:
        values = rng.integers(0, max(bound, 1), size=shape, dtype=np.int64)
    else:
        values = rng.integers(0, 8, size=shape, dtype=np.int64)
    if bound is not None and bound > 0:
        values = values % bound  # ones / positions must stay inside the embedding table as well
    return values.astype(dtype)


_NORMAL_CHUNK = 1 << 20


def _normal(shape: list[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """rng.standard_normal(shape) rounded through float32 to `dtype`, drawn a chunk at a time (the same values: the
    generator's stream is the same in pieces), so a 256 MB input never has a 512 MB float64 copy beside it."""
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for lo in range(0, flat.size, _NORMAL_CHUNK):
        hi = min(lo + _NORMAL_CHUNK, flat.size)
        flat[lo:hi] = rng.standard_normal(hi - lo).astype(np.float32).astype(dtype)
    return out


def _synthesize_one(
    info: InputInfo, shape: list[int], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    dtype = np_dtype(info)
    if dtype == np.bool_:
        return np.ones(shape, dtype=np.bool_)
    if dtype.kind in "iu":
        return _int_values(info.name, shape, dtype, bound, rng)
    if is_inexact(dtype) and dtype.kind != "c":
        return _normal(shape, dtype, rng)
    if dtype.kind == "c":
        return (rng.standard_normal(size=shape) + 1j * rng.standard_normal(size=shape)).astype(dtype)
    if dtype.kind in "OSU":
        return np.full(shape, "a", dtype=object)
    raise InputSpecError(f"cannot generate values for input '{info.name}' of type {info.type_name}")


def synthesize(
    model: onnx.ModelProto, inputs: list[InputInfo], spec: ShapeSpec, seed: int
) -> dict[str, np.ndarray]:
    shapes = resolve_shapes(inputs, spec)
    index = GraphIndex.build(model)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        is_int = np_dtype(info).kind in "iu"
        operand = shape_operand(index, info.name) if is_int else None
        if operand is not None:
            feeds[info.name] = _operand_values(operand, shapes[info.name]).astype(np_dtype(info))
            continue
        bound = gather_bound(index, info.name) if is_int else None
        feeds[info.name] = _synthesize_one(info, shapes[info.name], bound, rng)
    return feeds
