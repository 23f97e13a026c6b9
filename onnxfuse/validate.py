"""Run a model before and after fusion on realistic inputs and compare the outputs.

* ``parse_shape_specs`` turns ``--shape`` flags into a :class:`ShapeSpec`.
* ``make_inputs`` builds feeds for every real graph input (from an ``.npz`` file or synthesized).
* ``make_session`` / ``run`` wrap onnxruntime so user-caused failures become one-line errors.
* ``compare_outputs`` checks each output against the reference within a tolerance.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from .errors import InputSpecError, ModelError, OnnxfuseError
from .ir import iter_nodes

if TYPE_CHECKING:
    import onnxruntime

# --------------------------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Tolerance:
    rtol: float
    atol: float


_FLOAT_WIDE = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.COMPLEX64, TensorProto.COMPLEX128}
_FLOAT_NARROW = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


def default_tolerance(elem_type: int) -> Tolerance:
    """fp32/fp64: 1e-4; fp16/bf16 (and smaller floats): 1e-2; integers and bool: exact."""
    if elem_type in _FLOAT_WIDE:
        return Tolerance(rtol=1e-4, atol=1e-4)
    if elem_type in _FLOAT_NARROW or _is_float8(elem_type):
        return Tolerance(rtol=1e-2, atol=1e-2)
    return Tolerance(rtol=0.0, atol=0.0)


def _is_float8(elem_type: int) -> bool:
    return helper.tensor_dtype_to_string(elem_type).startswith("TensorProto.FLOAT8")


def _is_inexact(dtype: np.dtype) -> bool:
    """Floating or complex, including the ml_dtypes extension types (bfloat16, float8*, float4*)."""
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat16", "float8", "float4"))


# --------------------------------------------------------------------------------------------------------------
# --shape parsing
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ShapeSpec:
    """Parsed ``--shape`` flags: full tensor shapes by input name, and values for named symbolic dims."""

    tensors: dict[str, list[int]] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)


_DIM_LIST = re.compile(r"^\s*(\d+\s*([x,]\s*\d+\s*)*)?$")


def parse_shape_specs(specs: list[str]) -> ShapeSpec:
    """Parse ``name:1x3x224x224`` / ``name:1,3,224,224`` (tensor shape) and ``batch=4`` (symbolic dim)."""
    result = ShapeSpec()
    for raw in specs:
        spec = raw.strip()
        if ":" in spec:
            name, dims = _parse_tensor_spec(spec)
            if name in result.tensors:
                raise InputSpecError(f"--shape given twice for input '{name}'")
            result.tensors[name] = dims
        elif "=" in spec:
            dim_name, value = _parse_dim_spec(spec)
            if dim_name in result.dims:
                raise InputSpecError(f"--shape given twice for dimension '{dim_name}'")
            result.dims[dim_name] = value
        else:
            raise InputSpecError(
                f"invalid --shape '{raw}'",
                hint="use NAME:1x3x224x224 for an input or DIM=4 for a symbolic dimension",
            )
    return result


def _parse_tensor_spec(spec: str) -> tuple[str, list[int]]:
    name, _, dims_text = spec.rpartition(":")  # rpartition: input names may contain ':' (e.g. "x:0")
    name = name.strip()
    if not name:
        raise InputSpecError(f"invalid --shape '{spec}': missing input name before ':'")
    if not _DIM_LIST.match(dims_text):
        raise InputSpecError(
            f"invalid --shape '{spec}': dims must be non-negative integers separated by 'x' or ','",
            hint=f"e.g. {name}:1x3x224x224 (an empty list means a scalar)",
        )
    dims = [int(d) for d in re.split(r"[x,]", dims_text) if d.strip()]
    return name, dims


def _parse_dim_spec(spec: str) -> tuple[str, int]:
    name, _, value_text = spec.partition("=")
    name = name.strip()
    value_text = value_text.strip()
    if not name:
        raise InputSpecError(f"invalid --shape '{spec}': missing dimension name before '='")
    if not value_text.isdigit():
        raise InputSpecError(f"invalid --shape '{spec}': dimension value must be a non-negative integer")
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
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def _np_dtype(info: InputInfo) -> np.dtype:
    if info.elem_type == TensorProto.UNDEFINED:
        raise InputSpecError(f"input '{info.name}' has no element type in the model")
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
    except Exception as exc:  # unknown/unsupported enum values
        raise InputSpecError(f"input '{info.name}' has unsupported element type {info.elem_type}") from exc


def _fmt_shape(shape: list[Dim] | tuple[int, ...] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


# --------------------------------------------------------------------------------------------------------------
# make_inputs
# --------------------------------------------------------------------------------------------------------------


def make_inputs(
    model: onnx.ModelProto,
    shapes: ShapeSpec | None = None,
    npz_path: str | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Feeds for every real graph input: loaded from ``npz_path`` (validated) or synthesized.

    When ``npz_path`` is given the arrays come from the file; tensor shapes in ``shapes`` must then agree
    with the file.
    """
    inputs = model_inputs(model)
    if shapes is not None:
        _check_spec_names(shapes, inputs)
    if npz_path is not None:
        feeds = _load_npz(npz_path, inputs)
        if shapes is not None:
            _check_npz_against_spec(feeds, shapes)
        return feeds
    return _synthesize(model, inputs, shapes or ShapeSpec(), seed)


