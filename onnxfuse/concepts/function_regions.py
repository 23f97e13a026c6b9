"""Function algebra: what a region of elementwise and normalizing ops computes from one value, proved by running it.

`computes(x, "gelu")` is any region of ops between `x` and the matched value whose only non-constant input is
`x` and that computes Gelu of `x`: x * 0.5 * (1 + erf(x / sqrt 2)) in any operand order, association, division or
multiplication by the reciprocal, through casts. The region is found by walking back from the value through the
ops a function can be made of (`REGION_OPS`); each value on the way that the region reads is a candidate source,
the nearest first. A candidate is proved by running the region in float64 on test inputs (random rows with an
offset each; for a normalization also rows scaled so that eps matters) and comparing with the function's
reference. A region that computes another function of the same family (Gelu's tanh approximation against Gelu)
is refused when it is nearer that one. A normalization's eps is the one-element value the region adds (tried in
turn when there are several; 0 when there is none); QuickGelu's alpha a one-element factor it multiplies or divides
by, with either sign (tried in turn; none: not that function).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from ..ir import Graph, Node
from ..opschema import attr_value, op_spec
from .function_table import FUNCTIONS, REGION_OPS, Function
from .interpreter import Interpreter, Opaque, Sizes, static_dims
from .shape_ops import Unprovable

__all__ = ["FUNCTIONS", "REFERENCES", "Region", "regions"]

MAX_REGION = 32  # nodes a region may have
MAX_TEST = 1 << 16  # elements of a test input
SOME_DIM = 3  # a dim of unknown size, tested at this one (_some_shape)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _layernorm(x: np.ndarray, eps: float) -> np.ndarray:
    d = x - x.mean(axis=-1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)


def _rmsnorm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


# Each function's reference (x, its parameter: eps or alpha) -> y in float64.
REFERENCES: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "gelu": lambda x, e: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x, e: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x, e: x * _sigmoid(x),
    "quickgelu": lambda x, a: x * _sigmoid(a * x),
    "hardsigmoid": lambda x, e: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hardswish": lambda x, e: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
}
assert set(REFERENCES) == set(FUNCTIONS), "each function of the language has a reference here"


def _float(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def _reduce_axes(node: Node, args: list, spec, rank: int) -> tuple[int, ...] | None:
    if node.op_type == "GlobalAveragePool":
        return tuple(range(2, rank))
    if len(args) > 1 and args[1] is not None:
        axes = [int(v) for v in np.asarray(args[1]).reshape(-1)]
    else:
        a = attr_value(node.proto, "axes", spec)
        axes = None if a is None else [int(v) for v in a]
    if not axes:
        noop = attr_value(node.proto, "noop_with_empty_axes", spec)
        return () if noop else None
    return tuple(x % rank for x in axes)


def _reduce(node: Node, a: list, spec) -> np.ndarray:
    x = a[0]
    axes = _reduce_axes(node, a, spec, x.ndim)
    keep = node.op_type == "GlobalAveragePool" or bool(attr_value(node.proto, "keepdims", spec) if
                                                       attr_value(node.proto, "keepdims", spec) is not None else 1)
    if axes == ():
        return x
    if node.op_type == "ReduceSumSquare":
        return np.sum(x * x, axis=axes, keepdims=keep)
    f = np.sum if node.op_type == "ReduceSum" else np.mean
    return f(x, axis=axes, keepdims=keep)


def _cast(node: Node, a: list, spec) -> np.ndarray:
    np_type = onnx.helper.tensor_dtype_to_np_dtype(int(attr_value(node.proto, "to", spec)))
    return a[0] if np.dtype(np_type).kind == "f" else a[0].astype(np_type)  # floats stay float64


def _clip(node: Node, a: list, spec) -> np.ndarray:
    lo = a[1] if len(a) > 1 and a[1] is not None else attr_value(node.proto, "min", spec)
    hi = a[2] if len(a) > 2 and a[2] is not None else attr_value(node.proto, "max", spec)
    return np.clip(a[0], -np.inf if lo is None else lo, np.inf if hi is None else hi)


def _axes_of(node: Node, a: list, spec) -> list[int]:
    if len(a) > 1 and a[1] is not None:
        return [int(v) for v in np.asarray(a[1]).reshape(-1)]
    return [int(v) for v in attr_value(node.proto, "axes", spec) or []]


def _unsqueeze(node: Node, a: list, spec) -> np.ndarray:
    x = a[0]
    axes = sorted(ax % (x.ndim + len(_axes_of(node, a, spec))) for ax in _axes_of(node, a, spec))
    for ax in axes:
        x = np.expand_dims(x, ax)
    return x


def _squeeze(node: Node, a: list, spec) -> np.ndarray:
    axes = _axes_of(node, a, spec)
    return np.squeeze(a[0], axis=tuple(ax % a[0].ndim for ax in axes) if axes else None)


# The ops a region may consist of, run in float64.
_RUN: dict[str, Callable[[Node, list, object], np.ndarray]] = {
    "Add": lambda n, a, s: a[0] + a[1], "Sub": lambda n, a, s: a[0] - a[1], "Mul": lambda n, a, s: a[0] * a[1],
    "Div": lambda n, a, s: a[0] / a[1], "Pow": lambda n, a, s: np.power(a[0], a[1]),
    "Sqrt": lambda n, a, s: np.sqrt(a[0]), "Reciprocal": lambda n, a, s: 1.0 / a[0], "Neg": lambda n, a, s: -a[0],
    "Erf": lambda n, a, s: _erf(a[0]), "Tanh": lambda n, a, s: np.tanh(a[0]), "Sigmoid": lambda n, a, s: _sigmoid(a[0]),
    "Exp": lambda n, a, s: np.exp(a[0]), "Identity": lambda n, a, s: a[0], "Cast": _cast,
    "Max": lambda n, a, s: np.maximum(a[0], a[1]), "Min": lambda n, a, s: np.minimum(a[0], a[1]),
    "Relu": lambda n, a, s: np.maximum(a[0], 0.0), "Clip": _clip, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "ReduceMean": _reduce, "ReduceSum": _reduce, "ReduceSumSquare": _reduce, "GlobalAveragePool": _reduce,
}
assert set(_RUN) == REGION_OPS, "the matcher runs every op the language lets a region have"


@dataclass(frozen=True)
class Region:
    """A region proved to compute a function of `source`: its nodes (data flow from the source), and the value of
    the function's parameter (eps, alpha; 0 where it has none)."""

    source: str
    nodes: tuple[Node, ...]
    param: float
    reader: Node  # a node of the region that reads the source


