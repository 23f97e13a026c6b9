"""Constant folding, If inlining and merging of duplicate nodes, run before the pattern rules.

Exporters leave computations whose inputs are all known offline: shape arithmetic on static dims, Equal/Not on
constants, and If nodes whose condition is such a constant (silero VAD checks its channel count and sample rate
that way). A node whose inputs are all constant (or a Shape/Size of a statically shaped value) is evaluated
with ONNX's reference evaluator and replaced by a Constant; an If with a constant condition is replaced by the
nodes of the branch it takes. Both are exact; results over FOLD_MAX_ELEMENTS elements are left alone so that
folding never grows the file. Two nodes computing the same op on the same inputs with the same attributes
(exporters repeat rotary-embedding frequencies and shape computations) become one, and readers of an Identity
(or of an Expand that changes no shape) read its input.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir import Graph, Model, Node, export_node
from ..load.shape_values import slice_types
from ..model_proto import make_model
from .apply import Application, alias_value, drop_dead_producers

FOLD_MAX_ELEMENTS = 1 << 16
NEVER_FOLD = frozenset({
    "Constant", "If", "Loop", "Scan", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "Multinomial", "Bernoulli", "Dropout", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "Optional",
})

NEVER_MERGE = NEVER_FOLD - {"Constant"}  # equal Constants are merged; nothing random ever is
MAX_RETYPES = 3  # shape inference passes after folding made more values constant

# The exact steps that are not YAML rules (folding, If inlining and versioning, merging): reported as cleanups,
# apart from the rules that fired (Result.cleanups, "cleanups" in --json); --no-fold turns them all off.
CLEANUP_STEPS = ("constant-fold", "if-inline", "merge-duplicates", "identity-drop", "if-version",
                 "if-squeeze-unguard")


def fold(model: Model, deny: set[tuple[str, str]] | None = None) -> list[Application]:
    """Fold to a fixed point in every graph; returns one Application per folded node or inlined If."""
    deny = deny or set()
    apps: list[Application] = []
    for _ in range(MAX_RETYPES + 1):
        if not _fold_pass(model, deny, apps) or not _retype(model):
            break  # nothing became constant since the last typing (merges change no shape), or no type gained
    return apps


def refold(model: Model, deny: set[tuple[str, str]] | None = None) -> list[Application]:
    """Fold after a structural change that left values untyped (new subgraphs): infer types first."""
    _retype(model)
    return fold(model, deny)


def _fold_pass(model: Model, deny: set[tuple[str, str]], apps: list[Application]) -> bool:
    """Fold to a fixed point with the current types (re-typed after each round that inlined an If, whose
    outputs had no type). True if constants were folded after the last typing: types may now be stale."""
    stale = False
    changed = True
    while changed:
        changed = inlined = False
        for graph in list(model.graphs()):
            for node in graph.sorted_nodes():
                if not node.alive or (_rule_of(node), node.outputs[0] if node.outputs else "") in deny:
                    continue
                app = _inline_if(graph, node) if node.op_type == "If" else _fold_node(graph, node)
                if app is not None:
                    apps.append(app)
                    changed = True
                    inlined = inlined or app.rule == "if-inline"
                    stale = stale or app.rule == "constant-fold"
            dupes = _merge_duplicates(graph, deny) + _drop_identities(graph, deny)
            apps.extend(dupes)
            changed = changed or bool(dupes)
        if inlined:
            _retype(model)
            stale = False
    return stale


def _retype(model: Model) -> bool:
    """Shape inference on the current (folded) model. Returns True if some value gained static dims."""
    from ..load.loader import infer_types

    inferred = infer_types(model.export())
    if inferred is None:
        return False
    gained = _merge_better_types(model.graph, inferred.graph)
    sliced = slice_types(model.graph, [n.proto for n in model.graph.live_nodes()])
    model.graph.types.update(sliced)
    return gained or bool(sliced)


def _static_dims(t: object) -> int:
    shape = getattr(t, "shape", None)
    return -1 if shape is None else sum(isinstance(d, int) for d in shape)


def _merge_better_types(g: Graph, src: onnx.GraphProto) -> bool:
    """Take inferred types that are new or have more static dims than what the graph has."""
    from ..tensors import type_from_proto

    gained = False
    for vi in list(src.value_info) + list(src.output) + list(src.input):
        t = type_from_proto(vi.type)
        old = g.types.get(vi.name)
        if t is not None and t.shape is not None and (old is None or _static_dims(t) > _static_dims(old)):
            gained = gained or _static_dims(t) > max(_static_dims(old), 0)
            g.set_type(vi.name, t)
    with_subgraphs = {n.outputs[0]: n for n in g.live_nodes() if n.subgraphs and n.outputs}
    for sn in src.node:
        node = with_subgraphs.get(sn.output[0]) if sn.output else None
        if node is None:
            continue
        for a in sn.attribute:
            srcs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub, sub_src in zip(node.subgraphs.get(a.name, []), srcs, strict=False):
                gained = _merge_better_types(sub, sub_src) or gained
    return gained


def _merge_duplicates(graph: Graph, deny: set[tuple[str, str]]) -> list[Application]:
    """Nodes with the same op, inputs and attributes as an earlier one: readers use the earlier one's outputs."""
    seen: dict[tuple, Node] = {}
    apps: list[Application] = []
    for node in graph.sorted_nodes():
        if (not node.alive or node.subgraphs or node.op_type in NEVER_MERGE or not node.outputs
                or ("merge-duplicates", node.outputs[0]) in deny):
            continue
        attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.proto.attribute))
        key = (node.domain, node.op_type, tuple(node.proto.input), len(node.outputs), attrs)
        first = seen.setdefault(key, node)
        if first is node or any(graph.is_graph_output(o) for o in node.outputs):
            continue
        graph.remove_node(node)
        for old, new in zip(node.outputs, first.outputs, strict=True):
            if old:
                alias_value(graph, old, new, node.seq, node.name or old, "merge-duplicates")
        apps.append(Application("merge-duplicates", graph.proto.name, node.outputs[0],
                                (node.name or node.outputs[0],), (), ()))
    return apps


