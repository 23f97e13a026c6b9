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

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import onnx

# Domains onnxruntime implements. A node may use one without an opset import: onnxruntime then uses the domain's
# last released version, which these are (the Microsoft domains have only version 1).
DOMAIN_VERSIONS = {"com.microsoft": 1, "com.microsoft.nchwc": 1, "com.microsoft.experimental": 1,
                   "ai.onnx.ml": 5, "ai.onnx.training": 1, "ai.onnx.preview.training": 1}

_TYPED_DATA = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


# ----- onnxruntime's view of the original ----------------------------------------------------------------------
@dataclass
class OrtProbe:
    """Whether onnxruntime creates a session for the original (CPU, ORT_DISABLE_ALL), and its output types."""

    error: str | None
    outputs: dict[str, tuple[int, list[int | str | None]]] = field(default_factory=dict)  # elem type, dims


_PROBES: dict[tuple, OrtProbe] = {}

_ORT_ELEM = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8,
             "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13, "complex64": 14,
             "complex128": 15, "bfloat16": 16}


def file_key(path: str) -> tuple:
    """Identifies a file's content for the caches here: one optimize loads the model many times (bisection,
    measuring), and each load would otherwise ask onnxruntime and shape inference again."""
    st = os.stat(path)
    return os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns


def _remember(cache: dict, key: tuple, value):
    while len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def ort_probe(path: str) -> OrtProbe:
    key = file_key(path)
    return _PROBES[key] if key in _PROBES else _remember(_PROBES, key, _probe(path))


def _probe(path: str) -> OrtProbe:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its warnings (unused initializers, ...) would add lines to stderr
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises many pybind exception types
        return OrtProbe(clean_ort_message(str(e)))
    outputs = {}
    for o in sess.get_outputs():
        m = re.fullmatch(r"tensor\((\w+)\)", o.type or "")
        if m and m.group(1) in _ORT_ELEM:
            outputs[o.name] = (_ORT_ELEM[m.group(1)], list(o.shape or []))
    del sess
    return OrtProbe(None, outputs)


def clean_ort_message(text: str) -> str:
    """onnxruntime's first line without its error-code prefix and C++ source location."""
    line = text.strip().splitlines()[0] if text.strip() else "unknown error"
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
    line = re.sub(r"^Load model from .* failed:", "", line)
    m = re.match(r"^\S+\.(?:cc|h|cpp):\d+ ", line)
    if m:  # a source location and the C++ function's signature
        rest = line[m.end():]
        cut = rest.find(") ")
        line = rest[cut + 2:] if cut >= 0 else rest
    line = re.sub(r"(?<=\w)\.[\w-]+\.(?:cc|h|cpp):\d+ ", ": ", line)
    return line.strip()


# ----- repairs -----------------------------------------------------------------------------------------------
@dataclass
class Repairs:
    done: list[str] = field(default_factory=list)  # what was changed, one line each
    notes: list[str] = field(default_factory=list)  # what was noticed and kept
    suspect: list[str] = field(default_factory=list)  # defects onnxruntime may refuse: ask it, left unrepaired


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
    _types(proto, probe, r, key)
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
        line += (f"; the initializers it lists as graph inputs ({_names(as_inputs)}) are constants below IR 4 "
                 "(onnxruntime does not let them be fed), so they left the inputs")
    r.done.append(line)


def _opset(proto: onnx.ModelProto) -> str:
    return ", ".join(f"{_shown(_norm(o.domain))} {o.version}" for o in proto.opset_import)


