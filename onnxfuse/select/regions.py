"""Regions: where a rewrite acts, cut out of the model as two small models (the original nodes and the fused ones)
so that its effect can be timed without running the whole model.

A region is a cluster of applied rewrites (rewrites that replaced the same original nodes, directly or through
an earlier rewrite, form one cluster) together with context: the nodes one edge away on each side (the
producers of its inputs and the readers of its outputs), taken from the original model and the same in both
versions. The context is there so that onnxruntime's own fusions across the region's boundary (a MatMul's bias
Add, an activation after a Conv) happen in the timed models as they would in the whole model.

Regions whose two versions are alike (same op types, attributes, constants up to their values where large,
and the shapes their inputs had when the model ran) are one *class*: twelve BERT layers are timed once. The
class signature is a digest of that canonical form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir import Graph, Model, Node
from ..model_proto import make_model
from ..rewrite.apply import Application
from ..tensors import TensorType
from .decide import Evidence
from .op_prior import OpCost, op_cost
from .units import Untimeable

__all__ = ["Region", "RegionClass", "const_bytes", "find_regions", "region_model", "signature"]

Key = tuple[str, str]
SMALL_CONST = 64  # constants up to this many elements enter a signature by value (shapes, axes, scales; a
# bound, not measured: larger ones are weights, which enter by shape and type)
CONTEXT_MAX_BYTES = 16 << 20  # a neighbour with more weights than this is not context: it would swamp the
# region's time (and memory) with work both versions do alike (a bound, not measured)


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
        return _const_text(self.value())


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
    cost: OpCost | None = None  # the op-cost prior's count (op_prior.py), where every type is known

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


SHAPE_VALUES = 64  # a region whose inputs are all integers this small computes shapes (see RegionClass.shape_only;
# a bound, not measured: shape vectors have at most a few dozen elements)
# the order classes are timed in (RegionClass.potential) only: not measured, a roofline guess (a core moving
# ~10 GB/s and computing ~50 GFLOP/s weighs a FLOP a fifth of a byte; a node of unknown types 256 KB); a wrong
# guess times a class later, and the budget's end leaves it to its prior, never to a coin flip
FLOPS_PER_BYTE = 5.0
AVG_BYTES = 256 * 1024


def _integer(elem_type: int) -> bool:
    """An integer or bool element type (shape arithmetic's)."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).kind in "iub"
    except (KeyError, ValueError):
        return False


@dataclass
class RegionClass:
    """Alike regions, timed once through the first."""

    sig: str
    regions: list[Region]
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)  # per profile, the first region's inputs
    evidence: Evidence | None = None  # what timing it showed (None: not timed)
    seconds_each: float = 0.0  # its first region's original version, per run (estimator clock)
    failed: str = ""  # why onnxruntime could not run it alone (then its prior decides)

    @property
    def shape_only(self) -> bool:
        """The region reads only a few integers and writes integers (shape arithmetic): there is nothing to time;
        it is kept. (An embedding lookup also reads a few integers at a short sequence, but writes floats.)"""
        rep = self.regions[0]
        outs = [rep.types.get(v) for v in rep.outputs]
        return all(t is not None and _integer(t.elem_type) for t in outs) and all(
            a.size <= SHAPE_VALUES and a.dtype.kind in "iu" for feeds in self.feeds for a in feeds.values())

    @property
    def keys(self) -> list[Key]:
        return [k for r in self.regions for k in r.keys]

    @property
    def weight(self) -> int:
        """Its regions times their nodes (once the regions are decided and their nodes gone: its regions)."""
        return len(self.regions) * max(1, len(self.regions[0].original))

    @property
    def potential(self) -> float:
        """What it could save, before timing: its regions times the bytes their original nodes move plus their
        FLOPs over FLOPS_PER_BYTE (op_prior.py's count, at the larger size of a symbolic dim); by node count
        (AVG_BYTES each) where a type is unknown. Classes are timed largest first."""
        cost = self.regions[0].cost
        work = (cost.bytes[-1][0] + cost.flops[-1][0] / FLOPS_PER_BYTE) if cost is not None else \
            AVG_BYTES * max(1, len(self.regions[0].original))
        return len(self.regions) * work



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


# ---- signature ------------------------------------------------------------------------------------------------

def _const_text(a: np.ndarray) -> str:
    text = f"c{a.dtype.str}{list(a.shape)}"
    if a.size <= SMALL_CONST:
        text += hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    return text


def _side_text(nodes: list[onnx.NodeProto], consts: dict[str, Const], region: Region) -> str:
    ids: dict[str, str] = {}

    def ref(v: str) -> str:
        if not v:
            return "_"
        if v not in ids:
            if v in consts:
                ids[v] = f"{len(ids)}:{consts[v].text()}"
            elif v in region.inputs:
                ids[v] = f"{len(ids)}:in{region.inputs.index(v)}"
            else:
                ids[v] = f"{len(ids)}"
            return ids[v]
        return ids[v].split(":")[0]

    parts = []
    for n in nodes:
        attrs = ";".join(f"{a.name}={hashlib.sha1(a.SerializeToString()).hexdigest()[:16]}"
                         for a in sorted(n.attribute, key=lambda a: a.name))
        ins = ",".join(ref(v) for v in n.input)
        outs = ",".join(ref(v) for v in n.output)
        parts.append(f"{n.domain}::{n.op_type}({ins})->({outs}){{{attrs}}}")
    outs = ",".join(ref(v) for v in region.outputs)
    return "|".join(parts) + f"=>{outs}"


def signature(region: Region, shapes: list[list[tuple[str, tuple[int, ...]]]]) -> str:
    """The class of a region: both versions' canonical form, and the dtype and shape of each input as it ran
    (one list per shape profile, in region.inputs order)."""
    text = _side_text(region.original, region.orig_consts, region) + "##" + \
        _side_text(region.fused, region.fused_consts, region) + "##" + repr(shapes)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- a region as a model ----------------------------------------------------------------------------------------

def region_model(region: Region, fused: bool, opsets: dict[str, int], ir_version: int,
                 feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> bytes:
    """One version of the region as a serialized model whose inputs are the runtime values it reads (typed
    as in the original model, so that onnxruntime sees the same static and symbolic dims). `feeds`: the values
    it will be run on (one dict per profile); where the original has no shape for a value, a dim is static
    only if every profile's value has the same size there."""
    nodes = region.fused if fused else region.original
    consts = region.fused_consts if fused else region.orig_consts
    read = {i for n in nodes for i in n.input if i}
    all_feeds = feeds if isinstance(feeds, list) else [feeds]
    inputs = []
    for v in region.inputs:
        if v not in read:
            continue
        t = region.types.get(v)
        arr = all_feeds[0][v]
        typed = t is not None and t.shape is not None and len(t.shape) == arr.ndim
        dims = [d if not isinstance(d, int) or all(f[v].ndim == arr.ndim and f[v].shape[a] == d for f in all_feeds)
                else f"{v}_{a}" for a, d in enumerate(t.shape if typed else arr.shape)]
        elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        inputs.append(onnx.helper.make_tensor_value_info(v, elem, [d if d is not None else None for d in dims]))
    outputs = []
    for v in region.outputs:
        vi = onnx.ValueInfoProto()
        vi.name = v
        outputs.append(vi)
    inits = [numpy_helper.from_array(np.asarray(c.value()), name) for name, c in consts.items() if name in read]
    graph = onnx.helper.make_graph(list(nodes), "region", inputs, outputs, inits)
    return make_model(graph, opsets, ir_version).SerializeToString()