def _drop_identities(graph: Graph, deny: set[tuple[str, str]]) -> list[Application]:
    """Readers of an Identity read its input instead (inlined If branches leave them), and so do readers of an
    Expand to a constant shape that broadcasts into its input's static shape (the attention rules expand a mask
    to every query row; one that has them all is left as it is). One that names a graph output, or is read by
    name inside a subgraph, stays."""
    apps: list[Application] = []
    for node in [n for n in graph.nodes if n.alive and n.op_type in ("Identity", "Expand")]:  # any order
        if not node.alive or node.domain != "" or not node.outputs:
            continue
        if node.op_type == "Expand" and not _expands_nothing(graph, node):
            continue
        out, src = node.outputs[0], node.proto.input[0]
        readers = graph.consumers.get(out, [])
        if (not src or graph.is_graph_output(out) or ("identity-drop", out) in deny
                or any(out in r.implicit_inputs for r in readers)):
            continue
        graph.remove_node(node)
        alias_value(graph, out, src, node.seq, node.name or out, "identity-drop")
        apps.append(Application("identity-drop", graph.proto.name, out, (node.name or out,), (), ()))
    return apps


def _expands_nothing(graph: Graph, node: Node) -> bool:
    shape, target = _static_shape(graph, node.proto.input[0]), _known_value(graph, node, 1)
    if shape is None or target is None or target.ndim != 1 or len(target) > len(shape):
        return False
    return all(int(t) == 1 or int(t) == d for t, d in zip(target, shape[len(shape) - len(target):], strict=True))


def _rule_of(node: Node) -> str:
    return "if-inline" if node.op_type == "If" else "constant-fold"


def _known_value(graph: Graph, node: Node, idx: int) -> np.ndarray | None:
    name = node.proto.input[idx]
    return graph.const_value(name) if name else None


def _static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    t = graph.type_of(name)
    if t is None or t.shape is None or not all(isinstance(d, int) and d >= 0 for d in t.shape):
        return None
    return tuple(int(d) for d in t.shape)


