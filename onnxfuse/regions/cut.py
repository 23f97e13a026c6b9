"""Regions: where a rewrite acts, cut out of the model as two small models (the original nodes and the fused
ones), so that its effect can be timed without running the whole model (select/ times them).

A region is a cluster of applied rewrites (rewrites that replaced the same original nodes, directly or through
an earlier rewrite, form one) with context: the nodes one edge away on each side, from the original model and
the same in both versions, so that onnxruntime's own fusions across the boundary (a MatMul's bias Add, an
activation after a Conv) happen in the timed models as in the whole one. Why a region cannot be cut out and run
alone is an `Untimeable`, never a sentence.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import onnx

from ..ir import Graph, Model, Node
from ..rewrite.apply import Application
from ..tensors import TensorType
from .cost import OpCost, op_cost

__all__ = ["Const", "Key", "Region", "Untimeable", "const_bytes", "find_regions"]

Key = tuple[str, str]  # one applied rewrite: (rule id, root value)
SMALL_CONST = 64  # constants up to this many elements enter a signature by value (shapes, axes, scales; a
# bound, not measured: larger ones are weights, which enter by shape and type)
CONTEXT_MAX_BYTES = 16 << 20  # a neighbour with more weights than this is not context: it would swamp the
# region's time (and memory) with work both versions do alike (a bound, not measured)


class Untimeable(Enum):
    """Why a region cannot be timed alone; the value is its message (a detail may follow it)."""

    IN_SUBGRAPH = "inside a subgraph"
    FOLDED = "replaces nodes that folding had made"
    REMOVES_ONLY = "removes nodes only (exact)"
    REWRITTEN_AGAIN = "its new nodes were rewritten again by a later rule"
    HOLDS_SUBGRAPH = "holds a subgraph"
    READS_RENAMED = "reads a value another rewrite renamed"
    WRITES_NEW = "writes a value the original nodes do not"
    SELF_CONTEXT = "its context depends on itself"
    MISSING_OUTPUT = "the fused nodes do not write a value its readers need"
    NO_ARRAY = "reads or writes a type onnxruntime's Python API cannot hand over as an array"
    FAILED = "onnxruntime could not run its two versions alone"

    @property
    def exact(self) -> bool:
        """Its rewrite only removes nodes: nothing to time, and it cannot make the model slower."""
        return self is Untimeable.REMOVES_ONLY

    @property
    def on_model(self) -> bool:
        """It reads or rewrites what other rewrites made: decided with them on the whole model (a chain of
        Transposes moved below a run of ops, a BatchNorm folded after them), not left as the original."""
        return self in (Untimeable.FOLDED, Untimeable.REWRITTEN_AGAIN, Untimeable.READS_RENAMED)


@dataclass(frozen=True)
class Const:
    """A constant a region reads, read only when its model is built (a class's first region): regions of a
    model over 2 GB would otherwise hold its weights several times over. Reads bypass the IR's value cache."""

    graph: Graph
    name: str

    def value(self) -> np.ndarray:
        t = self.graph.initializer(self.name)
        if t is not None:
            return self.graph.model.tensor_to_array(t)
        return self.graph.const_value(self.name)

    def text(self) -> str:
        """Its part of a signature: dtype and shape; small ones (shapes, axes, scales) by value too."""
        t = self.graph.type_of(self.name)
        if t is not None and t.shape is not None and all(isinstance(d, int) for d in t.shape) and \
                int(np.prod(t.shape)) > SMALL_CONST and self.graph.initializer(self.name) is not None:
            return f"c{t.elem_type}{list(t.shape)}"
        return const_text(self.value())


def const_text(a: np.ndarray) -> str:
    text = f"c{a.dtype.str}{list(a.shape)}"
    if a.size <= SMALL_CONST:
        text += hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    return text


@dataclass
class Region:
    """One cluster of rewrites, with everything needed to time it alone."""

    keys: list[Key]
    rules: list[str]
    ops: list[str]  # fused op types created (qualified)
    original: list[onnx.NodeProto] = field(default_factory=list)  # original nodes + context, graph order
    fused: list[onnx.NodeProto] = field(default_factory=list)  # fused nodes + the same context
    orig_consts: dict[str, Const] = field(default_factory=dict)
    fused_consts: dict[str, Const] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)  # runtime values either version reads (from a run)
    outputs: list[str] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)  # declared types of inputs/outputs (original)
    untimeable: Untimeable | None = None  # why this region cannot be timed alone (None when it can)
    detail: str = ""  # what that reason names (a value)
    cost: OpCost | None = None  # the op-cost prior's count (cost.py), where every type is known

    def drop_models(self) -> None:
        """Forget what building the two models needs (the node protos and constants, which keep the loaded
        models alive): once its class is decided, a region is only reported."""
        self.original, self.fused, self.orig_consts, self.fused_consts = [], [], {}, {}

    @property
    def weight_bytes(self) -> int:
        """Bytes of the constants both versions hold (what building and loading them costs)."""
        consts = list(self.orig_consts.items()) + list(self.fused_consts.items())
        return sum(const_bytes(c.graph, [n]) for n, c in consts)

    @property
    def label(self) -> str:
        return "+".join(sorted(set(self.ops))) or "(removes nodes only)"


