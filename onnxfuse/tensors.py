"""Values and types of an ONNX model: element types and shapes as shape inference knows them (TensorType),
the value of a Constant node, tensors stored as external data (read only when needed), and a walk over every
node, subgraphs included."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import ModelError

__all__ = ["ExternalRef", "TensorType", "all_tensors", "constant_node_value", "dtype_name", "external_info",
           "external_ref", "is_inexact", "iter_nodes", "read_external_tensor", "type_from_proto"]


@dataclass(frozen=True)
class TensorType:
    """Element type and shape of a value as far as shape inference knows (dims: int, str or None)."""

    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.elem_type)


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a GraphProto, subgraphs (If/Loop/Scan bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_nodes(sub)


def dtype_name(elem_type: int) -> str:
    if elem_type == 0:
        return "undefined"
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def type_from_proto(tp: onnx.TypeProto) -> TensorType | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    shape: tuple[int | str | None, ...] | None = None
    if tt.HasField("shape"):
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return TensorType(tt.elem_type, shape)


def constant_node_value(node: onnx.NodeProto) -> np.ndarray:
    a = node.attribute[0] if node.attribute else None
    if a is None:
        raise ModelError(f"Constant node {node.name!r} has no value")
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    if a.name == "value_float":
        return np.array(a.f, dtype=np.float32)
    if a.name == "value_floats":
        return np.array(list(a.floats), dtype=np.float32)
    if a.name == "value_int":
        return np.array(a.i, dtype=np.int64)
    if a.name == "value_ints":
        return np.array(list(a.ints), dtype=np.int64)
    raise ModelError(f"Constant node {node.name!r} has unsupported attribute {a.name!r}")


def external_info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


@dataclass(frozen=True)
class ExternalRef:
    """Where an external tensor's bytes are: `location` (relative to the model's folder), `offset`, and `length`
    (None: to the end of the file)."""

    location: str
    offset: int
    length: int | None


_DIGITS = re.compile(r"[0-9]+")
_PACKED = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4} | (
    {onnx.TensorProto.FLOAT4E2M1} if hasattr(onnx.TensorProto, "FLOAT4E2M1") else set())


def external_ref(t: onnx.TensorProto) -> ExternalRef:
    """The external data fields of `t`, checked: a ModelError names the tensor and the bad field (a location
    that is empty or holds a NUL byte, an offset or length that is not a non-negative decimal integer, a length
    other than the bytes its type and dims need). Whether the location stays inside the model's folder and the
    file holds the bytes is the loader's check (it knows the folder)."""
    info = external_info(t)
    loc = info.get("location", "")
    if not loc:
        raise ModelError(f"tensor {t.name!r} has external data without a location")
    if "\0" in loc:
        raise ModelError(f"tensor {t.name!r} has external data location {loc!r}: it contains a NUL byte")
    fields: dict[str, int | None] = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is not None and not _DIGITS.fullmatch(text):
            raise ModelError(f"tensor {t.name!r} has external data {key} {text!r}: not a non-negative integer")
        fields[key] = None if text is None else int(text)
    need = _stored_bytes(t)
    if fields["length"] is not None and need is not None and fields["length"] != need:
        raise ModelError(f"tensor {t.name!r} has external data length {fields['length']}, but its type and dims "
                         f"need {need} bytes")
    return ExternalRef(loc, fields["offset"] or 0, fields["length"])


def _stored_bytes(t: onnx.TensorProto) -> int | None:
    """The raw bytes a tensor of t's type and dims holds; None where that is not fixed (strings, unknown types)."""
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    n = 1
    for d in t.dims:
        n *= d
    return (n + 1) // 2 if t.data_type in _PACKED else n * itemsize


# element types whose external bytes are the array's little-endian bytes as they are (no packing, no strings)
_PLAIN_DTYPES = {getattr(onnx.TensorProto, k): np.dtype(v) for k, v in (
    ("FLOAT", "float32"), ("DOUBLE", "float64"), ("FLOAT16", "float16"), ("INT8", "int8"), ("INT16", "int16"),
    ("INT32", "int32"), ("INT64", "int64"), ("UINT8", "uint8"), ("UINT16", "uint16"), ("UINT32", "uint32"),
    ("UINT64", "uint64"), ("BOOL", "bool"))}


def read_external_tensor(t: onnx.TensorProto, base_dir: str) -> np.ndarray:
    ref = external_ref(t)
    path = os.path.join(base_dir, ref.location)
    dtype = _PLAIN_DTYPES.get(t.data_type) if sys.byteorder == "little" else None
    n = int(np.prod(t.dims, dtype=np.int64))
    if dtype is not None and (ref.length is None or ref.length == n * dtype.itemsize):
        with open(path, "rb") as f:  # straight into the array: one copy of the weight, not three
            f.seek(ref.offset)
            arr = np.fromfile(f, dtype=dtype, count=n)
        if arr.size == n:
            return arr.reshape(tuple(t.dims))
    with open(path, "rb") as f:
        f.seek(ref.offset)
        data = f.read() if ref.length is None else f.read(ref.length)
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = data
    return numpy_helper.to_array(copy)


def is_inexact(dtype: np.dtype) -> bool:
    """Floating or complex, including the ml_dtypes extension types (bfloat16, float8*, float4*)."""
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat16", "float8", "float4"))


def all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from all_tensors(g)