def _fold_node(graph: Graph, node: Node) -> Application | None:
    if node.domain != "" or node.op_type in NEVER_FOLD or node.subgraphs or not node.outputs:
        return None
    if node.op_type in ("Gather", "Slice") and _shape_dims(graph, node.proto.input[0]) is not None:
        values = _gather_static_dims(graph, node) if node.op_type == "Gather" else _slice_static_dims(graph, node)
        if values is None:
            return None
    elif node.op_type in ("Shape", "Size"):
        shape = _static_shape(graph, node.proto.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            values = [np.array(int(np.prod(shape)), dtype=np.int64)]
        else:
            start = _attr_int(node, "start", 0)
            end = _attr_int(node, "end", len(shape))
            values = [np.array(shape, dtype=np.int64)[slice(start, end)]]
    else:
        inputs: list[np.ndarray | None] = []
        for i, name in enumerate(node.proto.input):
            if not name:
                inputs.append(None)
                continue
            v = _known_value(graph, node, i)
            if v is None:
                return None
            inputs.append(v)
        if not any(v is not None for v in inputs) or sum(v.size for v in inputs if v is not None) > FOLD_MAX_ELEMENTS:
            return None
        values = _evaluate(graph, node, inputs)
        if values is None:
            return None
    if sum(np.asarray(v).size for v in values) > FOLD_MAX_ELEMENTS:
        return None
    replaced = [node.name or node.outputs[0]]
    graph.remove_node(node)
    created = []
    for k, (out, v) in enumerate(zip(node.outputs, values, strict=False)):
        if not out:
            continue
        name = graph.fresh_name(f"{node.name or out}/folded")
        proto = onnx.helper.make_node("Constant", [], [out], name=name, value=numpy_helper.from_array(np.asarray(v)))
        new = graph.add_node(proto, node.seq + (k,))
        new.provenance = ("constant-fold", replaced)
        created.append(name)
    drop_dead_producers(graph, node.inputs)
    return Application("constant-fold", graph.proto.name, node.outputs[0], tuple(replaced), tuple(created),
                       ("Constant",))


def _shape_dims(graph: Graph, name: str) -> list[int | str | None] | None:
    """The dims a Shape node reports (ints where static), when `name` is a Shape output."""
    p = graph.producer.get(name)
    if p is None or p.op_type != "Shape" or p.domain != "":
        return None
    t = graph.type_of(p.proto.input[0])
    if t is None or t.shape is None:
        return None
    dims = list(t.shape)
    return dims[slice(_attr_int(p, "start", 0), _attr_int(p, "end", len(dims)))]


def _gather_static_dims(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Gather(Shape(x), idx) where every gathered dim of x is static, even if others are symbolic."""
    dims = _shape_dims(graph, node.proto.input[0])
    idx = _known_value(graph, node, 1) if len(node.proto.input) > 1 else None
    if dims is None or idx is None or _attr_int(node, "axis", 0) != 0:
        return None
    try:
        picked = [dims[int(i)] for i in np.asarray(idx).reshape(-1)]
    except IndexError:
        return None
    if not all(isinstance(d, int) and d >= 0 for d in picked):
        return None
    return [np.array(picked, dtype=np.int64).reshape(np.asarray(idx).shape)]


def _slice_static_dims(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Slice(Shape(x), starts, ends[, axes, steps]) where every sliced dim of x is static, even if others are
    symbolic (torch's SDPA export reads the head size as Shape(q)[-1:] for its scale)."""
    dims = _shape_dims(graph, node.proto.input[0])
    args = [_known_value(graph, node, i) if i < len(node.proto.input) and node.proto.input[i] else None
            for i in range(1, 5)]
    starts, ends, axes, steps = args
    if dims is None or starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    if (axes is not None and int(np.asarray(axes).reshape(-1)[0]) not in (0, -1)) or \
            (steps is not None and int(np.asarray(steps).reshape(-1)[0]) == 0):
        return None
    step = int(np.asarray(steps).reshape(-1)[0]) if steps is not None else 1
    clamp = lambda v: int(max(min(int(v), 2**62), -(2**62)))  # noqa: E731 - INT64_MAX/MIN ends
    picked = dims[slice(clamp(starts.reshape(-1)[0]), clamp(ends.reshape(-1)[0]), step)]
    if not all(isinstance(d, int) and d >= 0 for d in picked):
        return None
    return [np.array(picked, dtype=np.int64)]


def _attr_int(node: Node, name: str, default: int) -> int:
    a = node.attr(name)
    return int(a.i) if a is not None else default


def _evaluate(graph: Graph, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """Run one node with ONNX's reference evaluator; None when it cannot (unsupported op, bad values)."""
    from onnx.reference import ReferenceEvaluator

    proto = onnx.NodeProto()
    proto.CopyFrom(node.proto)
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    del proto.input[:]
    proto.input.extend(names)
    outs = [f"out{i}" if o else "" for i, o in enumerate(node.outputs)]
    del proto.output[:]
    proto.output.extend(outs)
    g = onnx.helper.make_graph(
        [proto], "fold",
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs, strict=True) if v is not None],
        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs if o])
    opsets = [onnx.helper.make_opsetid(d or "", v) for d, v in graph.model.opsets.items()]
    try:
        model = make_model(g, opsets)
        feeds = {n: v for n, v in zip(names, inputs, strict=True) if v is not None}
        results = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001 - anything the evaluator cannot do simply stays unfolded
        return None
    if any(not isinstance(r, np.ndarray) for r in results):
        return None
    for r, o in zip(results, [o for o in node.outputs if o], strict=False):
        t = graph.type_of(o)
        if t is not None and t.elem_type and onnx.helper.np_dtype_to_tensor_dtype(r.dtype) != t.elem_type:
            return None  # the evaluator disagrees with the model's declared type: leave it alone
    return [np.asarray(r) for r in results]


