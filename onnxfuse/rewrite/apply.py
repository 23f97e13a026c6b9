"""Apply one match: compute new constants, build the rewrite's nodes, remove the matched ones, record
provenance (the rule and the original node names each new node replaced)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..concepts.language import ABSENT
from ..concepts.masked import MaskSum
from ..ir import Graph, Node
from ..load.shape_values import reshape_types, slice_types
from ..match.matcher import SHAPE_ARITHMETIC, Binding
from ..model_proto import make_model
from ..opschema import MS_DOMAIN, AttrSpec, attr_value, op_spec
from ..patterns.compute import VALUE_FIELDS, ComputeError, Env, evaluate
from ..patterns.rules import RewriteNode, Rule
from ..tensors import TensorType, type_from_proto

_A = onnx.AttributeProto


@dataclass(frozen=True)
class Application:
    """One applied rewrite."""

    rule: str
    graph: str
    root: str  # value name the root line produced (stable across runs: used to roll back exactly this one)
    replaced: tuple[str, ...]  # original node names (through earlier rewrites)
    created: tuple[str, ...]
    ops: tuple[str, ...]  # qualified op types created

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.root)


def _env(rule: Rule, graph: Graph, b: Binding, computed: dict[str, object]) -> Env:
    def name_value(name: str) -> object:
        if name in computed:
            return computed[name]
        if name in b.facts:
            return b.facts[name]  # a Python float: it does not set the expression's float type
        if name in rule.atoms and name not in rule.lines:
            size = b.dims.get(name)
            if not isinstance(size, int):
                raise ComputeError(f"axis {name} is the run-time dim {size!r}, not a number")
            return size
        value = b.values.get(name, ABSENT)
        if value == ABSENT:
            return None
        v = graph.const_value(value)
        if v is None:
            raise ComputeError(f"{name} ({value!r}) is not a constant")
        return v

    def field_value(name: str, fld: str) -> object:
        if name in rule.lines:
            node = b.nodes[name]
            if fld == "op_type":
                return node.op_type
            spec = op_spec(node.domain, node.op_type, graph.model.opset)
            if fld in VALUE_FIELDS and fld != "value" and (spec is None or fld not in spec.attrs):
                return value_field(name, fld)  # a line's output value: qh.dims, o.rank, ...
            v = attr_value(node.proto, fld, spec)
            if v is None and (node.op_type, fld) == ("Transpose", "perm"):
                t = graph.type_of(node.inputs[0])  # ONNX: no perm means reverse the axes
                v = list(range(t.rank))[::-1] if t is not None and t.rank is not None else None
            if v is None:
                return None  # absent without a default: default(n.attr, x) picks x; arithmetic on it fails
            return np.asarray(v, dtype=np.float64) if isinstance(v, float) else v
        if fld == "value":
            return name_value(name)
        return value_field(name, fld)

    def value_field(name: str, fld: str) -> object:
        value = b.values.get(name, ABSENT)
        if value == ABSENT:
            return None  # an absent optional value: default(X.dims, ...) picks the fallback
        if fld == "constant":
            return graph.is_constant(value)
        t = graph.type_of(value)
        if t is None:
            raise ComputeError(f"type of {name} ({value!r}) is unknown")
        if fld == "dtype":
            return t.dtype_name
        if t.shape is None:
            raise ComputeError(f"shape of {name} ({value!r}) is unknown")
        if fld == "dims":  # like shape, with -1 where the dim is symbolic or unknown
            return [int(d) if isinstance(d, int) else -1 for d in t.shape]
        if fld == "rank":
            return len(t.shape)
        if any(not isinstance(d, int) for d in t.shape):
            raise ComputeError(f"shape of {name} ({value!r}) is not static: {list(t.shape)}")
        if fld == "shape":
            return [int(d) for d in t.shape]
        if fld == "size":
            return int(np.prod([int(d) for d in t.shape]))
        raise ComputeError(f"unknown field {fld!r}")

    return Env(name_value, field_value)


def compute_constants(rule: Rule, graph: Graph, b: Binding) -> dict[str, object]:
    computed: dict[str, object] = {}
    env = _env(rule, graph, b, computed)

    def check(requires) -> None:
        for expr, text in requires:
            if not bool(np.all(evaluate(expr, env))):
                raise ComputeError(f"require failed: {text}{_dynamic_dims(expr, graph, b)}")

    # conditions that read no computed constant first: a rule that does not apply says which condition, not
    # how computing its constants failed on a match they exclude (a grouped weight's broadcast)
    reads_computed = [any(n in rule.compute for n, _, _ in expr.names) for expr, _ in rule.require]
    check([r for r, late in zip(rule.require, reads_computed, strict=True) if not late])
    for name, expr in rule.compute.items():
        computed[name] = evaluate(expr, env)
    check([r for r, late in zip(rule.require, reads_computed, strict=True) if late])
    return computed


def _dynamic_dims(expr, graph: Graph, b: Binding) -> str:
    """' (X.dims is [1, 32, -1, -1]: -1 is a dim not known before run time)' for the values a failed require
    reads the dims of where some are not static (the usual reason it failed); '' when there are none."""
    shown: list[str] = []
    for name, fld, _ in expr.names:
        value = b.values.get(name) if fld == "dims" else None
        t = graph.type_of(value) if value and value != ABSENT else None
        if t is None or t.shape is None or all(isinstance(d, int) and d >= 0 for d in t.shape):
            continue
        text = f"{name}.dims is {[d if isinstance(d, int) else -1 for d in t.shape]}"
        if text not in shown:
            shown.append(text)
    return f" ({', '.join(shown)}: -1 is a dim not known before run time)" if shown else ""


def _to_attribute(name: str, value: object, spec: AttrSpec | None) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray) and spec is not None and spec.type not in (_A.TENSOR,):
        value = value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    kind = spec.type if spec is not None else None
    try:
        if kind == _A.FLOAT:
            return onnx.helper.make_attribute(name, float(np.asarray(value).reshape(-1)[0]))
        if kind == _A.INT:
            return onnx.helper.make_attribute(name, int(np.asarray(value).reshape(-1)[0]))
        if kind == _A.FLOATS:
            return onnx.helper.make_attribute(name, [float(x) for x in np.asarray(value).reshape(-1)],
                                              attr_type=_A.FLOATS)
        if kind == _A.INTS:
            return onnx.helper.make_attribute(name, [int(x) for x in np.asarray(value).reshape(-1)],
                                              attr_type=_A.INTS)
        if kind == _A.STRING:
            return onnx.helper.make_attribute(name, str(value))
        if kind == _A.TENSOR:
            return onnx.helper.make_attribute(name, numpy_helper.from_array(np.asarray(value)))
        return onnx.helper.make_attribute(name, value)
    except (TypeError, ValueError) as e:
        raise ComputeError(f"attribute {name!r}: {e}") from None


def _attributes(rn: RewriteNode, rule: Rule, graph: Graph, b: Binding,
                computed: dict[str, object]) -> list[onnx.AttributeProto]:
    spec = op_spec(rn.call.domain, rn.call.op, graph.model.opset)
    attrs: dict[str, onnx.AttributeProto] = {}
    if rn.copy_attrs is not None:
        for a in b.nodes[rn.copy_attrs].proto.attribute:
            if spec is None or a.name in spec.attrs:
                copy = onnx.AttributeProto()
                copy.CopyFrom(a)
                attrs[a.name] = copy
    env = _env(rule, graph, b, computed)
    for k, expr in rn.attrs.items():
        value = evaluate(expr, env)
        if value is None:  # left out: the schema default applies (`x if cond else None`)
            attrs.pop(k, None)
            continue
        attrs[k] = _to_attribute(k, value, spec.attrs.get(k) if spec else None)
    return [attrs[k] for k in sorted(attrs)]


def _originals(node: Node) -> list[str]:
    return list(node.provenance[1]) if node.provenance else [node.name or node.outputs[0]]


def apply_match(rule: Rule, graph: Graph, b: Binding) -> Application:
    """Rewrite one match in place. Raises ComputeError (graph untouched) if a computed value fails."""
    computed = compute_constants(rule, graph, b)
    root = b.nodes[rule.root]
    prefix = root.name or root.outputs[0]
    built: list[tuple[RewriteNode, list[onnx.AttributeProto]]] = [
        (rn, _attributes(rn, rule, graph, b, computed) if rn.call is not None else []) for rn in rule.rewrite
    ]
    # the original nodes behind the matched ones, each once: a rule that matches its own rewrite again would
    # otherwise triple the list every sweep (3 nodes, each carrying all of it: out of memory by sweep 20)
    replaced: list[str] = list(dict.fromkeys(o for n in b.matched for o in _originals(n)))
    # --- from here on the graph changes ---
    for n in b.matched + b.side:
        graph.remove_node(n)
    init_names: dict[str, str] = {}
    temps: dict[str, str] = {}
    created: list[str] = []
    ops: list[str] = []
    def resolve(name: str) -> str:
        if name in computed:
            if name not in init_names:
                init_names[name] = graph.add_initializer(f"{prefix}/{rule.id}/{name}", np.asarray(computed[name]))
            return init_names[name]
        return temps[name] if name in temps else b.values.get(name, ABSENT)

    made: list[Node] = []
    for name, mask in b.derived.items():  # masked's sums, built before the nodes that read them
        rows = b.values.get(mask.rows, ABSENT) if mask.rows else None
        temps[name] = _build_mask(graph, mask, rows, f"{prefix}/{rule.id}/{name}", root.seq + (-1,), made)
    for k, (rn, attrs) in enumerate(built):
        if rn.call is None:
            assert rn.alias is not None
            node = alias_value(graph, b.values[rn.outputs[0]], resolve(rn.alias), root.seq + (k,), prefix, rule.id)
            if node is not None:
                made.append(node)
            continue
        inputs = [resolve(a.name) for a in rn.call.args]
        spec = op_spec(rn.call.domain, rn.call.op)
        required = spec.required if spec is not None else frozenset()
        if rn.call.args and (all(i == ABSENT for i in inputs) or any(inputs[i] == ABSENT for i in required
                                                                      if i < len(inputs))):
            continue  # an absent optional value where the op needs one (`Expand(M?, rows)`, `Cast(TT?)`): not
            # built, its outputs are absent
        while inputs and inputs[-1] == ABSENT:
            inputs.pop()
        outputs = _output_names(rn, rule, graph, b, temps, prefix)
        name = graph.fresh_name(f"{prefix}/{rule.id}" + (f"/{k}" if len(built) > 1 else ""))
        proto = onnx.helper.make_node(rn.call.op, inputs, outputs, name=name, domain=rn.call.domain or None)
        proto.attribute.extend(attrs)
        made.append(graph.add_node(proto, root.seq + (k,)))
        if rn.call.domain and rn.call.domain not in graph.model.opsets:
            graph.model.opsets[rn.call.domain] = 1
    _drop_unread(graph, made)  # what only a skipped node would have read (the rows of an absent mask)
    for node in made:
        if node.alive:
            node.provenance = (rule.id, replaced)
            created.append(node.name)
            ops.append(f"{node.domain}.{node.op_type}" if node.domain else node.op_type)
    if any(o.startswith(MS_DOMAIN) for o in ops):
        graph.model.opsets.setdefault(MS_DOMAIN, 1)
    drop_dead_producers(graph, [i for n in b.matched + b.side for i in n.inputs] + _drop_dead_kept(graph, b.kept))
    if temps:
        _infer_temp_types(graph, [graph.producer[t].proto for t in temps.values() if t in graph.producer],
                          set(temps.values()))
    return Application(rule.id, graph.proto.name, b.values[rule.root], tuple(replaced), tuple(created), tuple(ops))


def _output_names(rn: RewriteNode, rule: Rule, graph: Graph, b: Binding, temps: dict[str, str], prefix: str
                  ) -> list[str]:
    """The values a rewrite node writes: a match line's own value, a fresh name for a temporary (recorded in
    `temps`), absent for `_`; trailing absent ones dropped."""
    outputs: list[str] = []
    for o in rn.outputs:
        if o == "_":
            outputs.append(ABSENT)
        elif o in rule.lines:
            outputs.append(b.values[o])
        else:
            temps[o] = graph.fresh_name(f"{prefix}/{rule.id}/{o}")
            outputs.append(temps[o])
    while outputs and outputs[-1] == ABSENT:
        outputs.pop()
    return outputs


def _build_mask(graph: Graph, mask: MaskSum, rows: str | None, prefix: str, seq: tuple[int, ...],
                made: list[Node]) -> str:
    """The additive mask `masked(x, M)` found: each term (a value, or Where(c, 0, fill) for a Where fill), their
    sum in the order the model added them, and with `rows` (a value whose dim -2 is the query length, read at
    run time) that sum expanded to [1, 1, s, 1]: every query row, rank 4; one that has every row at a lower rank
    gets its leading axes (`lead`) instead. Returns its value name."""
    parts: list[str] = []
    zero = None
    i64 = onnx.TensorProto.INT64

    def node(op: str, ins: list[str], what: str, elem: int = mask.elem_type, **attrs) -> str:
        out = graph.fresh_name(f"{prefix}/{what}")
        made.append(graph.add_node(onnx.helper.make_node(op, ins, [out], name=out, **attrs), seq + (len(made),)))
        graph.types.setdefault(out, TensorType(elem, None))
        return out

    for t in mask.terms:
        if t.where is None:
            parts.append(t.value)
            continue
        if zero is None:
            zero = graph.add_initializer(f"{prefix}/zero", np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(
                mask.elem_type)))
        parts.append(node("Where", [t.where, t.value, zero] if t.fill_first else [t.where, zero, t.value], "where"))
    total = parts[0]
    for p in parts[1:]:
        total = node("Add", [total, p], "sum")
    if mask.lead:  # every query row already, a lower rank: a view, no copy
        axes = list(range(mask.lead))
        if graph.model.opset >= 13:
            total = node("Unsqueeze", [total, graph.add_initializer(f"{prefix}/axes", np.asarray(axes, np.int64))],
                         "rank4")
        else:
            total = node("Unsqueeze", [total], "rank4", axes=axes)
    if rows:
        const = {k: graph.add_initializer(f"{prefix}/{k}", np.asarray(v, np.int64))
                 for k, v in (("lead", [1, 1]), ("axis", [-2]), ("last", [1]))}
        sq = node("Gather", [node("Shape", [rows], "shape", i64), const["axis"]], "seq", i64, axis=0)
        total = node("Expand", [total, node("Concat", [const["lead"], sq, const["last"]], "rows", i64, axis=0)],
                     "rows")
    return total


def _drop_unread(graph: Graph, made: list[Node]) -> None:
    """Remove the nodes a rewrite made that nothing reads (they fed only a node it did not build)."""
    changed = True
    while changed:
        changed = False
        for n in made:
            if n.alive and not any(graph.consumers.get(o) or graph.is_graph_output(o) for o in n.outputs if o):
                graph.remove_node(n)
                changed = True


def _infer_temp_types(graph: Graph, protos: list[onnx.NodeProto], temps: set[str]) -> None:
    """Types for the values a multi-node rewrite invented, by ONNX shape inference on just the new nodes (so
    later rules can check their dtype/shape). Contrib ops have no ONNX schema: their outputs stay untyped."""
    produced = {o for p in protos for o in p.output}
    inputs = []
    inits = []
    for name in dict.fromkeys(i for p in protos for i in p.input if i and i not in produced):
        t = graph.type_of(name)
        if t is None or t.shape is None:
            return
        value = graph.const_value(name) if t.shape and all(isinstance(d, int) for d in t.shape) else None
        if value is not None and value.size <= 64:  # small constants (axes, shapes): inference reads them
            inits.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            inputs.append(onnx.helper.make_tensor_value_info(name, t.elem_type, list(t.shape)))
    opsets = [onnx.helper.make_opsetid(d or "", v) for d, v in graph.model.opsets.items()]

    found: dict[str, TensorType] = {}
    fixed: dict[str, TensorType] = {}
    for _ in range(2):
        shaped = [onnx.helper.make_tensor_value_info(n, t.elem_type, list(t.shape)) for n, t in fixed.items()
                  if t.shape is not None]
        g = onnx.helper.make_graph(list(protos), "temps", inputs, [], inits, value_info=shaped)
        try:
            inferred = onnx.shape_inference.infer_shapes(make_model(g, opsets))
        except Exception:  # noqa: BLE001 - best effort: the values just stay untyped
            break
        found = {vi.name: t for vi in inferred.graph.value_info
                 if vi.name in temps and (t := type_from_proto(vi.type)) is not None}
        # Reshape targets computed from dims (Shape -> Slice -> Concat): the dims they name, which Reshape-13's
        # inference leaves unknown; a second inference gives them to what reads the Reshape
        more = reshape_types(graph, protos, found)
        if not more or more == fixed:
            break
        fixed = more
    found.update(fixed)
    graph.types.update((n, t) for n, t in found.items() if n in temps)
    graph.types.update((n, t) for n, t in slice_types(graph, protos).items() if n in temps)


def alias_value(graph: Graph, old: str, new: str, seq: tuple[int, ...], prefix: str, rule_id: str) -> Node | None:
    """Make every reader of `old` read `new`. A graph output (or a value read inside a subgraph) keeps its
    name through an Identity instead."""
    readers = graph.consumers.get(old, [])
    if graph.is_graph_output(old) or any(old in r.implicit_inputs for r in readers):
        proto = onnx.helper.make_node("Identity", [new], [old], name=graph.fresh_name(f"{prefix}/{rule_id}"))
        return graph.add_node(proto, seq)
    graph.replace_all_uses_with(old, new)
    return None


def _drop_dead_kept(graph: Graph, kept: tuple) -> list[str]:
    """Remove the nodes of shared lines that nothing reads any more (a shared line keeps its node only for
    readers outside the match); returns their inputs, for drop_dead_producers."""
    inputs: list[str] = []
    changed = True
    while changed:
        changed = False
        for n in kept:
            if n.alive and not n.subgraphs and not any(graph.consumers.get(o) or graph.is_graph_output(o)
                                                       for o in n.outputs if o):
                graph.remove_node(n)
                inputs.extend(i for i in n.inputs if i)
                changed = True
    return inputs


def drop_dead_producers(graph: Graph, names: list[str]) -> None:
    """Remove the producers of `names` that fed only the removed nodes (Constants, and shape arithmetic
    that fed the match), recursively; mark initializers as touched so unused ones are dropped on export."""
    graph.model.touched_values.update(n for n in names if n)
    todo = [n for n in names if n]
    while todo:
        name = todo.pop()
        p = graph.producer.get(name)
        if p is None or not p.alive or p.subgraphs or (p.op_type != "Constant" and p.op_type not in SHAPE_ARITHMETIC):
            continue
        if any(graph.consumers.get(o) or graph.is_graph_output(o) for o in p.outputs if o):
            continue
        graph.remove_node(p)
        graph.model.touched_values.update(i for i in p.inputs if i)
        todo.extend(i for i in p.inputs if i)