class _Clusters:
    """Union-find over applications by the original nodes they replaced."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _node_name(n: Node) -> str:
    return n.name or n.outputs[0]


def find_regions(original: Model, final: Model, apps: list[Application], rule_ids: set[str]) -> list[Region]:
    """The regions of `final`'s rule rewrites (those of `rule_ids`; folding is exact and not a region), in
    graph order. `original` is the input model as loaded (not rewritten)."""
    root_name = final.graph.proto.name
    rule_apps = [a for a in apps if a.rule in rule_ids]
    clusters = _Clusters(len(rule_apps))
    first_by_node: dict[str, int] = {}
    for i, a in enumerate(rule_apps):
        for name in a.replaced:
            if name in first_by_node:
                clusters.union(first_by_node[name], i)
            else:
                first_by_node[name] = i
    members: dict[int, list[Application]] = {}
    for i, a in enumerate(rule_apps):
        members.setdefault(clusters.find(i), []).append(a)
    og, fg = original.graph, final.graph
    orig_by_name = {_node_name(n): n for n in og.nodes if n.alive}
    fused_by_name = {n.name: n for n in fg.nodes if n.alive and n.name}
    in_any = set(first_by_node)
    regions = []
    for group in members.values():
        region = Region([a.key for a in group], sorted({a.rule for a in group}),
                        sorted({o for a in group for o in a.ops}))
        if any(a.graph != root_name for a in group):
            region.untimeable = Untimeable.IN_SUBGRAPH
        else:
            _fill(region, group, og, fg, orig_by_name, fused_by_name, in_any)
        regions.append(region)
    return regions


def _fill(region: Region, group: list[Application], og: Graph, fg: Graph, orig_by_name: dict[str, Node],
          fused_by_name: dict[str, Node], in_any: set[str]) -> None:
    replaced = {n for a in group for n in a.replaced}
    orig = [orig_by_name[n] for n in sorted(replaced) if n in orig_by_name]
    if len(orig) != len(replaced):
        region.untimeable = Untimeable.FOLDED
        return
    created = [n for a in group for n in a.created]
    fused = [fused_by_name[n] for n in created if n in fused_by_name]
    if not created:
        region.untimeable = Untimeable.REMOVES_ONLY
        return
    if not fused:  # made nodes that a later rewrite replaced again: not exact, and not timeable alone
        region.untimeable = Untimeable.REWRITTEN_AGAIN
        return
    region.cost = op_cost(orig, fused, og, fg)
    if any(n.subgraphs for n in orig + fused):
        region.untimeable = Untimeable.HOLDS_SUBGRAPH
        return
    f_in, f_out = _boundary(fused, fg)
    if any(not _known(v, og) and not fg.is_constant(v) for v in f_in):
        region.untimeable = Untimeable.READS_RENAMED
        return
    o_produced = {o for n in orig for o in n.outputs if o}
    if any(v not in o_produced for v in f_out):
        region.untimeable = Untimeable.WRITES_NEW
        return
    o_in = [v for v in dict.fromkeys(i for n in orig for i in n.inputs if i) if v not in o_produced]
    # context: readers of the outputs and producers of the runtime inputs, from the original model
    alive = {_node_name(n) for n in fg.nodes if n.alive}

    def usable(n: Node) -> bool:
        return (n.alive and not n.subgraphs and _node_name(n) not in in_any and _node_name(n) in alive
                and n.op_type != "Constant" and const_bytes(og, n.inputs) <= CONTEXT_MAX_BYTES)

    after = [c for v in f_out for c in og.consumers.get(v, ()) if usable(c)]
    before = [p for v in dict.fromkeys(o_in + f_in) if not og.is_constant(v) and not fg.is_constant(v)
              and (p := og.producer.get(v)) is not None and usable(p)]
    context = list({id(n): n for n in before + after}.values())
    orig_all = _graph_order(orig + context)
    fused_all = _graph_order(context) + fused  # fused nodes are in a valid order among themselves
    fused_all = _topo(fused_all)
    if fused_all is None:
        region.untimeable = Untimeable.SELF_CONTEXT
        return
    _cut(region, orig_all, fused_all, og, fg, in_any)


def _cut(region: Region, orig_all: list[Node], fused_all: list[Node], og: Graph, fg: Graph, in_any: set[str]
         ) -> None:
    """The region's two versions (nodes with context), their constants, run-time inputs, outputs and types."""
    region.original = [n.proto for n in orig_all]
    region.fused = [n.proto for n in fused_all]
    o_in2, _ = _boundary(orig_all, og)
    f_in2, _ = _boundary(fused_all, fg)
    o_out = _outputs(orig_all, fused_all, og, fg, in_any)
    runtime: list[str] = []
    for v in o_in2:
        if og.is_constant(v):
            region.orig_consts[v] = Const(og, v)
        else:
            runtime.append(v)
    for v in f_in2:
        if fg.is_constant(v):
            region.fused_consts[v] = Const(fg, v)
        elif og.is_constant(v):
            region.fused_consts[v] = Const(og, v)
        else:
            runtime.append(v)
    region.inputs = list(dict.fromkeys(runtime))
    region.outputs = list(dict.fromkeys(o_out))
    missing = [v for v in region.outputs if v not in {o for n in fused_all for o in n.outputs}]
    if missing:
        region.untimeable, region.detail = Untimeable.MISSING_OUTPUT, missing[0]
        return
    for v in region.inputs + region.outputs:
        t = og.type_of(v)
        if t is not None:
            region.types[v] = t
    odd = next((v for v, t in region.types.items() if t.elem_type in NO_NUMPY), None)
    if odd is not None:
        region.untimeable = Untimeable.NO_ARRAY
        region.detail = f"{onnx.TensorProto.DataType.Name(region.types[odd].elem_type).lower()} {odd!r}"


