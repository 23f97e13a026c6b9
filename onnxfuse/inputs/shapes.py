"""Input shapes: `--shape` flags parsed into a ShapeSpec, the model's real inputs (InputInfo), and concrete
shapes resolved from fixed dims, the spec and defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import InputSpecError
from ..tensors import is_inexact

# --------------------------------------------------------------------------------------------------------------
# --shape parsing
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ShapeSpec:
    """Parsed ``--shape`` flags: full tensor shapes by input name, and values for named symbolic dims."""

    tensors: dict[str, list[int]] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)


_DIM_LIST = re.compile(r"^\s*(\d+\s*([x,]\s*\d+\s*)*)?$")


def parse_shape_specs(specs: list[str], option: str = "shapes", shown: str | None = None) -> ShapeSpec:
    """Parse ``name:1x3x224x224`` / ``name:1,3,224,224`` (tensor shape) and ``batch=4`` (symbolic dim).
    Errors name `option` with the item (or `shown`: a profile's whole text)."""
    result = ShapeSpec()
    for raw in specs:
        spec = raw.strip()
        where = {"option": option, "value": shown or spec}
        if ":" in spec:
            name, dims = _parse_tensor_spec(spec, where)
            if name in result.tensors:
                raise InputSpecError(f"input '{name}' given twice", **where)
            result.tensors[name] = dims
        elif "=" in spec:
            dim_name, value = _parse_dim_spec(spec, where)
            if dim_name in result.dims:
                raise InputSpecError(f"dimension '{dim_name}' given twice", **where)
            result.dims[dim_name] = value
        else:
            raise InputSpecError("expected NAME:1x3x224x224 for an input or DIM=4 for a symbolic dimension", **where)
    return result


def _parse_tensor_spec(spec: str, where: dict) -> tuple[str, list[int]]:
    name, _, dims_text = spec.rpartition(":")  # rpartition: input names may contain ':' (e.g. "x:0")
    name = name.strip()
    if not name:
        raise InputSpecError("missing input name before ':'", **where)
    if not _DIM_LIST.match(dims_text):
        raise InputSpecError("dims must be non-negative integers separated by 'x' or ','",
                             hint=f"e.g. {name}:1x3x224x224 (an empty list means a scalar)", **where)
    dims = [int(d) for d in re.split(r"[x,]", dims_text) if d.strip()]
    return name, dims


def _parse_dim_spec(spec: str, where: dict) -> tuple[str, int]:
    name, _, value_text = spec.partition("=")
    name = name.strip()
    value_text = value_text.strip()
    if not name:
        raise InputSpecError("missing dimension name before '='", **where)
    if not value_text.isdigit():
        raise InputSpecError("dimension value must be a non-negative integer", **where)
    return name, int(value_text)


# --------------------------------------------------------------------------------------------------------------
# Model input description
# --------------------------------------------------------------------------------------------------------------

Dim = int | str | None  # fixed value, symbolic name, or unknown


@dataclass
class InputInfo:
    name: str
    elem_type: int
    shape: list[Dim] | None  # None: rank unknown

    @property
    def type_name(self) -> str:
        return helper.tensor_dtype_to_string(self.elem_type).removeprefix("TensorProto.")


def model_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The graph inputs that are not initializers (i.e. what must be fed)."""
    initializers = {t.name for t in model.graph.initializer}
    initializers |= {t.values.name for t in model.graph.sparse_initializer}
    return [_input_info(vi) for vi in model.graph.input if vi.name not in initializers]


def _input_info(vi: onnx.ValueInfoProto) -> InputInfo:
    if vi.type.WhichOneof("value") != "tensor_type":
        kind = vi.type.WhichOneof("value") or "unknown"
        raise InputSpecError(f"input '{vi.name}' has type {kind}; only tensor inputs are supported")
    tensor_type = vi.type.tensor_type
    if not tensor_type.HasField("shape"):
        return InputInfo(vi.name, tensor_type.elem_type, None)
    return InputInfo(vi.name, tensor_type.elem_type, [_dim(d) for d in tensor_type.shape.dim])


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value") and d.dim_value >= 0:  # a declared 0 is a fixed, empty dim: onnxruntime runs it
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def np_dtype(info: InputInfo) -> np.dtype:
    if info.elem_type == TensorProto.UNDEFINED:
        raise InputSpecError(f"input '{info.name}' has no element type in the model")
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
    except Exception as exc:  # unknown/unsupported enum values
        raise InputSpecError(f"input '{info.name}' has unsupported element type {info.elem_type}") from exc


def fmt_shape(shape: list[Dim] | tuple[int, ...] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def check_spec_names(shapes: ShapeSpec, inputs: list[InputInfo], option: str = "shapes",
                     shown: str | None = None) -> None:
    """Every input and dim `shapes` names is one of the model's, else one error naming the unknown one and
    listing the model's (a typo is never silently ignored). `option`/`shown`: the option the spec came from
    (shapes, profiles) and its text, for the message (default: the item as written)."""
    names = [i.name for i in inputs]
    unknown = [n for n in shapes.tensors if n not in names]
    if unknown:
        raise InputSpecError(f"unknown input '{unknown[0]}'; model inputs are: {', '.join(names) or '(none)'}",
                             option=option, value=shown or f"{unknown[0]}:{'x'.join(map(str, shapes.tensors[unknown[0]]))}")
    known = model_dims(inputs)
    bad = [d for d in shapes.dims if d not in known]
    if bad:
        listed = f"the model's dims are: {', '.join(known)}" if known else \
            "the model has no named dims (its input shapes are fixed)"
        raise InputSpecError(f"unknown dim '{bad[0]}'; {listed}", option=option,
                             value=shown or f"{bad[0]}={shapes.dims[bad[0]]}")


_UNNAMED = ("?", "-1", "None", "none", "unk", "")


def dim_key(info: InputInfo, axis: int) -> str:
    """The dim_param (inputs sharing it share the value), or `input[axis]` for a dim with no real name."""
    d = (info.shape or [])[axis]
    return d if isinstance(d, str) and d.strip() not in _UNNAMED else f"{info.name}[{axis}]"


def model_dims(inputs: list[InputInfo]) -> list[str]:
    """The names a `DIM=V` spec may give: the inputs' named dims, and `input[axis]` for dims with no name."""
    out: dict[str, None] = {}
    for info in inputs:
        for axis, d in enumerate(info.shape or []):
            if not isinstance(d, int):
                out[dim_key(info, axis)] = None
            if isinstance(d, str):
                out[d] = None
    return list(out)


# ---- shape resolution -----------------------------------------------------------------------------------------


_SEQ_WORDS = ("seq", "len", "token")
SEQ_DEFAULT = 32
BATCH_DEFAULT = 2  # not 1: a batch of 2 exposes rewrites that broadcast wrongly across the batch
SPATIAL_DEFAULT = 224  # a typical image size: timings at toy sizes mislead measured selection


def is_batch_name(name: str) -> bool:
    low = name.lower()
    return "batch" in low or low == "n" or low.startswith("unk")


def _default_dim(dim_name: str | None, axis: int, rank: int, is_float: bool) -> int:
    if dim_name is not None:
        if is_batch_name(dim_name):
            return BATCH_DEFAULT
        if any(w in dim_name.lower() for w in _SEQ_WORDS):
            return SEQ_DEFAULT
    if rank == 4 and is_float and axis in (2, 3):
        return SPATIAL_DEFAULT
    return BATCH_DEFAULT if axis == 0 else 16


def resolve_shapes(inputs: list[InputInfo], spec: ShapeSpec) -> dict[str, list[int]]:
    """Concrete shapes: fixed model dims, then --shape tensors, then named dims, then defaults."""
    bindings = dict(spec.dims)
    for info in inputs:  # tensor specs also bind the symbolic dims they cover, for the other inputs
        if info.name in spec.tensors:
            _validate_tensor_spec(info, spec.tensors[info.name])
            for want, value in zip(info.shape or [], spec.tensors[info.name], strict=False):
                if isinstance(want, str):
                    bindings.setdefault(want, value)
    shapes: dict[str, list[int]] = {}
    for info in inputs:
        if info.name in spec.tensors:
            shapes[info.name] = list(spec.tensors[info.name])
        else:
            shapes[info.name] = resolve_one(info, bindings)
    return shapes


def _validate_tensor_spec(info: InputInfo, dims: list[int]) -> None:
    if info.shape is None:
        return
    shown = f"--shape {info.name}:{'x'.join(map(str, dims))}"
    if len(dims) != len(info.shape):
        raise InputSpecError(
            f"{shown} has rank {len(dims)}, the model input has rank {len(info.shape)} {fmt_shape(info.shape)}"
        )
    for axis, (want, got) in enumerate(zip(info.shape, dims, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputSpecError(
                f"{shown} disagrees with the model shape {fmt_shape(info.shape)} at dim {axis} (fixed to {want})"
            )


def resolve_one(info: InputInfo, bindings: dict[str, int]) -> list[int]:
    if info.shape is None:
        raise InputSpecError(
            f"the rank of input '{info.name}' is unknown", hint=f"pass --shape {info.name}:DIMS, e.g. 1x16"
        )
    is_float = is_inexact(np_dtype(info))
    rank = len(info.shape)
    out: list[int] = []
    for axis, d in enumerate(info.shape):
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str):
            if d not in bindings:  # first use fixes the value so all inputs sharing the name agree
                bindings[d] = _default_dim(d, axis, rank, is_float)
            out.append(bindings[d])
        else:
            out.append(_default_dim(None, axis, rank, is_float))
    return out
