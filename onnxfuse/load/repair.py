"""Harmless defects that onnxruntime tolerates, repaired in the loaded copy before optimizing.

The bar for an input model is "onnxruntime loads it" (CPU execution provider, ORT_DISABLE_ALL). Real-world models
often fail `onnx.checker` for reasons that change nothing onnxruntime computes: a graph output without a shape,
a value_info listed twice, an initializer nothing reads, an IR version older than the opset needs. Each repair
here keeps exactly what onnxruntime does with the original (where onnxruntime picks one of two conflicting
entries, the repair keeps the one it picks) and returns one line for the report. Defects onnxruntime refuses
(a value_info whose element type contradicts the node, two nodes with one name, ...) are not repaired: the
loader or the validation reports them in one line. docs/errors.md lists both kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx

from .ort_check import OrtProbe
from .repair_types import Repairs, repair_types, some_names

# Domains onnxruntime implements. A node may use one without an opset import: onnxruntime then uses the domain's
# last released version, which these are (the Microsoft domains have only version 1).
DOMAIN_VERSIONS = {"com.microsoft": 1, "com.microsoft.nchwc": 1, "com.microsoft.experimental": 1,
                   "ai.onnx.ml": 5, "ai.onnx.training": 1, "ai.onnx.preview.training": 1}

_TYPED_DATA = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def repair_model(proto: onnx.ModelProto, probe: Callable[[], OrtProbe] | None = None,
                 key: tuple | None = None) -> Repairs:
    """Repair `proto` in place (the loader's copy; the file is never touched). `probe` gives onnxruntime's output
    types for outputs that shape inference cannot type; None where the model passed onnx.checker. `key`
    (file_key of its file) caches the shape inference the checks need."""
    r = Repairs()
    _opset_imports(proto, r)
    _node_domains(proto, r)
    _ir_version(proto, r)
    _graph_names(proto.graph, "main_graph", r)
    _node_names(proto, r)
    _duplicate_node_names(proto.graph, r)
    _metadata(proto, r)
    _initializers(proto, r)
    repair_types(proto, probe, r, key)
    return r


def _norm(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _shown(domain: str) -> str:
    return domain or "ai.onnx"


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for g in _subgraphs(node):
            yield from _all_nodes(g)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _opset_imports(proto: onnx.ModelProto, r: Repairs) -> None:
    """A domain imported twice ('' and 'ai.onnx' are one domain): onnxruntime uses the last entry."""
    entries: dict[str, list[onnx.OperatorSetIdProto]] = {}
    for o in proto.opset_import:
        entries.setdefault(_norm(o.domain), []).append(o)
    if all(len(v) == 1 for v in entries.values()):
        spelled = [o for o in proto.opset_import if o.domain == "ai.onnx"]
        for o in spelled:  # one spelling for the default domain: nodes follow in _node_domains
            o.domain = ""
            r.done.append(f"opset import spells the default domain 'ai.onnx' (version {o.version}): set to '', "
                          "the spelling onnx.checker knows")
        return
    kept = []
    for domain, lst in entries.items():
        last = onnx.OperatorSetIdProto()
        last.CopyFrom(lst[-1])
        if len(lst) > 1:
            last.domain = domain
            versions = ", ".join(str(o.version) for o in lst)
            r.done.append(f"opset import for domain '{_shown(domain)}' listed {len(lst)} times (versions "
                          f"{versions}): kept {last.version}, the last one, which onnxruntime uses")
        kept.append(last)
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


def _node_domains(proto: onnx.ModelProto, r: Repairs) -> None:
    """Nodes spelling the default domain 'ai.onnx' where only '' is imported; domains used but not imported."""
    imported = {o.domain for o in proto.opset_import}
    spelled = [n for n in _all_nodes(proto.graph) if n.domain == "ai.onnx"]
    spelled += [n for f in proto.functions for n in f.node if n.domain == "ai.onnx"]
    if spelled and "ai.onnx" not in imported:
        for n in spelled:
            n.domain = ""
        r.done.append(f"{len(spelled)} node(s) name the default domain 'ai.onnx', which is imported as '': "
                      "set to ''")
    imported = {_norm(o.domain) for o in proto.opset_import}
    local = {f.domain for f in proto.functions}
    used = {_norm(n.domain) for n in _all_nodes(proto.graph)}
    for domain in sorted(used - imported - local):
        if domain in DOMAIN_VERSIONS:
            proto.opset_import.add(domain=domain, version=DOMAIN_VERSIONS[domain])
            r.done.append(f"nodes use domain '{domain}' without an opset import: imported version "
                          f"{DOMAIN_VERSIONS[domain]} (what onnxruntime assumes)")


def _ir_version(proto: onnx.ModelProto, r: Repairs) -> None:
    """IR versions below 4 require every initializer to be a graph input, and onnxruntime then treats those
    inputs as constants (it refuses to have them fed). IR 4 and later make such inputs overridable, so when the
    version is raised they leave the input list: what onnxruntime computes and accepts stays the same."""
    if not proto.HasField("ir_version"):
        return  # onnxruntime refuses a model without one; the checker says so
    try:
        need = onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid(_norm(o.domain), o.version) for o in proto.opset_import], ignore_unknown=True)
    except Exception:  # an opset newer than onnx knows: the loader reports that
        return
    ir, g = proto.ir_version, proto.graph
    if ir >= need and ir != 0 and not (ir < 4 and g.initializer):
        return
    target = max(need, 4) if g.initializer else max(need, 1)
    inits = {t.name for t in g.initializer}
    as_inputs = [v.name for v in g.input if v.name in inits]
    why = ("unset" if ir == 0 else f"older than opset {_opset(proto)} needs" if ir < need
           else "below 4, where every initializer must be a graph input")
    proto.ir_version = target
    line = f"ir_version {ir} ({why}): set to {target}"
    if ir < 4 and as_inputs:
        kept = [v for v in g.input if v.name not in inits]
        del g.input[:]
        g.input.extend(kept)
        line += (f"; the initializers it lists as graph inputs ({some_names(as_inputs)}) are constants below IR 4 "
                 "(onnxruntime does not let them be fed), so they left the inputs")
    r.done.append(line)


def _opset(proto: onnx.ModelProto) -> str:
    return ", ".join(f"{_shown(_norm(o.domain))} {o.version}" for o in proto.opset_import)


def _graph_names(graph: onnx.GraphProto, name: str, r: Repairs) -> None:
    if not graph.name:
        graph.name = name
        r.done.append(f"graph without a name: named '{name}'")
    for node in graph.node:
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for k, g in enumerate(subs):
                _graph_names(g, f"{node.name or node.op_type}_{a.name}" + (f"_{k}" if len(subs) > 1 else ""), r)


def _node_names(proto: onnx.ModelProto, r: Repairs) -> None:
    """Unnamed nodes get '<op>_<k>' (unique in the model): reports, provenance and profiles name nodes."""
    nodes = list(_all_nodes(proto.graph))
    unnamed = [n for n in nodes if not n.name]
    if not unnamed:
        return
    taken = {n.name for n in nodes} | {o for n in nodes for o in n.output} | {v.name for v in proto.graph.input}
    counters: dict[str, int] = {}
    given = []
    for n in unnamed:
        while True:
            k = counters.get(n.op_type, 0)
            counters[n.op_type] = k + 1
            name = f"{n.op_type}_{k}"
            if name not in taken:
                break
        taken.add(name)
        n.name = name
        given.append(name)
    r.done.append(f"{len(unnamed)} unnamed node(s) named after their op ({some_names(given, 3)})")


def _duplicate_node_names(graph: onnx.GraphProto, r: Repairs) -> None:
    seen: set[str] = set()
    for n in graph.node:
        if n.name in seen:
            r.suspect.append(f"two nodes named {n.name!r}")
        seen.add(n.name)
        for g in _subgraphs(n):
            _duplicate_node_names(g, r)


def _metadata(proto: onnx.ModelProto, r: Repairs) -> None:
    seen: dict[str, int] = {}
    for p in proto.metadata_props:
        seen[p.key] = seen.get(p.key, 0) + 1
    dups = [k for k, n in seen.items() if n > 1]
    if not dups:
        return
    last = {p.key: p for p in proto.metadata_props}
    kept, done = [], set()
    for p in proto.metadata_props:
        if p.key not in done:
            kept.append(last[p.key])
            done.add(p.key)
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    r.done.append(f"metadata key(s) listed more than once ({some_names(dups)}): kept the last value, which "
                  "onnxruntime shows")


def _initializers(proto: onnx.ModelProto, r: Repairs) -> None:
    g = proto.graph
    # one name twice: onnxruntime uses the last one
    count: dict[str, int] = {}
    for t in g.initializer:
        count[t.name] = count.get(t.name, 0) + 1
    dups = [n for n, c in count.items() if c > 1]
    if dups:
        seen: dict[str, int] = {}
        kept = []
        for t in g.initializer:
            seen[t.name] = seen.get(t.name, 0) + 1
            if seen[t.name] == count[t.name]:
                kept.append(t)
        del g.initializer[:]
        g.initializer.extend(kept)
        r.done.append(f"initializer(s) listed more than once ({some_names(dups)}): kept the last, which onnxruntime "
                      "uses")
    # raw_data and a typed field both set: onnxruntime reads raw_data
    both = []
    for t in g.initializer:
        if t.HasField("raw_data") and any(len(getattr(t, f)) for f in _TYPED_DATA):
            for f in _TYPED_DATA:
                t.ClearField(f)
            both.append(t.name)
    if both:
        r.done.append(f"initializer(s) holding both raw_data and typed data ({some_names(both)}): kept raw_data, "
                      "which onnxruntime reads")
    # read by nothing (and not an input or output): onnxruntime drops them too
    used = {i for n in _all_nodes(g) for i in n.input}
    used |= {o.name for o in g.output} | {v.name for v in g.input}
    used |= {o.name for n in _all_nodes(g) for s in _subgraphs(n) for o in s.output}
    unused = [t.name for t in g.initializer if t.name not in used]
    if unused:
        kept = [t for t in g.initializer if t.name in used]
        del g.initializer[:]
        g.initializer.extend(kept)
        r.done.append(f"{len(unused)} initializer(s) nothing reads removed ({some_names(unused)})")
    # listed as graph inputs too (IR >= 4 here): overridable defaults, so not constants
    inits = {t.name for t in g.initializer}
    overridable = [v.name for v in g.input if v.name in inits]
    if overridable:
        r.notes.append(f"{len(overridable)} initializer(s) are also graph inputs ({some_names(overridable)}): kept as "
                       "inputs with their values as defaults (onnxruntime lets callers override them), so they "
                       "are not constants and fusions that need constant weights skip them (--freeze-weights, "
                       "freeze_weights=True, makes them constants)")


def unrepairable(proto: onnx.ModelProto) -> tuple[str, str] | None:
    """A defect onnx.checker refuses that no repair can fix while keeping what onnxruntime accepts, as
    (message, hint); None when there is none."""
    g = proto.graph
    inits = {t.name for t in g.initializer}
    for v in g.input:
        if v.name in inits:
            continue
        if v.type.WhichOneof("value") is None:
            return (f"graph input '{v.name}' has no type: onnxruntime accepts any there, but onnx.checker requires "
                    "one and onnxfuse cannot tell which the model needs", "declare its type and shape in the model")
        if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape"):
            return (f"graph input '{v.name}' has no shape: onnxruntime accepts any rank there, but onnx.checker "
                    "requires a shape and onnxfuse cannot tell which rank the model needs",
                    f"declare its shape in the model, or pass --static --shape {v.name}:DIMS (e.g. 1x3x224x224)")
    for o in g.output:
        if o.type.WhichOneof("value") is None or (o.type.HasField("tensor_type")
                                                  and not o.type.tensor_type.HasField("shape")):
            return (f"graph output '{o.name}' has no shape and neither onnx's nor onnxruntime's shape inference "
                    "knows its rank: onnx.checker requires one", "declare the output's shape in the model")
    return None