def _names(names: list[str], k: int = 4) -> str:
    shown = ", ".join(names[:k])
    return shown + (f", ... ({len(names)} in all)" if len(names) > k else "")


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
    r.done.append(f"{len(unnamed)} unnamed node(s) named after their op ({_names(given, 3)})")


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
    r.done.append(f"metadata key(s) listed more than once ({_names(dups)}): kept the last value, which "
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
        r.done.append(f"initializer(s) listed more than once ({_names(dups)}): kept the last, which onnxruntime "
                      "uses")
    # raw_data and a typed field both set: onnxruntime reads raw_data
    both = []
    for t in g.initializer:
        if t.HasField("raw_data") and any(len(getattr(t, f)) for f in _TYPED_DATA):
            for f in _TYPED_DATA:
                t.ClearField(f)
            both.append(t.name)
    if both:
        r.done.append(f"initializer(s) holding both raw_data and typed data ({_names(both)}): kept raw_data, "
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
        r.done.append(f"{len(unused)} initializer(s) nothing reads removed ({_names(unused)})")
    # listed as graph inputs too (IR >= 4 here): overridable defaults, so not constants
    inits = {t.name for t in g.initializer}
    overridable = [v.name for v in g.input if v.name in inits]
    if overridable:
        r.notes.append(f"{len(overridable)} initializer(s) are also graph inputs ({_names(overridable)}): kept as "
                       "inputs with their values as defaults (onnxruntime lets callers override them), so they "
                       "are not constants and fusions that need constant weights skip them")


# ----- value_info and graph outputs --------------------------------------------------------------------------
def _dims(tp: onnx.TypeProto) -> list | None:
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
            for d in tt.shape.dim]


def _fmt(dims: list | None) -> str:
    return "unknown rank" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _conflicts(declared: list | None, inferred: list | None) -> bool:
    if declared is None or inferred is None:
        return False
    if len(declared) != len(inferred):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(declared, inferred, strict=True))


def _set_dims(tt: onnx.TypeProto.Tensor, dims: list) -> None:
    tt.ClearField("shape")
    tt.shape.SetInParent()  # present, even with no dims (a scalar)
    for d in dims:
        dim = tt.shape.dim.add()
        if isinstance(d, int) and d >= 0:
            dim.dim_value = d
        elif isinstance(d, str) and d:
            dim.dim_param = d


