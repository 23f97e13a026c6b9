"""Layout and scalar algebra: what a chain of data-movement ops and scalar factors does, proved by running it.

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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from ..ir import Graph, Node
from ..opschema import attr_value, op_spec
from ..patterns.layouts import LAYOUT_OPS, SCALE_OPS, Layout

__all__ = ["Interpreter", "Opaque", "Proof", "RankMismatch", "Sizes", "Unprovable", "prove_layout", "scalar_factor",
           "static_dims"]

MAX_ELEMENTS = 1 << 22  # a chain whose source has more elements at the proof's sizes is not proved
MAX_ANCESTORS = 1 << 16  # values one shape is worked out from, at most (a 12-layer BERT export's last layer: 390)
_PRIMES = tuple(p for p in range(3, 8000) if all(p % q for q in range(2, int(p ** 0.5) + 1)))


class Unprovable(Exception):
    """Why a chain or a scalar could not be evaluated (a concept-level reason for `explain`)."""


class RankMismatch(Unprovable):
    """The chain's source or result has another rank than the layout names: this layout is not the one the
    exporter wrote (a weak reason: another alternative's failure says more)."""


class Sizes:
    """Concrete sizes for the graph's symbolic dims: distinct small primes no static dim of the graph uses;
    `variant` 0 and 1 give every symbol a different prime."""

    def __init__(self, avoid: frozenset[int], variant: int) -> None:
        self.free = [p for p in _PRIMES if p not in avoid]
        self.variant = variant
        self.of: dict[str, int] = {}

    def __call__(self, symbol: str) -> int:
        parts = [x.strip() for x in symbol.split("+")]
        if len(parts) > 1 and all(parts):  # "past_sequence_length + sequence_length": the sum of its parts
            return sum(self(x) for x in parts)
        if symbol not in self.of:
            i = 2 * len(self.of) + self.variant
            if i >= len(self.free):
                raise Unprovable("too many symbolic dims to give each its own size")
            self.of[symbol] = self.free[i]
        return self.of[symbol]

    def symbol_of(self, size: int) -> str | None:
        return next((s for s, p in self.of.items() if p == size), None)


@dataclass(frozen=True)
class _Opaque:
    """A value the interpreter does not compute: only its concrete shape (None: not known)."""

    shape: tuple[int, ...] | None


_static_dims_cache: dict[int, tuple[Graph, frozenset[int]]] = {}


def _static_dims(graph: Graph) -> frozenset[int]:
    hit = _static_dims_cache.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    dims: set[int] = set()
    for v in list(graph.producer) + [i.name for i in graph.proto.input]:
        t = graph.type_of(v)
        if t is not None and t.shape is not None:
            dims.update(d for d in t.shape if isinstance(d, int))
    out = frozenset(dims)
    if len(_static_dims_cache) > 8:
        _static_dims_cache.clear()
    _static_dims_cache[id(graph)] = (graph, out)
    return out


def _ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _axes(node: Node, args: list, spec, opset_input: int) -> list[int] | None:
    """Axes from the attribute (old opsets) or from input `opset_input` (newer)."""
    if len(args) > opset_input and args[opset_input] is not None:
        return _ints(args[opset_input])
    a = attr_value(node.proto, "axes", spec)
    return None if a is None else [int(x) for x in a]


class _Interpreter:
    """Evaluates values of `graph` with numpy at one set of sizes; `memo` may be given values (the chain's
    source); the nodes in `identity` (scalar factors) are evaluated as their data input."""

    def __init__(self, graph: Graph, sizes: Sizes, identity: frozenset[int] = frozenset(), big_constants: bool = False):
        self.g, self.sizes = graph, sizes
        self.const_limit = MAX_ELEMENTS if big_constants else 1 << 16  # constants read (a tril buffer: big)
        self.memo: dict[str, np.ndarray | _Opaque] = {}
        self.identity = identity
        self.running: set[str] = set()  # values being evaluated: their shape rule must not evaluate them again
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        self.guessed: set[str] = set()

    def shape_of(self, value: str, depth: int = 0) -> tuple[int, ...] | None:
        """The concrete shape of `value` at these sizes. A type whose dims are numbers or the model's own
        input dim names is read as it is; a dim shape inference made up (`unk__7`, which may be batch * heads)
        is worked out from the producer instead, where the producer is an op whose shape rule is known."""
        if value in self.shapes:
            return self.shapes[value]
        t = self.g.type_of(value)
        if t is None and self.g.initializer(value) is not None:
            return tuple(int(d) for d in self.g.initializer(value).dims)
        out: tuple[int, ...] | None = None
        if self._declared(t):
            out = tuple(d if isinstance(d, int) else self.sizes(d) for d in t.shape)
        else:
            if depth == 0:
                self._work_out_ancestors(value)
            node = self.g.producer.get(value)
            if node is not None and depth < 48:
                out = self._infer(node, value, depth + 1)
                if out is not None and t is not None and t.shape is not None and len(out) != len(t.shape):
                    out = None  # a rule that saw too little (an input of unknown shape): not this value's shape
                if out is not None and (node.op_type not in _BROADCAST or node.domain != "") \
                        and any(i in self.guessed for i in node.inputs if i):
                    self.guessed.add(value)  # worked out from a guess: a guess too
            if out is None and t is not None and t.shape is not None and all(d is not None for d in t.shape):
                out = tuple(d if isinstance(d, int) else self.sizes(d) for d in t.shape)
                self.guessed.add(value)  # each made-up dim its own size: a guess, not a fact
        if out is not None and any(d < 0 for d in out):
            out = None  # a type with a negative dim (-1 written as a dim value) says nothing
        self.shapes[value] = out
        return out

    def _declared(self, t) -> bool:
        """A type whose dims are numbers or the model's own input dim names: read as it is."""
        declared = self.g.model.input_dim_names
        return t is not None and t.shape is not None and all(isinstance(d, int) or d in declared for d in t.shape)

    def _work_out_ancestors(self, value: str) -> None:
        """The shapes `value`'s shape is worked out from, deepest first, without recursion: the producers back to
        values whose types say their shapes (the last layer of a 12-layer BERT export reads dims shape inference
        made up in the first: 390 values back); each is then one step from its memoized inputs. Recursing instead
        (depth-limited) gave up after three layers there, guessed the dims, and no later layer fused."""
        order: list[str] = []
        seen: set[str] = set()
        stack: list[tuple[str, bool]] = [(value, False)]
        while stack and len(seen) < MAX_ANCESTORS:
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            if v in seen or v in self.shapes:
                continue
            seen.add(v)
            node = self.g.producer.get(v)
            if node is None or self._declared(self.g.type_of(v)):
                continue
            stack.append((v, True))
            stack.extend((i, False) for i in node.inputs if i)
        for v in order[:-1]:  # the last is `value` itself: its caller works it out
            self.shape_of(v, 1)

    def _infer(self, node: Node, value: str, depth: int) -> tuple[int, ...] | None:
        op = node.op_type if node.domain in ("", "com.microsoft") else ""
        ins = [self.shape_of(i, depth) if i else None for i in node.inputs]
        if op in _SAME_SHAPE:
            return ins[0] if value == node.outputs[0] else None
        if op in _BROADCAST:
            # inputs whose shapes are facts; one whose made-up dims were guessed is left out (a mask's
            # [b|1, 1, s|1, t] broadcasts into the scores' shape, it does not make it)
            if any(sh is None for sh in ins):
                return None  # an input of unknown shape may make any of the result's dims
            known = [sh for i, sh in zip(node.inputs, ins, strict=True) if i not in self.guessed]
            rank = max((len(sh) for sh in known), default=-1)
            higher = [sh for i, sh in zip(node.inputs, ins, strict=True) if i in self.guessed and len(sh) > rank]
            if higher:  # a guess that makes the result's rank (x * scalar): the result is a guess too
                self.guessed.add(value)
            if not known and not higher:
                return None
            try:
                out = tuple(np.broadcast_shapes(*known, *higher))
            except ValueError:
                return None
            for i, sh in zip(node.inputs, ins, strict=True):  # a guess where the facts have 1 makes that dim
                if i in self.guessed and any(o == 1 and d != 1 for o, d in zip(out[::-1], sh[::-1], strict=False)):
                    self.guessed.add(value)
            return out
        if op == "Gather" and ins[0] is not None and ins[1] is not None and node.inputs[0] not in self.guessed:
            axis = int(attr_value(node.proto, "axis", op_spec("", "Gather", self.g.model.opset)) or 0)
            axis %= len(ins[0])
            return (*ins[0][:axis], *ins[1], *ins[0][axis + 1:])
        if op == "Expand" and ins[0] is not None:
            try:
                target = self.value(node.inputs[1], depth)
                if isinstance(target, np.ndarray):
                    return tuple(np.broadcast_shapes(ins[0], tuple(_ints(target))))
            except (Unprovable, ValueError):
                return None
        if op == "FusedMatMul" and ins[0] is not None and ins[1] is not None:  # MatMul with transposes
            spec = op_spec("com.microsoft", "FusedMatMul", None)
            ta, tb = (int(attr_value(node.proto, k, spec) or 0) for k in ("transA", "transB"))
            a = (*ins[0][:-2], ins[0][-1], ins[0][-2]) if ta else ins[0]
            b = (*ins[1][:-2], ins[1][-1], ins[1][-2]) if tb else ins[1]
            ins = [a, b]
            op = "MatMul"
        if op == "MatMul" and ins[0] is not None and ins[1] is not None and min(len(ins[0]), len(ins[1])) >= 2:
            try:
                lead = np.broadcast_shapes(ins[0][:-2], ins[1][:-2])
            except ValueError:
                return None
            return (*lead, ins[0][-2], ins[1][-1])
        if op == "Concat" and ins and all(sh is not None for sh in ins) and len({len(sh) for sh in ins}) == 1:
            axis = int(attr_value(node.proto, "axis", op_spec("", "Concat", self.g.model.opset))) % len(ins[0])
            return (*ins[0][:axis], sum(sh[axis] for sh in ins), *ins[0][axis + 1:])  # type: ignore[index]
        if op == "Gemm" and ins[0] is not None and ins[1] is not None and len(ins[0]) == len(ins[1]) == 2:
            spec = op_spec("", "Gemm", self.g.model.opset)
            ta, tb = (int(attr_value(node.proto, k, spec) or 0) for k in ("transA", "transB"))
            return (ins[0][ta], ins[1][1 - tb])
        if op in _MOVES and value not in self.running:  # run it (on a dummy where its input is opaque)
            try:
                out = self.value(value, depth)
            except Unprovable:
                return None
            return out.shape
        return None

    def value(self, name: str, depth: int = 0) -> np.ndarray | _Opaque:
        if name in self.memo:
            return self.memo[name]
        if depth > 64:
            raise Unprovable("shape arithmetic nested too deep")
        node = self.g.producer.get(name)
        c = None
        if self.g.is_constant(name):
            shape = self.shape_of(name)
            if shape is not None and math.prod(shape) <= self.const_limit:
                c = self.g.const_value(name, keep=False)
        if c is not None:
            out: np.ndarray | _Opaque = np.asarray(c)
        elif node is None:
            out = _Opaque(self.shape_of(name, depth))
        elif id(node) in self.identity:
            out = self.value(node.inputs[0], depth + 1)
        else:
            self.running.add(name)
            try:
                out = self._run(node, name, depth)
            finally:
                self.running.discard(name)
        self.memo[name] = out
        return out

    def _run(self, node: Node, name: str, depth: int) -> np.ndarray | _Opaque:
        op = node.op_type
        impl = _OPS.get(op) if node.domain == "" else None
        if impl is None:
            return _Opaque(self.shape_of(name, depth))
        args = [None if not i else self.value(i, depth + 1) for i in node.inputs]
        if op in ("Shape", "Size"):
            x = args[0]
            shape = x.shape if isinstance(x, _Opaque) else np.asarray(x).shape
            if shape is None:
                raise Unprovable(f"the shape of {node.inputs[0]!r} is not known")
            if op == "Size":
                return np.asarray(math.prod(shape), dtype=np.int64)
            spec = op_spec("", "Shape", self.g.model.opset)
            dims = np.asarray(shape, dtype=np.int64)
            start, end = attr_value(node.proto, "start", spec), attr_value(node.proto, "end", spec)
            return dims[int(start or 0): None if end is None else int(end)]
        if any(isinstance(a, _Opaque) for a in args):
            if op not in _MOVES or not isinstance(args[0], _Opaque) or args[0].shape is None \
                    or any(isinstance(a, _Opaque) for a in args[1:]) or math.prod(args[0].shape) > MAX_ELEMENTS:
                return _Opaque(self.shape_of(name, depth))
            args[0] = np.zeros(args[0].shape, dtype=np.int8)  # only the shape it gives is read
            try:
                dummy = _OPS[op](node, args, op_spec("", op, self.g.model.opset))
            except (ValueError, IndexError, TypeError) as e:
                raise Unprovable(f"{op} {node.name!r} does not run at the proof's sizes ({e})") from None
            if isinstance(dummy, list):  # several outputs (Split)
                for o, d in zip(node.outputs, dummy, strict=False):
                    self.memo[o] = _Opaque(d.shape)
                return self.memo[name]
            return _Opaque(np.asarray(dummy).shape)
        spec = op_spec("", op, self.g.model.opset)
        outs = node.outputs
        try:
            with np.errstate(all="ignore"):
                result = impl(node, args, spec)
        except (ValueError, IndexError, TypeError, ZeroDivisionError) as e:
            raise Unprovable(f"{op} {node.name!r} does not run at the proof's sizes ({e})") from None
        if isinstance(result, list):  # several outputs (Split)
            for o, r in zip(outs, result, strict=False):
                self.memo[o] = r
            return result[list(outs).index(name)]
        return np.asarray(result)


def _reshape(node: Node, a: list, spec) -> np.ndarray:
    x, shape = a[0], _ints(a[1])
    allowzero = attr_value(node.proto, "allowzero", spec) or 0
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _transpose(node: Node, a: list, spec) -> np.ndarray:
    perm = attr_value(node.proto, "perm", spec)
    return np.transpose(a[0], None if perm is None else [int(p) for p in perm])


def _unsqueeze(node: Node, a: list, spec) -> np.ndarray:
    x = a[0]
    axes = sorted(d % (x.ndim + len(_axes(node, a, spec, 1) or [])) for d in _axes(node, a, spec, 1) or [])
    for d in axes:
        x = np.expand_dims(x, d)
    return x


def _squeeze(node: Node, a: list, spec) -> np.ndarray:
    axes = _axes(node, a, spec, 1)
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
        starts, ends = _ints(a[1]), _ints(a[2])
        axes = _ints(a[3]) if len(a) > 3 and a[3] is not None else list(range(len(starts)))
        steps = _ints(a[4]) if len(a) > 4 and a[4] is not None else [1] * len(starts)
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
    sizes = _ints(a[1]) if len(a) > 1 and a[1] is not None else attr_value(node.proto, "split", spec)
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
    shape = _ints(a[1])
    out = np.broadcast_shapes(np.shape(a[0]), tuple(shape))
    if math.prod(out) > MAX_ELEMENTS:
        raise ValueError(f"an Expand to {list(out)}")
    return np.broadcast_to(a[0], out)


def _constant_of_shape(node: Node, a: list, spec) -> np.ndarray:
    from onnx import numpy_helper
    shape = _ints(a[0])
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
_MOVES = LAYOUT_OPS | {"Split", "Slice", "Gather"}
# Shape rules of the producers whose made-up output dims are worked out (shape_of).
_SAME_SHAPE = frozenset({"Trilu", "Softmax", "LogSoftmax", "Cast", "Erf", "Relu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg",
                         "SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                         "FastGelu", "BiasGelu", "RotaryEmbedding", "QuickGelu",
                         "IsNaN", "IsInf", "Not", "Identity", "Dropout", "Abs", "Reciprocal", "Gelu",
                         "LayerNormalization", "CastLike", "Clip", "LeakyRelu", "Softplus", "HardSigmoid"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Equal", "Less", "Greater",
                        "And", "Or", "Xor", "LessOrEqual", "GreaterOrEqual", "Mod", "BitwiseAnd"})

_Impl = Callable[[Node, list, object], "np.ndarray | list[np.ndarray]"]
_OPS: dict[str, _Impl] = {
    "Shape": lambda n, a, s: a[0], "Size": lambda n, a, s: a[0],  # handled in _run (only the shape is read)
    "Reshape": _reshape, "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Flatten": _flatten, "Identity": lambda n, a, s: a[0], "Gather": _gather, "Concat": _concat,
    "Slice": _slice, "Cast": _cast, "Constant": _constant, "Split": _split,
    "Add": lambda n, a, s: a[0] + a[1], "Sub": lambda n, a, s: a[0] - a[1], "Mul": lambda n, a, s: a[0] * a[1],
    "Div": _div, "Neg": lambda n, a, s: -a[0], "Sqrt": lambda n, a, s: np.sqrt(a[0]),
    "Reciprocal": lambda n, a, s: 1.0 / a[0], "Pow": lambda n, a, s: np.power(a[0], a[1]),
    "Max": lambda n, a, s: np.maximum(a[0], a[1]), "Min": lambda n, a, s: np.minimum(a[0], a[1]),
    "Equal": lambda n, a, s: np.equal(a[0], a[1]), "Where": lambda n, a, s: np.where(a[0], a[1], a[2]),
    # masks (match/causal.py): positions compared, combined, broadcast, triangles
    "Less": lambda n, a, s: np.less(a[0], a[1]), "LessOrEqual": lambda n, a, s: np.less_equal(a[0], a[1]),
    "Greater": lambda n, a, s: np.greater(a[0], a[1]),
    "GreaterOrEqual": lambda n, a, s: np.greater_equal(a[0], a[1]),
    "And": lambda n, a, s: np.logical_and(a[0], a[1]), "Or": lambda n, a, s: np.logical_or(a[0], a[1]),
    "Not": lambda n, a, s: np.logical_not(a[0]), "Abs": lambda n, a, s: np.abs(a[0]),
    "Range": lambda n, a, s: _range(a), "Expand": lambda n, a, s: _expand(a),
    "ConstantOfShape": _constant_of_shape, "Trilu": _trilu, "GatherND": _gather_nd,
}


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


# Proofs of the graph as it is now (its revision): the same chain is proved for every rule and alternative that
# reads it (a GPT-2 export with a KV cache: 7220 proofs in one rewrite, 3787 of them distinct, half its time)
_proofs: dict[tuple, Proof | tuple[type[Unprovable], tuple]] = {}
_starts: dict[tuple, tuple] = {}  # the state after a proof's first step (_started)
_numbers: dict[int, np.ndarray] = {}
SMALL_VALUE = 1 << 12  # values a proof's first step computed that later proofs reuse: shape arithmetic, not the
# dummies it ran data movement on (kept, those held 100 MB more while a Swin export was rewritten)
_proofs_of: list[tuple[Graph, int]] = []


def prove_layout(graph: Graph, source: str, value: str, identity: frozenset[int], layout: Layout) -> Proof:
    """Prove that `value` is `layout` applied to `source` (the nodes in `identity`, scalar factors, count as
    the identity); raises Unprovable with the reason it is not. Memoized while the graph is unchanged."""
    if not _proofs_of or _proofs_of[0][0] is not graph or _proofs_of[0][1] != graph.revision:
        _proofs.clear()
        _starts.clear()
        _proofs_of[:] = [(graph, graph.revision)]
    key = (source, value, identity, layout.text)
    if key not in _proofs:
        try:
            _proofs[key] = _prove_layout(graph, source, value, identity, layout)
        except Unprovable as e:
            _proofs[key] = (type(e), e.args)  # not the exception: its traceback holds the proof's arrays
    out = _proofs[key]
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


def _started(graph: Graph, source: str, identity: frozenset[int], sizes: Sizes) -> _Interpreter:
    """An interpreter at `sizes` that has worked out the shape of `source` (interp.shapes[source]): from the
    state an earlier proof of the unchanged graph left after the same step (`_starts`: the sizes its symbols got,
    the shapes and values worked out), else worked out now. The proofs from one source share its ancestors:
    hundreds of values in a decoder whose made-up dims all come from the KV cache."""
    key = (source, identity, sizes.variant)
    hit = _starts.get(key)
    interp = _Interpreter(graph, sizes, identity)
    if hit is None:
        interp.shape_of(source)
        small = {k: v for k, v in interp.memo.items() if not isinstance(v, np.ndarray) or v.size <= SMALL_VALUE}
        _starts[key] = (dict(sizes.of), dict(interp.shapes), set(interp.guessed), small)
    else:
        sizes.of, interp.shapes, interp.guessed, interp.memo = dict(hit[0]), dict(hit[1]), set(hit[2]), dict(hit[3])
    return interp


def _prove_layout(graph: Graph, source: str, value: str, identity: frozenset[int], layout: Layout) -> Proof:
    avoid = _static_dims(graph)
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
        if isinstance(out, _Opaque):
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
    avoid = _static_dims(graph)
    for data, other in sides:
        t = graph.type_of(node.inputs[other])
        if t is None or t.shape is None or any(d != 1 for d in t.shape):
            continue
        if rank is not None and len(t.shape) > rank:
            continue  # would broadcast the data to a higher rank
        values = []
        for variant in (0, 1):
            try:
                v = _Interpreter(graph, Sizes(avoid, variant)).value(node.inputs[other])
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


# The interpreter, its opaque values and the graph's static dims, for the other proofs (match/functions.py).
Interpreter, Opaque, static_dims = _Interpreter, _Opaque, _static_dims