# element types onnxruntime's Python API returns no numpy array for (a region reading or writing one is not timed)
NO_NUMPY = frozenset({onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
                      onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.UINT4,
                      onnx.TensorProto.INT4})


def const_bytes(g: Graph, names: list[str]) -> int:
    """Bytes of the initializers among `names`, from their declared shapes (nothing is read)."""
    total = 0
    for v in names:
        t = g.initializer(v) if v else None
        if t is not None:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 4
            total += int(np.prod([int(d) for d in t.dims], dtype=np.int64)) * max(1, itemsize)
    return total


def _known(v: str, g: Graph) -> bool:
    return v in g.producer or v in g.input_names or g.initializer(v) is not None


def _boundary(nodes: list[Node], g: Graph) -> tuple[list[str], list[str]]:
    """(values the nodes read but do not write, values they write that another node of `g` reads or that `g`
    outputs)."""
    ids = {id(n) for n in nodes}
    produced = [o for n in nodes for o in n.outputs if o]
    produced_set = set(produced)
    ins = [v for v in dict.fromkeys(i for n in nodes for i in n.inputs if i) if v not in produced_set]
    outs = [v for v in produced if g.is_graph_output(v)
            or any(id(c) not in ids and c.alive for c in g.consumers.get(v, ()))]
    return ins, outs


def _outputs(orig: list[Node], fused: list[Node], og: Graph, fg: Graph, in_any: set[str]) -> list[str]:
    """What the region must write: values of its original version that a node outside it still reads (in the
    original graph, a node no rewrite replaced and folding kept; in the rewritten graph, any live node), or a
    graph output."""
    o_ids, f_ids = {id(n) for n in orig}, {id(n) for n in fused}
    alive = {_node_name(n) for n in fg.nodes if n.alive}
    outs = []
    for v in (o for n in orig for o in n.outputs if o):
        if (og.is_graph_output(v)
                or any(id(c) not in o_ids and _node_name(c) in alive and _node_name(c) not in in_any
                       for c in og.consumers.get(v, ()))
                or any(id(c) not in f_ids and c.alive for c in fg.consumers.get(v, ()))):
            outs.append(v)
    return outs


def _graph_order(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: n.seq)


def _topo(nodes: list[Node]) -> list[Node] | None:
    """Nodes in an order where each reads only what earlier ones (or the outside) wrote; None on a cycle."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    order: list[Node] = []
    state = [0] * len(nodes)  # 0 new, 1 on stack, 2 done

    def visit(i: int) -> bool:
        if state[i] == 2:
            return True
        if state[i] == 1:
            return False
        state[i] = 1
        for v in nodes[i].inputs:
            j = producer.get(v)
            if j is not None and j != i and not visit(j):
                return False
        state[i] = 2
        order.append(nodes[i])
        return True

    return order if all(visit(i) for i in range(len(nodes))) else None


