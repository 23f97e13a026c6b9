"""A thin, mutable graph over ONNX protos: producers, consumers, constants, types, nested subgraphs.

Untouched nodes stay the original NodeProto objects (metadata, doc strings and attributes survive as they
were); initializers stay TensorProtos (external data is read only when a pattern needs a value).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import ModelError
from .tensors import TensorType, constant_node_value, read_external_tensor, type_from_proto

KEEP_BYTES = 1 << 20  # constants up to this size stay in a model's value cache once read (const_value)

class Node:
    """One node of a graph. `proto` is the NodeProto; `seq` orders nodes for a stable topological sort."""

    __slots__ = ("proto", "graph", "subgraphs", "alive", "seq", "implicit_inputs", "provenance")

    def __init__(self, proto: onnx.NodeProto, graph: Graph, seq: tuple[int, ...]) -> None:
        self.proto = proto
        self.graph = graph
        self.seq = seq
        self.alive = True
        self.provenance: tuple[str, list[str]] | None = None
        self.subgraphs: dict[str, list[Graph]] = {}
        for attr in proto.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                self.subgraphs[attr.name] = [Graph(attr.g, graph.model, parent=graph)]
            elif attr.type == onnx.AttributeProto.GRAPHS:
                self.subgraphs[attr.name] = [Graph(g, graph.model, parent=graph) for g in attr.graphs]
        self.implicit_inputs: set[str] = set()
        for subs in self.subgraphs.values():
            for sub in subs:
                self.implicit_inputs |= sub.outer_references()

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def domain(self) -> str:
        return self.proto.domain if self.proto.domain not in ("ai.onnx",) else ""

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    def attr(self, name: str) -> onnx.AttributeProto | None:
        for a in self.proto.attribute:
            if a.name == name:
                return a
        return None

    def __repr__(self) -> str:
        return f"Node({self.op_type} {self.name!r})"


class Graph:
    """A graph or subgraph. Values from an enclosing graph are visible (outer-scope references)."""

    def __init__(self, proto: onnx.GraphProto, model: Model, parent: Graph | None = None) -> None:
        self.proto = proto
        self.model = model
        self.parent = parent
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in proto.initializer}
        self.input_names = [v.name for v in proto.input]
        self.output_names = [v.name for v in proto.output]
        self.graph_outputs = set(self.output_names)
        self.types: dict[str, TensorType] = {}
        for vi in list(proto.input) + list(proto.output) + list(proto.value_info):
            t = type_from_proto(vi.type)
            if t is not None:
                self.types[vi.name] = t
        for t in proto.initializer:
            self.types.setdefault(t.name, TensorType(t.data_type, tuple(int(d) for d in t.dims)))
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = {}
        self.nodes: list[Node] = []
        self.new_initializers: dict[str, onnx.TensorProto] = {}
        self.frozen = False  # kept verbatim: passes (model.graphs()) never visit it or its subgraphs
        self.revision = 0  # counts the changes of nodes, edges and types (what caches of derived facts key on)
        self._derived: tuple[int, dict[str, dict]] = (0, {})  # (revision, memos): see derived()
        for i, np_ in enumerate(proto.node):
            self._index(Node(np_, self, (i,)))
        model.names.update(self.initializers)
        model.names.update(self.input_names)

    # ----- structure -------------------------------------------------------------------------------------
    def _index(self, node: Node) -> None:
        self.nodes.append(node)
        self._index_uses(node)

    def _index_uses(self, node: Node) -> None:
        """(Re-)register a live node's outputs and inputs in the producer/consumer maps."""
        for o in node.proto.output:
            if o:
                self.producer[o] = node
                self.model.names.add(o)
        for i in self._uses(node):
            self.consumers.setdefault(i, []).append(node)

    @staticmethod
    def _uses(node: Node) -> list[str]:
        uses = [i for i in node.proto.input if i]
        uses.extend(sorted(node.implicit_inputs))
        return uses

    def add_node(self, proto: onnx.NodeProto, seq: tuple[int, ...]) -> Node:
        node = Node(proto, self, seq)
        self._index(node)
        self.revision += 1
        return node

    def remove_node(self, node: Node) -> None:
        if not node.alive:
            return
        node.alive = False
        self.revision += 1
        for o in node.proto.output:
            if self.producer.get(o) is node:
                del self.producer[o]
        for i in self._uses(node):
            lst = self.consumers.get(i)
            if lst and node in lst:
                lst.remove(node)
                if not lst:
                    del self.consumers[i]

    def replace_input_with(self, node: Node, index: int, new: str) -> None:
        """Make input `index` of a live `node` read `new`; the consumer maps follow."""
        old = node.proto.input[index]
        if old == new:
            return
        node.proto.input[index] = new
        self.revision += 1
        if old and old not in node.proto.input and old not in node.implicit_inputs:
            lst = self.consumers.get(old)
            if lst and node in lst:
                lst.remove(node)
                if not lst:
                    del self.consumers[old]
        if new and node not in self.consumers.get(new, []):
            self.consumers.setdefault(new, []).append(node)

    def replace_all_uses_with(self, old: str, new: str) -> None:
        """Make every explicit reader of `old` in this graph read `new` (readers inside subgraphs that capture
        `old` by name are not rewired: callers keep the name alive for them, e.g. through an Identity)."""
        for reader in list(self.consumers.get(old, [])):
            for i, name in enumerate(reader.proto.input):
                if name == old:
                    self.replace_input_with(reader, i, new)

    def live_nodes(self) -> Iterator[Node]:
        return (n for n in self.nodes if n.alive)

    def outer_references(self) -> set[str]:
        """Names this graph (and its nested subgraphs) read but do not define."""
        defined = set(self.input_names) | set(self.initializers)
        for n in self.nodes:
            defined.update(o for o in n.proto.output if o)
        used: set[str] = set()
        for n in self.nodes:
            used.update(i for i in n.proto.input if i)
            used |= n.implicit_inputs
        used.update(self.output_names)
        return used - defined

    def all_graphs(self) -> Iterator[Graph]:
        """This graph and its nested subgraphs, frozen ones (and what they hold) left out."""
        if self.frozen:
            return
        yield self
        for n in self.nodes:
            if n.alive:
                for subs in n.subgraphs.values():
                    for sub in subs:
                        yield from sub.all_graphs()

    # ----- values ----------------------------------------------------------------------------------------
    def is_graph_output(self, name: str) -> bool:
        return name in self.graph_outputs

    def type_of(self, name: str) -> TensorType | None:
        g: Graph | None = self
        while g is not None:
            t = g.types.get(name)
            if t is not None:
                return t
            g = g.parent
        return None

    def initializer(self, name: str) -> onnx.TensorProto | None:
        g: Graph | None = self
        while g is not None:
            if name in g.new_initializers:
                return g.new_initializers[name]
            if name in g.initializers:
                return g.initializers[name]
            g = g.parent
        return None

    def _owner(self, name: str) -> Graph:
        """The graph (this one or an enclosing one) that defines `name`."""
        g: Graph | None = self
        while g is not None:
            if name in g.producer or name in g.initializers or name in g.new_initializers or name in g.input_names:
                return g
            g = g.parent
        return self

    def is_constant(self, name: str) -> bool:
        """True for initializers (not overridable graph inputs), outputs of Constant nodes, and Identity of
        those (exporters route shared weights through Identity), here or in an enclosing graph."""
        owner = self._owner(name) if name else self
        if owner is not self:
            return owner.is_constant(name)
        for _ in range(16):
            if not name:
                return False
            if self.initializer(name) is not None and not self._is_overridable(name):
                return True
            p = self.producer.get(name)
            if p is None or p.domain != "":
                return False
            if p.op_type == "Constant":
                return True
            if p.op_type != "Identity":
                return False
            name = p.proto.input[0]
        return False

    def _is_overridable(self, name: str) -> bool:
        g: Graph | None = self
        while g is not None:
            if name in g.input_names:
                return True
            if name in g.initializers:
                return False
            g = g.parent
        return False

    def const_value(self, name: str, keep: bool = True) -> np.ndarray | None:
        """The value of a constant, read lazily (external data included); None when not constant. `keep=False`:
        not kept in the model's cache (a big weight read once, for a look, is not held for the whole run); a value
        over KEEP_BYTES is never kept: read again where needed (a 12-layer BERT's projection weights, read once to
        be packed into Attention's, held 0.3 GB per rebuild of the model)."""
        owner = self._owner(name) if name else self
        if owner is not self:
            return owner.const_value(name, keep)
        if not self.is_constant(name):
            return None
        cache = self.model.value_cache
        key = (id(self), name)
        if key in cache:
            return cache[key]
        source = name
        while self.initializer(source) is None and self.producer[source].op_type == "Identity":
            source = self.producer[source].proto.input[0]
        t = self.initializer(source)
        if t is not None:
            value = self.model.tensor_to_array(t)
        else:
            value = constant_node_value(self.producer[source].proto)
        if keep and value.nbytes <= KEEP_BYTES:
            cache[key] = value
        return value

    def fresh_name(self, base: str) -> str:
        return self.model.fresh_name(base)

    def derived(self, name: str) -> dict:
        """A memo of facts derived from the graph as it is now (layout proofs, dims worked out): emptied when the
        graph changes (revision), and gone with the graph."""
        if self._derived[0] != self.revision:
            self._derived = (self.revision, {})
        return self._derived[1].setdefault(name, {})

    def set_type(self, name: str, t: TensorType) -> None:
        """The type (and shape) known for value `name`."""
        self.types[name] = t
        self.revision += 1

    def add_initializer(self, name: str, value: np.ndarray) -> str:
        name = self.fresh_name(name)
        value = np.asarray(value)
        t = numpy_helper.from_array(value if value.flags.c_contiguous else value.copy(), name)  # keeps 0-d
        self.new_initializers[name] = t
        self.types[name] = TensorType(t.data_type, tuple(int(d) for d in t.dims))
        return name

    # ----- export ----------------------------------------------------------------------------------------
    def sorted_nodes(self) -> list[Node]:
        """Live nodes in a topological order that keeps the original order wherever it can."""
        live = sorted((n for n in self.nodes if n.alive), key=lambda n: n.seq)
        pos = {id(n): i for i, n in enumerate(live)}
        indeg = [0] * len(live)
        users: list[list[int]] = [[] for _ in live]
        for i, n in enumerate(live):
            deps = set()
            for name in Graph._uses(n):
                p = self.producer.get(name)
                if p is not None and p.alive and id(p) in pos and p is not n:
                    deps.add(pos[id(p)])
            indeg[i] = len(deps)
            for d in deps:
                users[d].append(i)
        heap = [i for i in range(len(live)) if indeg[i] == 0]
        heapq.heapify(heap)
        order: list[Node] = []
        while heap:
            i = heapq.heappop(heap)
            order.append(live[i])
            for u in users[i]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(heap, u)
        if len(order) != len(live):
            raise ModelError(f"graph {self.proto.name!r} has a cycle")
        return order

    def export(self) -> onnx.GraphProto:
        out = shell_copy(self.proto, onnx.GraphProto(), skip=("node", "initializer", "value_info"))
        nodes = self.sorted_nodes()
        used: set[str] = set(self.output_names)
        for n in nodes:
            out.node.append(export_node(n))
            used.update(Graph._uses(n))
        for t in self.proto.initializer:
            if t.name in self.model.touched_values and t.name not in used and t.name not in self.input_names:
                continue
            out.initializer.append(t)
        for name, t in self.new_initializers.items():
            if name in used:
                out.initializer.append(t)
        live_values = used | {o for n in nodes for o in n.proto.output}
        out.value_info.extend(v for v in self.proto.value_info if v.name in live_values)
        return out


