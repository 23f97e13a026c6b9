"""The ops the shape interpreter (interpreter.py) runs in numpy: data movement, shape arithmetic and the ops
masks are built of; which ops it runs on a dummy of their input's shape, and which shape rules it knows. Also
the provers' error, Unprovable."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from ..ir import Node
from ..opschema import attr_value
from .layout_text import LAYOUT_OPS

__all__ = ["BROADCAST", "MAX_ELEMENTS", "MOVES", "OPS", "SAME_SHAPE", "RankMismatch", "Unprovable", "axes_of", "ints"]


MAX_ELEMENTS = 1 << 22  # a chain whose source has more elements at the proof's sizes is not proved


class Unprovable(Exception):
    """Why a chain or a scalar could not be evaluated (a concept-level reason for `explain`)."""


class RankMismatch(Unprovable):
    """The chain's source or result has another rank than the layout names: this layout is not the one the
    exporter wrote (a weak reason: another alternative's failure says more)."""


def ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def axes_of(node: Node, args: list, spec, opset_input: int) -> list[int] | None:
    """Axes from the attribute (old opsets) or from input `opset_input` (newer)."""
    if len(args) > opset_input and args[opset_input] is not None:
        return ints(args[opset_input])
    a = attr_value(node.proto, "axes", spec)
    return None if a is None else [int(x) for x in a]


def _reshape(node: Node, a: list, spec) -> np.ndarray:
    x, shape = a[0], ints(a[1])
    allowzero = attr_value(node.proto, "allowzero", spec) or 0
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _transpose(node: Node, a: list, spec) -> np.ndarray:
    perm = attr_value(node.proto, "perm", spec)
    return np.transpose(a[0], None if perm is None else [int(p) for p in perm])


def _unsqueeze(node: Node, a: list, spec) -> np.ndarray:
    x = a[0]
    axes = sorted(d % (x.ndim + len(axes_of(node, a, spec, 1) or [])) for d in axes_of(node, a, spec, 1) or [])
    for d in axes:
        x = np.expand_dims(x, d)
    return x


def _squeeze(node: Node, a: list, spec) -> np.ndarray:
    axes = axes_of(node, a, spec, 1)
    return np.squeeze(a[0]) if axes is None else np.squeeze(a[0], axis=tuple(d % a[0].ndim for d in axes))


def _flatten(node: Node, a: list, spec) -> np.ndarray:
    axis = int(attr_value(node.proto, "axis", spec) if attr_value(node.proto, "axis", spec) is not None else 1)
    x = a[0]
    axis %= x.ndim + 1 if axis < 0 else x.ndim + 1
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _gather(node: Node, a: list, spec) -> np.ndarray:
    axis = int(attr_value(node.proto, "axis", spec) or 0)
    idx = np.asarray(a[1]).astype(np.int64)
    n = a[0].shape[axis]
    return np.take(a[0], np.where(idx < 0, idx + n, idx), axis=axis)


def _concat(node: Node, a: list, spec) -> np.ndarray:
    return np.concatenate([np.atleast_1d(x) if x.ndim == 0 else x for x in a if x is not None],
                          axis=int(attr_value(node.proto, "axis", spec)))


def _slice(node: Node, a: list, spec) -> np.ndarray:
    x = a[0]
    if len(a) > 1:
        starts, ends = ints(a[1]), ints(a[2])
        axes = ints(a[3]) if len(a) > 3 and a[3] is not None else list(range(len(starts)))
        steps = ints(a[4]) if len(a) > 4 and a[4] is not None else [1] * len(starts)
    else:
        starts = list(attr_value(node.proto, "starts", spec))
        ends = list(attr_value(node.proto, "ends", spec))
        axes = list(attr_value(node.proto, "axes", spec) or range(len(starts)))
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=False):
        index[ax % x.ndim] = slice(s, max(min(e, 1 << 62), -(1 << 62)), st)
    return x[tuple(index)]


def _cast(node: Node, a: list, spec) -> np.ndarray:
    return np.asarray(a[0]).astype(onnx.helper.tensor_dtype_to_np_dtype(int(attr_value(node.proto, "to", spec))))


def _div(node: Node, a: list, spec) -> np.ndarray:
    x, y = np.asarray(a[0]), np.asarray(a[1])
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        return np.trunc(x / y).astype(x.dtype)
    return x / y


def _constant(node: Node, a: list, spec) -> np.ndarray:
    from onnx import numpy_helper
    for at in node.proto.attribute:
        if at.name == "value":
            return numpy_helper.to_array(at.t)
        if at.name in ("value_float", "value_int"):
            return np.asarray(at.f if at.name == "value_float" else at.i)
        if at.name in ("value_floats", "value_ints"):
            return np.asarray(list(at.floats) if at.name == "value_floats" else list(at.ints))
    raise ValueError("a Constant without a value this interpreter reads")