def _inferred_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types shape inference gives every value when no value_info and no output types are given (what a stale
    entry would otherwise steer)."""
    bare = onnx.ModelProto()
    bare.ir_version, bare.graph.name = proto.ir_version, proto.graph.name
    bare.opset_import.extend(proto.opset_import)
    bare.functions.extend(proto.functions)
    for f in ("node", "input", "output", "sparse_initializer"):
        getattr(bare.graph, f).extend(getattr(proto.graph, f))
    for t in proto.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) > 4096:  # inference needs its type and dims, not its data
            stub = bare.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                              data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="onnxfuse-shape-inference-stub")
        else:
            bare.graph.initializer.append(t)
    for o in bare.graph.output:
        o.ClearField("type")
    try:
        inf = onnx.shape_inference.infer_shapes(bare, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    return {v.name: v.type for v in list(inf.graph.value_info) + list(inf.graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


_INFERRED: dict[tuple, dict[str, onnx.TypeProto]] = {}


def _types(proto: onnx.ModelProto, probe: Callable[[], OrtProbe] | None, r: Repairs, key: tuple | None) -> None:
    g = proto.graph
    if not g.value_info and not any(o.type.WhichOneof("value") in (None, "tensor_type") for o in g.output):
        return
    if key is None:
        inferred = _inferred_types(proto)
    else:  # the same file repairs the same way: its inference is the same
        inferred = _INFERRED[key] if key in _INFERRED else _remember(_INFERRED, key, _inferred_types(proto))
    _value_info(g, inferred, r)
    _outputs(g, inferred, probe, r)


def _value_info(g: onnx.GraphProto, inferred: dict[str, onnx.TypeProto], r: Repairs) -> None:
    if not g.value_info:
        return
    defined = {v.name for v in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    inferred = dict(inferred)  # a value_info for a graph input or an initializer must agree with it too
    inferred.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in g.initializer})
    inferred.update({v.name: v.type for v in g.input if v.type.HasField("tensor_type")})
    by_name: dict[str, list[onnx.ValueInfoProto]] = {}
    for v in g.value_info:
        by_name.setdefault(v.name, []).append(v)
    dangling, untyped, twice, stale = [], [], [], []
    keep: dict[str, onnx.ValueInfoProto] = {}
    for name, entries in by_name.items():
        if name not in defined:
            dangling.append(name)
            continue
        typed = [v for v in entries if v.type.WhichOneof("value")]
        if not typed:
            untyped.append(name)
            continue
        inf = inferred.get(name)
        inf_dims = _dims(inf) if inf is not None else None
        distinct = {v.type.SerializeToString() for v in typed}
        inf_elem = inf.tensor_type.elem_type if inf is not None else 0
        if any(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type not in (0, inf_elem)
               for v in typed) and inf_elem:
            r.suspect.append(f"value_info gives '{name}' another element type than its producer")
        shape_stale = [v for v in typed if v.type.HasField("tensor_type") and _conflicts(_dims(v.type), inf_dims)]
        if shape_stale:
            stale.append(f"'{name}' ({_fmt(_dims(shape_stale[0].type))}; the graph gives {_fmt(inf_dims)})")
            continue
        if len(distinct) > 1:  # two different claims and nothing to tell which holds: let inference decide
            stale.append(f"'{name}' (listed {len(typed)} times with different types)")
            continue
        if len(entries) > 1:
            twice.append(name)
        keep[name] = typed[0]
    kept = [keep[name] for name in by_name if name in keep]
    if len(kept) == len(g.value_info):
        return
    del g.value_info[:]
    g.value_info.extend(kept)
    if twice:
        r.done.append(f"value_info listed more than once for {_names(twice)}: kept one")
    if stale:
        r.done.append(f"value_info contradicting the graph dropped, shapes re-inferred: {_names(stale, 3)}")
    if dangling:
        r.done.append(f"value_info for value(s) nothing defines dropped ({_names(dangling)})")
    if untyped:
        r.done.append(f"value_info without a type dropped ({_names(untyped)})")


def _outputs(g: onnx.GraphProto, inferred: dict[str, onnx.TypeProto], probe: Callable[[], OrtProbe] | None,
             r: Repairs) -> None:
    for o in g.output:
        kind = o.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            continue  # sequences, maps, optionals: kept as declared
        inf = inferred.get(o.name)
        inf_elem = inf.tensor_type.elem_type if inf is not None else 0
        inf_dims = _dims(inf) if inf is not None else None
        source = "shape inference"
        if (inf_elem == 0 or inf_dims is None) and probe is not None and (kind is None
                                                                        or not o.type.tensor_type.HasField("shape")):
            ort_type = probe().outputs.get(o.name)
            # onnxruntime reports an unknown rank like a scalar ([]): only a non-empty shape says the rank
            if ort_type is not None:
                if inf_elem == 0:
                    inf_elem, source = ort_type[0], "onnxruntime"
                if inf_dims is None and ort_type[1]:
                    inf_dims, source = [d if isinstance(d, int) or (isinstance(d, str) and d) else None
                                        for d in ort_type[1]], "onnxruntime"
        tt = o.type.tensor_type
        if kind is None:
            if inf_elem == 0:
                continue  # the checker's message stands
            tt.elem_type = inf_elem
            if inf_dims is not None:
                _set_dims(tt, inf_dims)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(inf_elem)
            r.done.append(f"graph output '{o.name}' had no type: set to {dtype} {_fmt(inf_dims)} (from {source})")
            continue
        if tt.elem_type == 0 or inf_elem and tt.elem_type != inf_elem:
            r.suspect.append(f"graph output '{o.name}' declares element type {tt.elem_type}, not {inf_elem}")
            continue  # onnxruntime refuses both: not ours to repair
        if not tt.HasField("shape"):
            if inf_dims is None:
                continue  # rank unknown: the loader reports it
            _set_dims(tt, inf_dims)
            r.done.append(f"graph output '{o.name}' had no shape: set to {_fmt(inf_dims)} (from {source})")
            continue
        declared = _dims(o.type)
        assert declared is not None
        if _conflicts(declared, inf_dims):
            assert inf_dims is not None
            if len(declared) != len(inf_dims):
                merged = inf_dims
            else:
                merged = [b if isinstance(a, int) and isinstance(b, int) and a != b or isinstance(a, int) and a < 0
                          else a for a, b in zip(declared, inf_dims, strict=True)]
            _set_dims(tt, merged)
            r.done.append(f"graph output '{o.name}' declared shape {_fmt(declared)}, but it is {_fmt(inf_dims)}: "
                          f"declared {_fmt(merged)}")
        elif any(isinstance(d, int) and d < 0 for d in declared):
            fixed = [None if isinstance(d, int) and d < 0 else d for d in declared]
            _set_dims(tt, fixed)
            r.done.append(f"graph output '{o.name}' declared negative dims {_fmt(declared)}: declared {_fmt(fixed)}")


# ----- what cannot be repaired -------------------------------------------------------------------------------
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