def export_node(node: Node) -> onnx.NodeProto:
    if not node.subgraphs and node.provenance is None:
        return node.proto
    proto = onnx.NodeProto()
    proto.CopyFrom(node.proto)
    for attr in proto.attribute:
        subs = node.subgraphs.get(attr.name)
        if not subs:
            continue
        if attr.type == onnx.AttributeProto.GRAPH:
            attr.g.CopyFrom(subs[0].export())
        else:
            del attr.graphs[:]
            attr.graphs.extend(s.export() for s in subs)
    if node.provenance is not None:
        rule, replaced = node.provenance
        proto.doc_string = f"onnxfuse: rule={rule} replaced={','.join(replaced)}"
    return proto


class Model:
    """A loaded model: the root graph plus what the writer needs (opsets, base folder for external data)."""

    def __init__(self, proto: onnx.ModelProto, base_dir: str) -> None:
        self.proto = proto
        self.base_dir = base_dir
        self.names: set[str] = set()
        self.value_cache: dict[tuple[int, str], np.ndarray] = {}
        self.touched_values: set[str] = set()
        self.opsets: dict[str, int] = {}
        for o in proto.opset_import:
            self.opsets["" if o.domain == "ai.onnx" else o.domain] = o.version
        self.graph = Graph(proto.graph, self)

    @functools.cached_property
    def input_dim_names(self) -> frozenset[str]:
        """The symbolic dim names the model declares on its graph inputs (the user's names for dims)."""
        return frozenset(d.dim_param for i in self.proto.graph.input for d in i.type.tensor_type.shape.dim
                         if d.dim_param)

    @property
    def opset(self) -> int:
        return self.opsets.get("", 1)

    def fresh_name(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def tensor_to_array(self, t: onnx.TensorProto) -> np.ndarray:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return read_external_tensor(t, self.base_dir)
        return numpy_helper.to_array(t)

    def graphs(self) -> Iterable[Graph]:
        return self.graph.all_graphs()

    def export(self) -> onnx.ModelProto:
        out = onnx.ModelProto()
        shell_copy(self.proto, out, skip=("graph",))
        out.graph.CopyFrom(self.graph.export())
        present = {"" if o.domain == "ai.onnx" else o.domain for o in out.opset_import}
        for domain, version in sorted(self.opsets.items()):
            if domain not in present:
                out.opset_import.add(domain=domain, version=version)
        return out


def shell_copy(proto, shell, skip: tuple[str, ...]):
    """Copy every set field of `proto` into `shell` except those in `skip` (cheap: no graph copy)."""
    for field, value in proto.ListFields():
        if field.name in skip:
            continue
        if getattr(field, "is_repeated", None) or getattr(field, "label", None) == field.LABEL_REPEATED:
            getattr(shell, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(shell, field.name).CopyFrom(value)
        else:
            setattr(shell, field.name, value)
    return shell