def _walk(graph: Graph, value: str, skip: set[int]) -> list[Node]:
    """The nodes of REGION_OPS reached walking back from `value`, nearest first (at most MAX_REGION)."""
    out: list[Node] = []
    seen: set[int] = set()
    queue = [value]
    while queue and len(out) < MAX_REGION:
        v = queue.pop(0)
        node = graph.producer.get(v)
        if node is None or id(node) in seen or id(node) in skip or node.domain != "" or node.op_type not in _RUN:
            continue
        if graph.is_constant(v):
            continue
        seen.add(id(node))
        out.append(node)
        queue.extend(i for i in node.inputs if i)
    return out


def _region_from(graph: Graph, value: str, source: str, walked: list[Node]) -> list[Node] | None:
    """The walked nodes whose value depends on `source` through the region, in evaluation order (None when
    `value` does not)."""
    by_out = {o: n for n in walked for o in n.outputs if o}
    dep: dict[str, bool] = {source: True}

    def depends(v: str, depth: int = 0) -> bool:
        if v in dep:
            return dep[v]
        dep[v] = False  # (no cycles in a graph; guards the recursion)
        n = by_out.get(v)
        if n is not None and depth < 4 * MAX_REGION:
            dep[v] = any([depends(i, depth + 1) for i in n.inputs if i])  # every input: place() reads them all
        return dep[v]

    if not depends(value):
        return None
    order: list[Node] = []
    placed: set[int] = set()

    def place(v: str) -> None:
        n = by_out.get(v)
        if n is None or id(n) in placed or not dep.get(v):
            return
        for i in n.inputs:
            if i and i != source:
                place(i)
        placed.add(id(n))
        order.append(n)

    place(value)
    return order


