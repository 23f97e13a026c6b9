"""Operator schemas: ONNX's own and onnxruntime's contrib domains, for pattern checks and attribute types."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx

MS_DOMAIN = "com.microsoft"
# Domains whose ops have schemas somewhere onnxruntime knows (ONNX's, ONNX-ML's, onnxruntime's contrib and
# internal layout domains): a node in any other domain is unknown unless the model defines it as a function.
RUNTIME_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.training",
                   "ai.onnx.preview.training", "com.microsoft.experimental", "com.ms.internal.nhwc")
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor"})

# Attribute type names of both schema flavours -> onnx.AttributeProto type.
_ATTR_TYPES = {name: getattr(onnx.AttributeProto, name) for name in
               ("FLOAT", "INT", "STRING", "TENSOR", "GRAPH", "FLOATS", "INTS", "STRINGS", "TENSORS", "GRAPHS")}


@dataclass(frozen=True)
class AttrSpec:
    type: int  # onnx.AttributeProto.AttributeType
    default: object  # python value or None when required / no default


@dataclass(frozen=True)
class OpSpec:
    domain: str
    op: str
    min_inputs: int
    max_inputs: int
    min_outputs: int
    max_outputs: int
    attrs: dict[str, AttrSpec]
    required: frozenset[int] = frozenset()  # input indexes that are neither optional nor variadic

    @property
    def commutative(self) -> bool:
        return self.domain == "" and self.op in COMMUTATIVE


def _attr_type(t: object) -> int:
    name = str(t).rsplit(".", 1)[-1]
    return _ATTR_TYPES.get(name, onnx.AttributeProto.UNDEFINED)


def _default(attr: object) -> object:
    dv = getattr(attr, "default_value", None)
    raw = getattr(attr, "_default_value", None)  # onnxruntime's schemas: the serialized AttributeProto
    if dv is None and raw:
        dv = onnx.AttributeProto.FromString(raw)
    if dv is None or not dv.name:
        return None
    return _plain(onnx.helper.get_attribute_value(dv))


def _spec_from(schema: object, domain: str) -> OpSpec:
    max_in = schema.max_input
    max_out = schema.max_output
    return OpSpec(
        domain=domain,
        op=schema.name,
        min_inputs=schema.min_input,
        max_inputs=max_in if max_in < 2**30 else 2**30,
        min_outputs=schema.min_output,
        max_outputs=max_out if max_out < 2**30 else 2**30,
        attrs={k: AttrSpec(_attr_type(v.type), _default(v)) for k, v in schema.attributes.items()},
        required=frozenset(i for i, f in enumerate(getattr(schema, "inputs", ()))
                           if str(getattr(f, "option", "")).rsplit(".", 1)[-1] == "Single"),
    )


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], object]:
    try:
        import onnxruntime.capi.onnxruntime_pybind11_state as C
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return {}
    out: dict[tuple[str, str], object] = {}
    for s in C.get_all_operator_schema():
        if s.domain in ("", "ai.onnx"):
            continue
        key = (s.domain, s.name)
        if key not in out or s.since_version > out[key].since_version:
            out[key] = s
    return out


@functools.cache
def _runtime_onnx_schemas() -> dict[str, tuple[object, ...]]:
    """onnxruntime's own schemas in the ONNX domain, by op (every version it registers, oldest first)."""
    try:
        import onnxruntime.capi.onnxruntime_pybind11_state as C
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return {}
    out: dict[str, list[object]] = {}
    for s in C.get_all_operator_schema():
        if s.domain in ("", "ai.onnx"):
            out.setdefault(s.name, []).append(s)
    return {k: tuple(sorted(v, key=lambda s: s.since_version)) for k, v in out.items()}


@functools.cache
def runtime_only(op: str, opset: int) -> bool:
    """Whether onnxruntime registers `op` in the ONNX domain at `opset` where ONNX itself has no such op:
    LayerNormalization below opset 17 (onnxruntime's transformers optimizer writes it), SimplifiedLayerNormalization
    at any opset. onnxruntime runs such nodes; onnx.checker has no schema for them."""
    try:
        onnx.defs.get_schema(op, opset, "")
        return False
    except onnx.defs.SchemaError:
        pass
    return _runtime_schema(op, opset) is not None