def _check_spec_names(shapes: ShapeSpec, inputs: list[InputInfo]) -> None:
    names = [i.name for i in inputs]
    unknown = [n for n in shapes.tensors if n not in names]
    if unknown:
        raise InputSpecError(
            f"--shape names unknown input '{unknown[0]}'; model inputs are: {', '.join(names) or '(none)'}"
        )


# ---- npz -----------------------------------------------------------------------------------------------------


def _load_npz(path: str, inputs: list[InputInfo]) -> dict[str, np.ndarray]:
    arrays = _read_npz(path)
    names = [i.name for i in inputs]
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise InputSpecError(
            f"{path}: array '{extra[0]}' is not a model input; model inputs are: {', '.join(names) or '(none)'}"
        )
    feeds: dict[str, np.ndarray] = {}
    bound: dict[str, tuple[int, str]] = {}  # symbolic dim -> (value, input that fixed it)
    for info in inputs:
        if info.name not in arrays:
            raise InputSpecError(f"{path}: missing array for model input '{info.name}'")
        feeds[info.name] = _check_npz_array(path, info, arrays[info.name], bound)
    return feeds


def _read_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise InputSpecError(f"inputs file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise InputSpecError(f"{path}: not an .npz archive (save inputs with numpy.savez)")
        with data:
            return {name: data[name] for name in data.files}
    except InputSpecError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputSpecError(f"{path}: cannot read .npz file: {_first_line(str(exc))}") from exc


def _check_npz_array(
    path: str, info: InputInfo, arr: np.ndarray, bound: dict[str, tuple[int, str]]
) -> np.ndarray:
    arr = _coerce_dtype(path, info, arr)
    if info.shape is None:
        return arr
    if arr.ndim != len(info.shape):
        raise InputSpecError(
            f"{path}: input '{info.name}' has rank {arr.ndim} (shape {tuple(arr.shape)}), "
            f"the model expects rank {len(info.shape)} {_fmt_shape(info.shape)}"
        )
    for axis, (want, got) in enumerate(zip(info.shape, arr.shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputSpecError(
                f"{path}: input '{info.name}' has shape {tuple(arr.shape)}, the model expects "
                f"{_fmt_shape(info.shape)} (dim {axis} must be {want})"
            )
        if isinstance(want, str):
            _check_symbolic(path, info.name, want, got, bound)
    return arr


def _check_symbolic(path: str, name: str, dim: str, value: int, bound: dict[str, tuple[int, str]]) -> None:
    if dim not in bound:
        bound[dim] = (value, name)
        return
    prev_value, prev_name = bound[dim]
    if prev_value != value:
        raise InputSpecError(
            f"{path}: dimension '{dim}' is {prev_value} in input '{prev_name}' but {value} in input '{name}'"
        )


def _coerce_dtype(path: str, info: InputInfo, arr: np.ndarray) -> np.ndarray:
    want = _np_dtype(info)
    if arr.dtype == want:
        return arr
    if np.can_cast(arr.dtype, want, casting="safe"):
        return arr.astype(want)
    both_float = _is_inexact(arr.dtype) and _is_inexact(want) and "c" not in (arr.dtype.kind, want.kind)
    both_int = arr.dtype.kind in "iu" and want.kind in "iu"
    if both_float:
        return arr.astype(want)
    if both_int and (arr.size == 0 or _ints_fit(arr, want)):
        return arr.astype(want)
    raise InputSpecError(
        f"{path}: input '{info.name}' has dtype {arr.dtype}, the model expects {info.type_name.lower()} ({want})"
    )


def _ints_fit(arr: np.ndarray, dtype: np.dtype) -> bool:
    limits = np.iinfo(dtype)
    return bool(int(arr.min()) >= limits.min and int(arr.max()) <= limits.max)


def _check_npz_against_spec(feeds: dict[str, np.ndarray], shapes: ShapeSpec) -> None:
    for name, dims in shapes.tensors.items():
        got = tuple(feeds[name].shape)
        if got != tuple(dims):
            raise InputSpecError(
                f"--shape {name}:{'x'.join(map(str, dims))} disagrees with the inputs file {got}"
            )


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
            shapes[info.name] = _resolve_one(info, bindings)
    return shapes


def _validate_tensor_spec(info: InputInfo, dims: list[int]) -> None:
    if info.shape is None:
        return
    shown = f"--shape {info.name}:{'x'.join(map(str, dims))}"
    if len(dims) != len(info.shape):
        raise InputSpecError(
            f"{shown} has rank {len(dims)}, the model input has rank {len(info.shape)} {_fmt_shape(info.shape)}"
        )
    for axis, (want, got) in enumerate(zip(info.shape, dims, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputSpecError(
                f"{shown} disagrees with the model shape {_fmt_shape(info.shape)} at dim {axis} (fixed to {want})"
            )


def _resolve_one(info: InputInfo, bindings: dict[str, int]) -> list[int]:
    if info.shape is None:
        raise InputSpecError(
            f"the rank of input '{info.name}' is unknown", hint=f"pass --shape {info.name}:DIMS, e.g. 1x16"
        )
    is_float = _is_inexact(_np_dtype(info))
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


# ---- Gather bounds (embedding table sizes) ---------------------------------------------------------------------

_PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Transpose", "Expand"}
_SHAPE_PRESERVING = {"Cast", "Identity", "DequantizeLinear"}
# com.microsoft.EmbedLayerNormalization: (ids input, table input) for input_ids, segment_ids and position_ids
_EMBED_TABLES = ((0, 2), (1, 4), (8, 3))


@dataclass
class _GraphIndex:
    consumers: dict[str, list[onnx.NodeProto]]
    producers: dict[str, onnx.NodeProto]
    const_shapes: dict[str, tuple[int, ...]]

    @classmethod
    def build(cls, model: onnx.ModelProto) -> _GraphIndex:
        consumers: dict[str, list[onnx.NodeProto]] = {}
        producers: dict[str, onnx.NodeProto] = {}
        const_shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
        for node in iter_nodes(model.graph):
            for name in node.input:
                if name:
                    consumers.setdefault(name, []).append(node)
            for name in node.output:
                producers[name] = node
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                shape = _constant_node_shape(node)
                if shape is not None:
                    const_shapes[node.output[0]] = shape
        return cls(consumers, producers, const_shapes)

    def static_shape(self, name: str, depth: int = 0) -> tuple[int, ...] | None:
        if name in self.const_shapes:
            return self.const_shapes[name]
        node = self.producers.get(name)
        if node is None or depth > 8 or node.op_type not in _SHAPE_PRESERVING or not node.input:
            return None
        return self.static_shape(node.input[0], depth + 1)


def _constant_node_shape(node: onnx.NodeProto) -> tuple[int, ...] | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return tuple(attr.t.dims)
    return None


def _gather_axis(node: onnx.NodeProto, rank: int) -> int:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    return axis + rank if axis < 0 else axis


def gather_bound(index: _GraphIndex, name: str) -> int | None:
    """Smallest table size over Gathers whose (constant) data this value indexes, through pass-through ops."""
    bounds: list[int] = []
    seen: set[str] = set()
    stack = [name]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in index.consumers.get(value, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                shape = index.static_shape(node.input[0])
                if shape:
                    axis = _gather_axis(node, len(shape))
                    if 0 <= axis < len(shape):
                        bounds.append(shape[axis])
            elif node.op_type == "EmbedLayerNormalization" and node.domain == "com.microsoft":
                for ids, table in _EMBED_TABLES:  # ids indexing a fused embedding table
                    if len(node.input) > max(ids, table) and node.input[ids] == value:
                        shape = index.static_shape(node.input[table])
                        if shape:
                            bounds.append(shape[0])
            elif node.op_type in _PASS_THROUGH and node.input and node.input[0] == value:
                stack.extend(o for o in node.output if o)
    return min(bounds) if bounds else None


# ---- value synthesis ------------------------------------------------------------------------------------------


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def _is_sample_rate(name: str) -> bool:
    low = name.lower()
    return "sample_rate" in low or "samplerate" in low or "sr" in _tokens(name)


def _int_values(
    name: str, shape: list[int], dtype: np.dtype, bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    low = name.lower()
    if "mask" in low:
        values = np.ones(shape, dtype=np.int64)
    elif _is_sample_rate(name) and bound is None:
        values = np.full(shape, 16000, dtype=np.int64)
    elif "position" in low:
        last = shape[-1] if shape else 1
        values = np.broadcast_to(np.arange(last, dtype=np.int64), shape).copy() if shape else np.array(0)
    elif bound is not None:
        values = rng.integers(0, max(bound, 1), size=shape, dtype=np.int64)
    else:
        values = rng.integers(0, 8, size=shape, dtype=np.int64)
    if bound is not None and bound > 0:
        values = values % bound  # ones / positions must stay inside the embedding table as well
    return values.astype(dtype)


def _synthesize_one(
    info: InputInfo, shape: list[int], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    dtype = _np_dtype(info)
    if dtype == np.bool_:
        return np.ones(shape, dtype=np.bool_)
    if dtype.kind in "iu":
        return _int_values(info.name, shape, dtype, bound, rng)
    if _is_inexact(dtype) and dtype.kind != "c":
        return rng.standard_normal(size=shape).astype(np.float32).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(size=shape) + 1j * rng.standard_normal(size=shape)).astype(dtype)
    if dtype.kind in "OSU":
        return np.full(shape, "a", dtype=object)
    raise InputSpecError(f"cannot generate values for input '{info.name}' of type {info.type_name}")


def _synthesize(
    model: onnx.ModelProto, inputs: list[InputInfo], spec: ShapeSpec, seed: int
) -> dict[str, np.ndarray]:
    shapes = resolve_shapes(inputs, spec)
    index = _GraphIndex.build(model)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        bound = gather_bound(index, info.name) if _np_dtype(info).kind in "iu" else None
        feeds[info.name] = _synthesize_one(info, shapes[info.name], bound, rng)
    return feeds


# --------------------------------------------------------------------------------------------------------------
# onnxruntime session / run
# --------------------------------------------------------------------------------------------------------------

LEVELS = ("disable", "basic", "extended", "all")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


# How onnxruntime and onnx.checker name the node a failure is in (the first match wins).
_NODE_IN_MESSAGE = [re.compile(p) for p in (
    r"while running \S+ node\. Name:'([^']*)'",  # a kernel failed at run time
    r"Node \(([^)]*)\) Op \(",  # shape/type inference on load
    r"In Node, \(\"([^\"]*)\",",  # an invalid graph on load
    r"node with name '([^']*)'",  # no kernel for the node
    r"\bNode:(.+?) Output:",  # output shapes that do not merge
    r"\bin node \(([^)]*)\)",  # input types a kernel does not take
    r"for node\. Name: (\S+) OpType:",  # onnx.checker
)]


def failing_node(message: str) -> str:
    """The name of the node a failure message from onnxruntime or onnx.checker names ("" if none)."""
    for pattern in _NODE_IN_MESSAGE:
        m = pattern.search(message)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return ""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def _ort_level(level: str) -> onnxruntime.GraphOptimizationLevel:
    import onnxruntime as ort

    table = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    key = level.lower()
    if key not in table:
        raise OnnxfuseError(f"unknown optimization level '{level}'; choose one of: {', '.join(LEVELS)}")
    return table[key]


def _ort_providers(provider: str) -> list[str]:
    import onnxruntime as ort

    key = provider.lower()
    if key not in PROVIDERS:
        raise OnnxfuseError(f"unknown provider '{provider}'; choose one of: {', '.join(PROVIDERS)}")
    if key == "cuda":
        if PROVIDERS["cuda"] not in ort.get_available_providers():
            raise OnnxfuseError(
                "CUDA execution provider not available in the installed onnxruntime",
                hint="install onnxruntime-gpu or use --provider cpu",
            )
        return [PROVIDERS["cuda"], PROVIDERS["cpu"]]
    return [PROVIDERS["cpu"]]


def make_session(
    model_path: str | bytes, level: str = "disable", provider: str = "cpu", threads: int = 1,
    profile_prefix: str | None = None,
) -> onnxruntime.InferenceSession:
    """An InferenceSession at the given graph optimization level (profiling into `profile_prefix` when
    given); load failures become ModelError."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # failures are reported by onnxfuse itself, in one line
    options = ort.SessionOptions()
    options.graph_optimization_level = _ort_level(level)
    options.log_severity_level = 4
    if threads < 0:
        raise OnnxfuseError(f"thread count must be >= 0, got {threads}")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    providers = _ort_providers(provider)
    if isinstance(model_path, str) and not os.path.isfile(model_path):
        raise ModelError(f"model file not found: {model_path}")
    label = model_path if isinstance(model_path, str) else "the model"
    try:
        return ort.InferenceSession(model_path, sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises many pybind exception types
        raise ModelError(f"onnxruntime cannot load {label}: {_first_line(str(exc))}") from exc


_ORT_TYPES: dict[str, str] = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}


def _check_feeds(session: onnxruntime.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    expected = {i.name: i for i in session.get_inputs()}
    unknown = [n for n in feeds if n not in expected]
    if unknown:
        raise InputSpecError(f"feed '{unknown[0]}' is not a model input; inputs are: {', '.join(expected)}")
    for name, meta in expected.items():
        if name not in feeds:
            raise InputSpecError(f"no value for model input '{name}'")
        _check_feed(name, meta, np.asarray(feeds[name]))


def _check_feed(name: str, meta: Any, arr: np.ndarray) -> None:
    want = _ORT_TYPES.get(meta.type)
    got = "object" if arr.dtype.kind in "OSU" else arr.dtype.name
    if want is not None and want != got:
        raise InputSpecError(f"input '{name}' has dtype {got}, the model expects {want}")
    shape = meta.shape
    if not shape:  # ORT reports [] for both scalars and unknown rank; let ORT itself judge those
        return
    if len(shape) != arr.ndim:
        raise InputSpecError(
            f"input '{name}' has shape {tuple(arr.shape)}, the model expects rank {len(shape)} {_fmt_shape(shape)}"
        )
    for axis, (dim, size) in enumerate(zip(shape, arr.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise InputSpecError(
                f"input '{name}' has shape {tuple(arr.shape)}, the model expects {_fmt_shape(shape)} "
                f"(dim {axis} must be {dim})"
            )


def run(session: onnxruntime.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run once; returns output name -> array. Failures caused by the feeds become InputSpecError."""
    _check_feeds(session, feeds)
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, feeds)
    except Exception as exc:  # ORT raises many pybind exception types
        raise InputSpecError(
            f"onnxruntime failed to run the model: {_first_line(str(exc))}",
            hint="check --shape / --inputs against the model's expected input shapes",
        ) from exc
    return {name: _as_array(v) for name, v in zip(names, values, strict=True)}


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except ValueError:  # ragged sequence outputs
        out = np.empty(len(value), dtype=object)
        out[:] = list(value)
        return out


# --------------------------------------------------------------------------------------------------------------
# compare_outputs
# --------------------------------------------------------------------------------------------------------------

_TINY = 1e-12
_EXACT = Tolerance(rtol=0.0, atol=0.0)


@dataclass
class OutputCheck:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    cosine: float
    min_tolerance: float
    tolerance: Tolerance
    passed: bool
    ref_nan: int
    new_nan: int
    note: str


def compare_outputs(
    ref: dict[str, np.ndarray], got: dict[str, np.ndarray], tolerance: Tolerance | None = None
) -> list[OutputCheck]:
    """One check per output (reference order, then outputs only the optimized model has)."""
    checks = [compare_one(name, ref[name], got.get(name), tolerance) for name in ref]
    checks += [
        _missing_check(name, got[name], "output only in the optimized model")
        for name in got
        if name not in ref
    ]
    return checks


def _tolerance_for(dtype: np.dtype, tolerance: Tolerance | None) -> Tolerance:
    if not _is_inexact(dtype):
        return _EXACT  # integer / bool / string outputs are always compared exactly
    if tolerance is not None:
        return tolerance
    try:
        return default_tolerance(helper.np_dtype_to_tensor_dtype(dtype))
    except Exception:  # dtypes onnx does not know
        return Tolerance(rtol=1e-4, atol=1e-4)


def _missing_check(name: str, arr: np.ndarray, note: str) -> OutputCheck:
    arr = np.asarray(arr)
    return OutputCheck(
        name=name,
        dtype=arr.dtype.name,
        shape=tuple(arr.shape),
        max_abs=math.nan,
        max_rel=math.nan,
        cosine=math.nan,
        min_tolerance=math.nan,
        tolerance=_EXACT,
        passed=False,
        ref_nan=0,
        new_nan=0,
        note=note,
    )


def _mismatch_check(name: str, a: np.ndarray, tol: Tolerance, note: str) -> OutputCheck:
    check = _missing_check(name, a, note)
    check.tolerance = tol
    check.ref_nan = _count_nonfinite(a)
    return check


def _count_nonfinite(arr: np.ndarray) -> int:
    if not _is_inexact(arr.dtype):
        return 0
    return int(np.count_nonzero(~np.isfinite(arr)))


def _widen(arr: np.ndarray) -> np.ndarray:
    """float64 (complex128 for complex) copy, flattened; bool becomes 0/1."""
    if arr.dtype.kind == "c":
        return arr.astype(np.complex128).ravel()
    return arr.astype(np.int64 if arr.dtype == np.bool_ else np.float64).astype(np.float64).ravel()


def compare_one(
    name: str, ref: np.ndarray, got: np.ndarray | None, tolerance: Tolerance | None = None
) -> OutputCheck:
    if got is None:
        return _missing_check(name, ref, "output missing from the optimized model")
    ref, got = np.asarray(ref), np.asarray(got)
    tol = _tolerance_for(ref.dtype, tolerance)
    if ref.dtype != got.dtype:
        return _mismatch_check(name, ref, tol, f"dtype mismatch {ref.dtype.name} vs {got.dtype.name}")
    if ref.shape != got.shape:
        return _mismatch_check(name, ref, tol, f"shape mismatch {tuple(ref.shape)} vs {tuple(got.shape)}")
    if ref.dtype.kind in "OSU" or (ref.dtype.kind == "V" and not _is_inexact(ref.dtype)):
        return _compare_exact_objects(name, ref, got, tol)
    return _compare_numeric(name, ref, got, tol)


def _compare_exact_objects(name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    differing = int(np.count_nonzero(ref != got)) if ref.size else 0
    return OutputCheck(
        name=name,
        dtype=ref.dtype.name,
        shape=tuple(ref.shape),
        max_abs=math.nan if differing else 0.0,
        max_rel=math.nan if differing else 0.0,
        cosine=math.nan if differing else 1.0,
        min_tolerance=math.nan if differing else 0.0,
        tolerance=tol,
        passed=differing == 0,
        ref_nan=0,
        new_nan=0,
        note=f"{differing} elements differ" if differing else "",
    )


@dataclass
class _Stats:
    max_abs: float
    max_rel: float
    cosine: float
    min_tolerance: float
    within: bool


def _stats(r: np.ndarray, g: np.ndarray, tol: Tolerance, exact: bool) -> _Stats:
    """Metrics over positions where both values are finite (1-D float64 arrays)."""
    if r.size == 0:
        return _Stats(0.0, 0.0, 1.0, 0.0, True)
    diff = np.abs(r - g)
    absr = np.abs(r)
    within = bool(np.all(diff == 0)) if exact else bool(np.all(diff <= tol.atol + tol.rtol * absr))
    return _Stats(
        max_abs=float(diff.max()),
        # relative to each value, floored at 0.1% of the output's mean magnitude: values near zero would
        # otherwise report huge relative errors for tiny absolute ones
        max_rel=float((diff / np.maximum(absr, max(_TINY, 1e-3 * float(absr.mean())))).max()),
        cosine=_cosine(r, g),
        min_tolerance=float((diff / (1.0 + absr)).max()),
        within=within,
    )


def _cosine(r: np.ndarray, g: np.ndarray) -> float:
    if np.array_equal(r, g):
        return 1.0
    nr, ng = float(np.linalg.norm(r)), float(np.linalg.norm(g))
    if nr == 0.0 or ng == 0.0:
        return 0.0
    return float(np.clip(np.real(np.vdot(r, g)) / (nr * ng), -1.0, 1.0))


def _compare_numeric(name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    exact = not _is_inexact(ref.dtype)
    r, g = _widen(ref), _widen(got)
    ref_finite, got_finite = np.isfinite(r), np.isfinite(g)
    ref_nan = int(np.count_nonzero(~ref_finite))
    new_nan = int(np.count_nonzero(~got_finite & ref_finite))
    lost_nan = int(np.count_nonzero(~ref_finite & got_finite))  # reference non-finite, optimized finite
    both = ref_finite & got_finite
    stats = _stats(r[both], g[both], tol, exact)
    if exact:
        stats.within = bool(np.array_equal(ref, got))  # no float64 rounding for large int64 values
    notes = _nan_notes(ref_nan, new_nan, lost_nan)
    if not stats.within:
        notes.append(_tolerance_note(stats, tol, exact))
    return OutputCheck(
        name=name,
        dtype=ref.dtype.name,
        shape=tuple(ref.shape),
        max_abs=stats.max_abs,
        max_rel=stats.max_rel,
        cosine=stats.cosine,
        min_tolerance=stats.min_tolerance,
        tolerance=tol,
        passed=stats.within and new_nan == 0 and lost_nan == 0,
        ref_nan=ref_nan,
        new_nan=new_nan,
        note="; ".join(notes),
    )


def _nan_notes(ref_nan: int, new_nan: int, lost_nan: int) -> list[str]:
    notes: list[str] = []
    if ref_nan:
        notes.append(f"original output already contains {ref_nan} NaN/Inf; compared the finite positions")
    if lost_nan:
        notes.append(f"optimized output is finite at {lost_nan} of those positions")
    if new_nan:
        notes.append(f"optimized output has {new_nan} new NaN/Inf")
    return notes


def _tolerance_note(stats: _Stats, tol: Tolerance, exact: bool) -> str:
    if exact:
        return "values differ (exact match required)"
    return f"max abs diff {stats.max_abs:.3g} exceeds atol={tol.atol:g} + rtol={tol.rtol:g}*|ref|"
