"""Versioning: specialize what follows a run-time If for the branch the model's inputs take.

Exporters turn `x.squeeze(-1)` on a dynamic dim into If(dim == 1, Squeeze, Identity); everything after it then
re-tests the rank or dims of the If's output with more Ifs (silero VAD: seven Ifs on one path). Folding cannot
remove them: the first condition is only known at run time. Here the nodes downstream of such an If (its
"tail") move into both of its branches. In each branch the If's output is that branch's own value, so its rank
and dims are known and the later tests fold away there. Only the branch the representative inputs take (the
"hot" one, probed with onnxruntime) is specialized; the other keeps the original tail verbatim and is frozen
(no pass touches it). So the result is exact for every input, shape or value, and an input that takes the cold
branch runs exactly the original nodes. Applied only where a trial shows fewer If nodes on the hot path.

When the If is TorchScript's squeeze guard and strict shape inference proves that the tail cannot run on the
un-squeezed value (the cold branch can only fail), the guard goes too (unguard): every input the original runs
takes the hot branch. That keeps the rewrite contract (same outputs wherever the original runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir import Graph, Model, Node, export_node
from ..match.matcher import SHAPE_ARITHMETIC
from ..tensors import TensorType
from .apply import Application
from .fold import inline_branch, refold

RULE = "if-version"
UNGUARD_RULE = "if-squeeze-unguard"  # the squeeze guard is dropped: its other branch can only fail
BRANCHES = ("then_branch", "else_branch")
# Ops a shape test is computed with, besides the shape arithmetic the matcher knows.
SHAPE_TEST_OPS = SHAPE_ARITHMETIC | {"Not", "And", "Or", "Xor", "Greater", "Less", "GreaterOrEqual",
                                     "LessOrEqual", "Max", "Min", "Neg", "Abs"}
MAX_SLICE = 256  # nodes walked back from one condition
FoldFn = Callable[[Model], list[Application]]
SMALL_CONSTANT = 256  # outer constants up to this many elements are copied into the hot branch


def candidates(graph: Graph, hot: dict[str, bool], deny: set[tuple[str, str]]) -> list[Node]:
    """Top-level Ifs with a run-time condition whose value is known for the representative inputs (`hot`:
    condition value name -> value), and whose tail holds an If that tests the shape of a tail value."""
    out = []
    for node in graph.sorted_nodes():
        if (node.op_type != "If" or node.domain != "" or not node.outputs or node.proto.input[0] not in hot
                or (RULE, node.outputs[0]) in deny or graph.const_value(node.proto.input[0]) is not None
                or set(node.subgraphs) != set(BRANCHES)):
            continue
        tail = _tail(graph, node)
        ids = {id(n) for n in tail}
        feeds_outputs = any(graph.is_graph_output(o) for n in tail for o in n.outputs)
        if feeds_outputs and any(m.op_type == "If" and _tests_shape(graph, m, ids) for m in tail):
            out.append(node)
    return out


def specialize_hot_branches(model: Model, hot: dict[str, bool], deny: set[tuple[str, str]]) -> list[Application]:
    """Version the candidate Ifs, fold the result, then drop the squeeze guards whose other branch can only
    fail (and fold again). Returns every Application, folding included."""
    def refolded(m: Model) -> list[Application]:
        return refold(m, deny)

    apps, guards = version_ifs(model, hot, deny, refolded)
    if not apps:
        return []
    apps.extend(refolded(model))
    unguarded = unguard(model, guards, refolded)
    if unguarded:
        apps.extend(unguarded)
        apps.extend(refolded(model))
    return apps


def version_ifs(model: Model, hot: dict[str, bool], deny: set[tuple[str, str]],
                fold_fn: FoldFn) -> tuple[list[Application], list[str]]:
    """Version every candidate If (in graph order) where a trial on a copy, folded with `fold_fn`, leaves fewer
    If nodes on the hot path. Also returns the versioned Ifs (first outputs) that are squeeze guards."""
    apps: list[Application] = []
    guards: list[str] = []
    for node in candidates(model.graph, hot, deny):
        if not node.alive:
            continue  # it was in the tail of an If versioned before it
        value = hot[node.proto.input[0]]
        if not _pays(model, node.outputs[0], value, fold_fn):
            continue
        guard = value and _is_squeeze_guard(model.graph, node)
        app, added = _version(model.graph, node, _tail(model.graph, node), value)
        apps.append(app)
        if guard:
            guards.append(added.outputs[0])
    return apps, guards


def unguard(model: Model, guards: list[str], fold_fn: FoldFn) -> list[Application]:
    """Replace each versioned squeeze guard (by its first output) by its then branch where only that branch
    can run (see _only_hot_branch_runs). Call after folding the versioned model, so the branch is final."""
    apps: list[Application] = []
    for out in guards:
        node = model.graph.producer.get(out)
        if node is None or node.op_type != "If" or not _only_hot_branch_runs(model, out, fold_fn):
            continue
        done = inline_branch(model.graph, node, True, UNGUARD_RULE)
        if done is not None:
            apps.append(done)
    return apps


def _is_squeeze_guard(graph: Graph, node: Node) -> bool:
    """TorchScript's x.squeeze(a) on a dynamic dim: If(Shape(x)[a] == 1, Squeeze(x, a), x). Its then branch
    fails (Squeeze of a dim that is not 1) exactly when the condition is false."""
    eq = graph.producer.get(node.proto.input[0])
    if eq is None or eq.op_type != "Equal" or eq.domain != "" or len(eq.inputs) != 2:
        return False
    for dim, one in (eq.inputs, eq.inputs[::-1]):
        k = graph.const_value(one)
        g = graph.producer.get(dim)
        if k is None or k.size != 1 or int(k.reshape(-1)[0]) != 1 or g is None or g.op_type != "Gather":
            continue
        idx = graph.const_value(g.inputs[1]) if len(g.inputs) > 1 else None
        shape = graph.producer.get(g.inputs[0])
        axis = g.attr("axis")
        if (idx is None or idx.size != 1 or (axis is not None and axis.i != 0)
                or shape is None or shape.op_type != "Shape" or shape.attr("start") or shape.attr("end")):
            continue
        return _squeezes(node.subgraphs[BRANCHES[0]][0], shape.inputs[0], int(idx.reshape(-1)[0]))
    return False


def _squeezes(branch: Graph, x: str, axis: int) -> bool:
    """The branch is exactly Squeeze(x, [axis]) (axes compared after normalizing by x's rank)."""
    live = [n for n in branch.live_nodes() if n.op_type != "Constant"]
    if len(live) != 1 or live[0].op_type != "Squeeze" or live[0].inputs[0] != x:
        return False
    sq = live[0]
    if branch.output_names != [sq.outputs[0]]:
        return False
    axes = branch.const_value(sq.inputs[1]) if len(sq.inputs) > 1 else None
    if axes is None and sq.attr("axes") is not None:
        axes = np.asarray(list(sq.attr("axes").ints))
    t = branch.type_of(x)
    if axes is None or axes.size != 1 or t is None or t.rank is None:
        return False
    return int(axes.reshape(-1)[0]) % t.rank == axis % t.rank


def _only_hot_branch_runs(model: Model, out: str, fold_fn: FoldFn) -> bool:
    """With the then branch taken, the model passes strict shape inference; with the else branch taken (and
    folded: its rank tests resolve), it fails it: the nodes after the If cannot run on that branch's output
    (silero: an LSTM input of rank 4). Then every input either takes the then branch or fails anyway."""
    def infers(take: bool) -> bool:
        trial = Model(model.export(), model.base_dir)
        node = trial.graph.producer.get(out)
        if node is None or inline_branch(trial.graph, node, take) is None:
            return False
        fold_fn(trial)
        try:
            onnx.shape_inference.infer_shapes(trial.export(), check_type=True, strict_mode=True, data_prop=True)
        except Exception:  # onnx raises several error types for a contradiction
            return False
        return True

    return infers(True) and not infers(False)


def _pays(model: Model, root: str, hot_value: bool, fold_fn: FoldFn) -> bool:
    trial = Model(model.export(), model.base_dir)
    node = trial.graph.producer.get(root)
    if node is None:
        return False
    hot_name = BRANCHES[0] if hot_value else BRANCHES[1]
    tail = _tail(trial.graph, node)
    before = _ifs_in(node.subgraphs[hot_name][0].live_nodes()) + _ifs_in(tail)
    _, versioned = _version(trial.graph, node, tail, hot_value)
    fold_fn(trial)
    return versioned.alive and _ifs_in(versioned.subgraphs[hot_name][0].live_nodes()) < before


def _ifs_in(nodes: Iterable[Node]) -> int:
    """If nodes among `nodes` and inside their subgraphs (any branch may run)."""
    return sum(int(n.op_type == "If") + _ifs_in(m for subs in n.subgraphs.values() for s in subs
                                                 for m in s.live_nodes())
               for n in nodes)


def _tail(graph: Graph, node: Node) -> list[Node]:
    """Every node that reads the If's outputs, directly, through other tail nodes, or inside a subgraph."""
    seen: dict[int, Node] = {}
    todo = [o for o in node.outputs if o]
    while todo:
        for reader in graph.consumers.get(todo.pop(), ()):
            if reader.alive and id(reader) not in seen and reader is not node:
                seen[id(reader)] = reader
                todo.extend(o for o in reader.outputs if o)
    return [n for n in graph.sorted_nodes() if id(n) in seen]


def _tests_shape(graph: Graph, node: Node, tail: set[int]) -> bool:
    """The condition of If `node` is computed, within the tail, only from the shapes of tail values."""
    found = False
    todo, seen = [node.proto.input[0]], set()
    while todo:
        p = graph.producer.get(todo.pop())
        if p is None or id(p) not in tail or id(p) in seen:
            continue
        seen.add(id(p))
        if len(seen) > MAX_SLICE or p.domain != "" or p.op_type not in SHAPE_TEST_OPS | {"Size"}:
            return False
        if p.op_type in ("Shape", "Size"):
            found = True
            continue
        todo.extend(i for i in p.proto.input if i)
    return found


def _version(graph: Graph, node: Node, tail: list[Node], hot_value: bool) -> tuple[Application, Node]:
    """Replace `node` and its tail by one If whose branches hold the tail; the cold branch is frozen. The
    Application's root is the replaced If's first output (stable across runs, so it can be rolled back)."""
    model = graph.model
    hot_name = BRANCHES[0] if hot_value else BRANCHES[1]
    tail_values = [o for n in tail for o in n.outputs if o]
    produced = set(tail_values) | {o for o in node.outputs if o}
    outs = list(dict.fromkeys(o for o in graph.output_names if o in produced))
    branches: dict[str, onnx.GraphProto] = {}
    for which in BRANCHES:
        tag = "hot" if which == hot_name else "cold"
        proto = node.subgraphs[which][0].export()
        ren = {o: b.name for o, b in zip(node.outputs, proto.output, strict=False) if o}
        ren.update({v: model.fresh_name(f"{v}/{tag}") for v in tail_values})
        for n in tail:
            p = onnx.NodeProto()
            p.CopyFrom(export_node(n))
            p.name = model.fresh_name(f"{n.name or n.outputs[0]}/{tag}")
            proto.node.append(p)
        if tag == "hot":  # shape inference in a subgraph cannot read outer constants: give it local copies
            consts = _small_outer_constants(graph, proto.node, produced)
            ren.update({name: model.fresh_name(f"{name}/{tag}") for name in consts})
            body = list(proto.node)
            del proto.node[:]
            proto.node.extend([onnx.helper.make_node("Constant", [], [ren[k]], name=ren[k],
                                                     value=numpy_helper.from_array(v)) for k, v in consts.items()])
            proto.node.extend(body)
        for p in proto.node:
            _rename(p, ren)
        del proto.output[:]
        proto.output.extend(_value_info(ren[o], graph.type_of(o)) for o in outs)
        proto.value_info.extend(_value_info(ren[v], graph.type_of(v)) for v in tail_values if graph.type_of(v))
        proto.name = f"{node.name or node.outputs[0]}/{which}"
        branches[which] = proto
    replaced = [n.name or n.outputs[0] for n in [node] + tail]
    new = onnx.helper.make_node("If", [node.proto.input[0]], outs,
                                name=model.fresh_name(f"{node.name or node.outputs[0]}/versioned"), **branches)
    for n in [node] + tail:
        graph.remove_node(n)
    added = graph.add_node(new, node.seq)
    added.provenance = (RULE, replaced)
    added.subgraphs[BRANCHES[1] if hot_value else BRANCHES[0]][0].frozen = True
    return Application(RULE, graph.proto.name, node.outputs[0], tuple(replaced), (new.name,), ("If",)), added


def _small_outer_constants(graph: Graph, nodes: Iterable[onnx.NodeProto], produced: set[str]) -> dict[str, np.ndarray]:
    """Outer constants (axes, pads, shapes: up to SMALL_CONSTANT elements) the branch's nodes read, by name."""
    out: dict[str, np.ndarray] = {}
    for n in nodes:
        for name in n.input:
            if not name or name in produced or name in out or not graph.is_constant(name):
                continue
            t = graph.type_of(name)
            if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape):
                continue
            if int(np.prod(t.shape)) <= SMALL_CONSTANT:
                value = graph.const_value(name)
                if value is not None:
                    out[name] = value
    return out


def _rename(p: onnx.NodeProto, ren: dict[str, str]) -> None:
    """Rename inputs and outputs, and outer references inside its subgraphs (ONNX names are never shadowed)."""
    for i, name in enumerate(p.input):
        p.input[i] = ren.get(name, name)
    for i, name in enumerate(p.output):
        p.output[i] = ren.get(name, name)
    for a in p.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            for n in g.node:
                _rename(n, ren)
            for o in g.output:
                o.name = ren.get(o.name, o.name)


def _value_info(name: str, t: TensorType | None) -> onnx.ValueInfoProto:
    if t is None:
        return onnx.helper.make_empty_tensor_value_info(name)
    return onnx.helper.make_tensor_value_info(name, t.elem_type, None if t.shape is None else list(t.shape))