@functools.cache
def onnx_since(op: str) -> int | None:
    """The first opset at which ONNX itself defines `op` in its default domain (None: it never does)."""
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history()
                if s.name == op and s.domain in ("", "ai.onnx")]
    return min(versions) if versions else None


def onnx_defines(op: str, opset: int) -> bool:
    """Whether the ONNX default domain defines `op` at `opset` (what onnx.checker checks a node against)."""
    since = onnx_since(op)
    return since is not None and since <= opset


def undefined_at(op: str, opset: int) -> str:
    """Why an ONNX-domain `op` cannot be written into a model of `opset` ('' when ONNX defines it there)."""
    if onnx_defines(op, opset):
        return ""
    since = onnx_since(op)
    where = f"ONNX defines it from opset {since}" if since else "ONNX has no such op; only onnxruntime registers it"
    return f"{op} is not an ONNX op at the model's opset {opset} ({where}): onnx.checker would reject the output"


def _runtime_schema(op: str, opset: int | None) -> object | None:
    at = [s for s in _runtime_onnx_schemas().get(op, ()) if opset is None or s.since_version <= opset]
    return at[-1] if at else None


@functools.cache
def op_spec(domain: str, op: str, opset: int | None = None) -> OpSpec | None:
    """The schema of `op` (newest version not above `opset` for the ONNX domain), or None if unknown. An op
    onnxruntime registers in the ONNX domain where ONNX has none (runtime_only) has onnxruntime's schema."""
    domain = "" if domain == "ai.onnx" else domain
    if domain == "":
        try:
            if opset is None:
                schema = onnx.defs.get_schema(op, "")
            else:
                schema = onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            rt = _runtime_schema(op, opset)
            return None if rt is None else _spec_from(rt, "")
        return _spec_from(schema, "")
    s = _contrib_schemas().get((domain, op))
    return None if s is None else _spec_from(s, domain)


@functools.cache
def all_attr_names(domain: str, op: str) -> frozenset[str]:
    """Attribute names of every version of an op (ReduceMean had `axes` before opset 18)."""
    domain = "" if domain == "ai.onnx" else domain
    if domain == "":
        names = _onnx_attr_index().get(op)
        if names is not None:
            return names
    spec = op_spec(domain, op)  # (an op only onnxruntime registers in the ONNX domain: its schema's)
    return frozenset(spec.attrs) if spec else frozenset()


@functools.cache
def _onnx_attr_index() -> dict[str, frozenset[str]]:
    index: dict[str, set[str]] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx"):
            index.setdefault(s.name, set()).update(s.attributes)
    return {k: frozenset(v) for k, v in index.items()}


@functools.cache
def known_ops(domain: str) -> list[str]:
    if domain in ("", "ai.onnx"):
        return sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")})
    return sorted(name for d, name in _contrib_schemas() if d == domain)


def attr_value(node_proto: onnx.NodeProto, name: str, spec: OpSpec | None) -> object:
    """An attribute's value with the schema default filled in; None if absent without a default."""
    for a in node_proto.attribute:
        if a.name == name:
            return _plain(onnx.helper.get_attribute_value(a))
    if spec is not None and name in spec.attrs:
        return _plain(spec.attrs[name].default)
    return None


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@functools.cache
def input_type_str(domain: str, op: str, index: int, opset: int | None = None) -> str | None:
    """The type constraint name (e.g. 'T') of input `index` of `op`, or None when unknown or the input has a
    fixed type. A variadic last input covers every later index."""
    domain = "" if domain == "ai.onnx" else domain
    try:
        if domain == "":
            schema = onnx.defs.get_schema(op, opset, "") if opset is not None else onnx.defs.get_schema(op, "")
            inputs = [(i.type_str, i.option) for i in schema.inputs]
            variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
        else:
            s = _contrib_schemas().get((domain, op))
            if s is None:
                return None
            inputs = [(i.typeStr, i.option) for i in s.inputs]
            variadic = type(s.inputs[0].option).Variadic if s.inputs else None
    except onnx.defs.SchemaError:
        return None
    if not inputs:
        return None
    if index >= len(inputs):
        if inputs[-1][1] != variadic:
            return None
        index = len(inputs) - 1
    return inputs[index][0]


def installed_versions() -> str:
    """The onnx and onnxruntime whose schemas these are, for a message: 'onnx 1.19.0 and onnxruntime 1.30.0'."""
    import onnxruntime

    return f"onnx {onnx.__version__} and onnxruntime {onnxruntime.__version__}"
