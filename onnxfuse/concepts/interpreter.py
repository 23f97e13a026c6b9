"""The shape interpreter behind the concepts' proofs: values of a graph evaluated with numpy at one set of
concrete sizes for its symbolic dims (`Sizes`: small primes no static dim uses). Shape arithmetic (Shape,
Gather, Concat, Slice, Cast, Unsqueeze, arithmetic, Sqrt, ...) and data movement run (shape_ops.py); any other
producer is opaque: only its shape can be read, from the graph's types or worked out from its producer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node
from ..opschema import attr_value, op_spec
from .shape_ops import BROADCAST, MAX_ELEMENTS, MOVES, OPS, SAME_SHAPE, Unprovable, ints

__all__ = ["MAX_ELEMENTS", "Interpreter", "Opaque", "Sizes", "static_dims"]

MAX_ANCESTORS = 1 << 16  # values one shape is worked out from, at most (a 12-layer BERT export's last layer: 390)
_PRIMES = tuple(p for p in range(3, 8000) if all(p % q for q in range(2, int(p ** 0.5) + 1)))


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
                if out is not None and (node.op_type not in BROADCAST or node.domain != "") \
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
        if op in SAME_SHAPE:
            return ins[0] if value == node.outputs[0] else None
        if op in BROADCAST:
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
                    return tuple(np.broadcast_shapes(ins[0], tuple(ints(target))))
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
        if op in MOVES and value not in self.running:  # run it (on a dummy where its input is opaque)
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
        impl = OPS.get(op) if node.domain == "" else None
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
            if op not in MOVES or not isinstance(args[0], _Opaque) or args[0].shape is None \
                    or any(isinstance(a, _Opaque) for a in args[1:]) or math.prod(args[0].shape) > MAX_ELEMENTS:
                return _Opaque(self.shape_of(name, depth))
            args[0] = np.zeros(args[0].shape, dtype=np.int8)  # only the shape it gives is read
            try:
                dummy = OPS[op](node, args, op_spec("", op, self.g.model.opset))
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


# The interpreter, its opaque values and the graph's static dims, for the other proofs (function_regions.py, causal.py).
Interpreter, Opaque, static_dims = _Interpreter, _Opaque, _static_dims