def _inline_if(graph: Graph, node: Node) -> Application | None:
    """Replace an If with a constant condition by the nodes of the branch it takes."""
    cond = _known_value(graph, node, 0)
    if cond is None or cond.size != 1:
        return None
    return inline_branch(graph, node, bool(cond.reshape(-1)[0]))


def inline_branch(graph: Graph, node: Node, take: bool, rule: str = "if-inline") -> Application | None:
    """Replace an If by the nodes of one branch (then_branch when `take`); None when it cannot be done."""
    branch_name = "then_branch" if take else "else_branch"
    subs = node.subgraphs.get(branch_name)
    if not subs:
        return None
    branch = subs[0]
    outputs = dict(zip(branch.output_names, node.outputs, strict=False))
    nested_refs: set[str] = set()
    for n in branch.live_nodes():
        nested_refs |= n.implicit_inputs
    if nested_refs & set(outputs):
        return None  # a nested subgraph reads a branch output by name: renaming it would break that
    replaced = [node.name or node.outputs[0]]
    graph.remove_node(node)
    drop_dead_producers(graph, [node.proto.input[0]])
    for name, t in branch.initializers.items():
        graph.new_initializers[name] = t
    for name, t in branch.new_initializers.items():
        graph.new_initializers[name] = t
    for name, t in branch.types.items():
        graph.types.setdefault(outputs.get(name) or name, t)
    created: list[str] = []
    ops: list[str] = []
    produced: set[str] = set()
    for k, n in enumerate(branch.sorted_nodes()):
        proto = onnx.NodeProto()
        proto.CopyFrom(export_node(n))
        for i, name in enumerate(proto.input):
            if outputs.get(name):
                proto.input[i] = outputs[name]
        for i, name in enumerate(proto.output):
            if outputs.get(name):
                proto.output[i] = outputs[name]
                produced.add(name)
        new = graph.add_node(proto, node.seq + (k,))
        new.provenance = (rule, replaced)
        created.append(proto.name)
        ops.append(proto.op_type)
    for k, (branch_out, if_out) in enumerate(outputs.items()):
        if if_out and branch_out not in produced:  # the branch returns an outer value or a constant as is
            name = graph.fresh_name(f"{node.name or if_out}/{branch_name}")
            proto = onnx.helper.make_node("Identity", [branch_out], [if_out], name=name)
            new = graph.add_node(proto, node.seq + (len(created) + k,))
            new.provenance = (rule, replaced)
            created.append(name)
            ops.append("Identity")
    return Application(rule, graph.proto.name, node.outputs[0], tuple(replaced), tuple(created),
                       tuple(dict.fromkeys(ops)))