class _Run:
    """Runs a region in float64: the source given, the other inputs (constants, shape arithmetic of the
    source) folded by the shape interpreter at one set of sizes."""

    def __init__(self, graph: Graph, nodes: list[Node], source: str, value: str, interp: Interpreter) -> None:
        self.g, self.nodes, self.source, self.value, self.interp = graph, nodes, source, value, interp
        self.made = {o for n in nodes for o in n.outputs if o}
        self.leaves: dict[str, np.ndarray] = {}
        for n in nodes:
            for i in n.inputs:
                if i and i != source and i not in self.made and i not in self.leaves:
                    try:
                        v = interp.value(i)
                    except Unprovable as e:
                        raise Unprovable(f"{i!r} cannot be folded ({e})") from None
                    if isinstance(v, Opaque):
                        raise Unprovable(f"it also reads {i!r}, which is not a constant")
                    self.leaves[i] = np.asarray(v)

    def adds(self) -> list[float]:
        """One-element values the region adds (a normalization's eps candidates)."""
        out: list[float] = []
        for n in self.nodes:
            if n.op_type == "Add":
                for i in n.inputs:
                    v = self.leaves.get(i)
                    if v is not None and v.size == 1 and v.dtype.kind == "f" and float(v.reshape(-1)[0]) not in out:
                        out.append(float(v.reshape(-1)[0]))
        return out

    def factors(self) -> list[float]:
        """One-element values the region multiplies by, or divides by (as their reciprocal), each with either sign
        (a factor inside exp(-a x) is -a): QuickGelu's alpha candidates."""
        out: list[float] = []
        for n in self.nodes:
            if n.op_type in ("Mul", "Div"):
                for k, i in enumerate(n.inputs):
                    v = self.leaves.get(i)
                    if v is None or v.size != 1 or v.dtype.kind != "f" or n.op_type == "Div" and k == 0:
                        continue
                    a = float(v.reshape(-1)[0])
                    a = 1.0 / a if n.op_type == "Div" and a != 0 else a
                    out += [c for c in (a, -a) if c not in out]
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        env: dict[str, np.ndarray] = {self.source: x}
        for n in self.nodes:
            args = [None if not i else env[i] if i in env else _float(self.leaves[i]) for i in n.inputs]
            spec = op_spec("", n.op_type, self.g.model.opset)
            with np.errstate(all="ignore"):
                env[n.outputs[0]] = np.asarray(_RUN[n.op_type](n, args, spec))
        return env[self.value]


def _some_shape(t) -> tuple[int, ...] | None:
    """A shape of the source's rank to test on where the interpreter knows none (a dim written as -1 in the
    model, Paddle's export): its known dims, SOME_DIM for the others. The region's ops are elementwise or reduce
    over a whole axis, so what it computes does not depend on the sizes it is tested at."""
    if t is None or t.shape is None:
        return None
    return tuple(d if isinstance(d, int) and d > 0 else SOME_DIM for d in t.shape)


def _inputs(shape: tuple[int, ...], fn: Function, eps: float) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    if fn.eps:
        x = x + 3.0 * rng.standard_normal((*shape[:-1], 1))  # a mean of its own per row
        small = x * (math.sqrt(eps) if eps > 0 else 1e-3)  # rows whose variance is about eps
        return [x, small]
    return [x * 3.0]


def _error(y: np.ndarray, want: np.ndarray) -> float:
    if y.shape != want.shape:
        return math.inf
    d = np.abs(y - want) / (1.0 + np.abs(want))
    return float(np.nanmax(d)) if np.all(np.isfinite(y) == np.isfinite(want)) else math.inf