def _split(node: Node, a: list, spec) -> list[np.ndarray]:
    axis = int(attr_value(node.proto, "axis", spec) or 0)
    x = a[0]
    sizes = ints(a[1]) if len(a) > 1 and a[1] is not None else attr_value(node.proto, "split", spec)
    if not sizes:
        sizes = [x.shape[axis] // len(node.outputs)] * len(node.outputs)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _range(a: list) -> np.ndarray:
    start, limit, delta = (np.asarray(x).reshape(()) for x in a[:3])
    n = max(int(np.ceil((limit - start) / delta)), 0)
    if n > MAX_ELEMENTS:
        raise ValueError(f"a Range of {n} elements")
    return (start + np.arange(n) * delta).astype(np.result_type(start, limit, delta))


def _expand(a: list) -> np.ndarray:
    shape = ints(a[1])
    out = np.broadcast_shapes(np.shape(a[0]), tuple(shape))
    if math.prod(out) > MAX_ELEMENTS:
        raise ValueError(f"an Expand to {list(out)}")
    return np.broadcast_to(a[0], out)


def _constant_of_shape(node: Node, a: list, spec) -> np.ndarray:
    from onnx import numpy_helper
    shape = ints(a[0])
    if math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"a ConstantOfShape of {shape}")
    fill = next((numpy_helper.to_array(at.t).reshape(-1)[0] for at in node.proto.attribute if at.name == "value"),
                np.float32(0))
    return np.full(shape, fill)


def _gather_nd(node: Node, a: list, spec) -> np.ndarray:
    """ONNX GatherND: the slices of data the last axis of indices points at, after batch_dims leading axes."""
    data, idx = np.asarray(a[0]), np.asarray(a[1]).astype(np.int64)
    bd = int(attr_value(node.proto, "batch_dims", spec) or 0)
    k = idx.shape[-1]
    lead = data.shape[:bd]
    data2 = data.reshape((-1, *data.shape[bd:]))
    idx2 = idx.reshape((data2.shape[0], -1, k)) if bd else idx.reshape((1, -1, k))
    if not bd:
        data2 = data2.reshape((1, *data.shape))
    out = [d[tuple(np.moveaxis(np.where(i < 0, i + np.asarray(d.shape[:k]), i), -1, 0))] for d, i in zip(data2, idx2, strict=True)]
    return np.stack(out).reshape((*lead, *idx.shape[bd:-1], *data.shape[bd + k:]))


def _trilu(node: Node, a: list, spec) -> np.ndarray:
    k = int(np.asarray(a[1]).reshape(-1)[0]) if len(a) > 1 and a[1] is not None else 0
    upper = attr_value(node.proto, "upper", spec)
    return np.triu(a[0], k) if upper is None or int(upper) else np.tril(a[0], k)


# Ops the interpreter runs on a dummy of their data input's shape when only that shape is known.
MOVES = LAYOUT_OPS | {"Split", "Slice", "Gather"}
# Shape rules of the producers whose made-up output dims are worked out (shape_of).
SAME_SHAPE = frozenset({"Trilu", "Softmax", "LogSoftmax", "Cast", "Erf", "Relu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg",
                         "SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                         "FastGelu", "BiasGelu", "RotaryEmbedding", "QuickGelu",
                         "IsNaN", "IsInf", "Not", "Identity", "Dropout", "Abs", "Reciprocal", "Gelu",
                         "LayerNormalization", "CastLike", "Clip", "LeakyRelu", "Softplus", "HardSigmoid"})
BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Equal", "Less", "Greater",
                        "And", "Or", "Xor", "LessOrEqual", "GreaterOrEqual", "Mod", "BitwiseAnd"})

_Impl = Callable[[Node, list, object], "np.ndarray | list[np.ndarray]"]
OPS: dict[str, _Impl] = {
    "Shape": lambda n, a, s: a[0], "Size": lambda n, a, s: a[0],  # handled in _run (only the shape is read)
    "Reshape": _reshape, "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Flatten": _flatten, "Identity": lambda n, a, s: a[0], "Gather": _gather, "Concat": _concat,
    "Slice": _slice, "Cast": _cast, "Constant": _constant, "Split": _split,
    "Add": lambda n, a, s: a[0] + a[1], "Sub": lambda n, a, s: a[0] - a[1], "Mul": lambda n, a, s: a[0] * a[1],
    "Div": _div, "Neg": lambda n, a, s: -a[0], "Sqrt": lambda n, a, s: np.sqrt(a[0]),
    "Reciprocal": lambda n, a, s: 1.0 / a[0], "Pow": lambda n, a, s: np.power(a[0], a[1]),
    "Max": lambda n, a, s: np.maximum(a[0], a[1]), "Min": lambda n, a, s: np.minimum(a[0], a[1]),
    "Equal": lambda n, a, s: np.equal(a[0], a[1]), "Where": lambda n, a, s: np.where(a[0], a[1], a[2]),
    # masks (causal.py): positions compared, combined, broadcast, triangles
    "Less": lambda n, a, s: np.less(a[0], a[1]), "LessOrEqual": lambda n, a, s: np.less_equal(a[0], a[1]),
    "Greater": lambda n, a, s: np.greater(a[0], a[1]),
    "GreaterOrEqual": lambda n, a, s: np.greater_equal(a[0], a[1]),
    "And": lambda n, a, s: np.logical_and(a[0], a[1]), "Or": lambda n, a, s: np.logical_or(a[0], a[1]),
    "Not": lambda n, a, s: np.logical_not(a[0]), "Abs": lambda n, a, s: np.abs(a[0]),
    "Range": lambda n, a, s: _range(a), "Expand": lambda n, a, s: _expand(a),
    "ConstantOfShape": _constant_of_shape, "Trilu": _trilu, "GatherND": _gather_nd,
}
