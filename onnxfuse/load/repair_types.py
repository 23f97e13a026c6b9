"""Repairs of value types: value_info entries listed twice, contradicting the graph or naming nothing are dropped
and shapes inferred again; graph outputs get the shape (and type) shape inference or onnxruntime gives them.
Also the Repairs record every repair module fills in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from .ort_check import OrtProbe, remember


@dataclass
class Repairs:
    done: list[str] = field(default_factory=list)  # what was changed, one line each
    notes: list[str] = field(default_factory=list)  # what was noticed and kept
    suspect: list[str] = field(default_factory=list)  # defects onnxruntime may refuse: ask it, left unrepaired


def some_names(names: list[str], k: int = 4) -> str:
    shown = ", ".join(names[:k])
    return shown + (f", ... ({len(names)} in all)" if len(names) > k else "")


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


_INFERRED: dict[tuple, dict[str, onnx.TypeProto]] = {}


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


def repair_types(proto: onnx.ModelProto, probe: Callable[[], OrtProbe] | None, r: Repairs, key: tuple | None) -> None:
    g = proto.graph
    if not g.value_info and not any(o.type.WhichOneof("value") in (None, "tensor_type") for o in g.output):
        return
    if key is None:
        inferred = _inferred_types(proto)
    else:  # the same file repairs the same way: its inference is the same
        inferred = _INFERRED[key] if key in _INFERRED else remember(_INFERRED, key, _inferred_types(proto))
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
        r.done.append(f"value_info listed more than once for {some_names(twice)}: kept one")
    if stale:
        r.done.append(f"value_info contradicting the graph dropped, shapes re-inferred: {some_names(stale, 3)}")
    if dangling:
        r.done.append(f"value_info for value(s) nothing defines dropped ({some_names(dangling)})")
    if untyped:
        r.done.append(f"value_info without a type dropped ({some_names(untyped)})")


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