def _tolerance(graph: Graph, nodes: list[Node], source: str) -> float:
    """1e-5 where the region and its source are float32 or wider; 2e-3 where float16 or bfloat16 take part
    (rounded constants)."""
    low = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    for v in [source] + [i for n in nodes for i in n.inputs if i]:
        t = graph.type_of(v)
        if t is not None and t.elem_type in low:
            return 2e-3
    return 1e-5


Fail = Callable[[str, str, tuple[Node, ...]], None]


def regions(graph: Graph, value: str, fn: Function, skip: set[int], fail: Fail, inner: bool = False) \
        -> Iterator[Region]:
    """The regions that end at `value` and compute `fn` of one source, the nearest source first; `fail(node,
    reason, nodes)` is told why each candidate is not (`nodes`: the region that was tried, if any), except, with
    `inner`, that a region computes something else (a part of a longer chain, whose end is the one to explain)."""
    walked = _walk(graph, value, skip)
    if not walked:
        fail(value, f"computes {fn.name!r}: {value!r} is not computed by elementwise or normalizing ops", ())
        return
    if not any(n.op_type in fn.needs for n in walked):
        fail(walked[0].name, f"computes {fn.name!r}: no {' or '.join(sorted(fn.needs))} on the way to {value!r}", ())
        return
    candidates: list[str] = []
    for n in walked:
        for i in n.inputs:
            if i and i not in candidates and not graph.is_constant(i):
                candidates.append(i)
    vt = graph.type_of(value)
    interp = Interpreter(graph, Sizes(static_dims(graph), 0))
    for src in candidates:
        nodes = _region_from(graph, value, src, walked)
        if not nodes or not any(n.op_type in fn.needs for n in nodes):
            continue
        st = graph.type_of(src)
        if st is not None and vt is not None and st.elem_type != vt.elem_type:
            fail(nodes[0].name, f"computes {fn.name!r}: {src!r} is {st.dtype_name}, the result {vt.dtype_name}",
                 tuple(nodes))
            continue
        try:
            run = _Run(graph, nodes, src, value, interp)
            shape = interp.shape_of(src) or _some_shape(st)
            if shape is None:
                raise Unprovable(f"the shape of {src!r} is not known")
            if shape and 0 in shape[:-1] or (not fn.eps and shape and shape[-1] == 0):  # a declared empty dim:
                shape = tuple(d or 2 for d in shape[:-1]) + (shape[-1] or 2,)  # test on rows that exist
            if math.prod(shape) > MAX_TEST:  # keep the rows, fewer of them
                shape = (*[1] * (len(shape) - 1), shape[-1]) if len(shape) else shape
            if not shape or math.prod(shape) > MAX_TEST:
                raise Unprovable(f"{src!r} is too large to test")
            params = (run.adds() or [0.0]) if fn.eps else run.factors() if fn.param == "alpha" else [0.0]
            if not params:
                raise Unprovable("it multiplies by no one-element factor (the alpha of x * sigmoid(alpha * x))")
            tol = _tolerance(graph, nodes, src)
            best = math.inf
            for param in params:
                xs = _inputs(shape, fn, param)
                err = max(_error(run(x), REFERENCES[fn.name](x, param)) for x in xs)
                best = min(best, err)
                if err > tol:
                    continue
                rivals = [f for f in FUNCTIONS.values() if fn.family and f.family == fn.family and f is not fn]
                nearer = next((f.name for f in rivals
                               if max(_error(run(x), REFERENCES[f.name](x, param)) for x in xs) < err), None)
                if nearer is not None:
                    fail(nodes[-1].name, f"computes {fn.name!r}: the ops from {src!r} compute {nearer!r}", tuple(nodes))
                    break
                reader = next(n for n in nodes if src in n.inputs)
                yield Region(src, tuple(nodes), param, reader)
                break
            else:
                if not inner:
                    fail(nodes[-1].name, f"computes {fn.name!r}: the ops from {src!r} compute something else "
                                         f"(off by {best:.3g}, tolerance {tol:g})", tuple(nodes))
        except (Unprovable, ValueError, IndexError, TypeError, KeyError) as e:
            fail(nodes[-1].name, f"computes {fn.name!r}: {e}", ())
