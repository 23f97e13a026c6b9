"""Memory for a candidate set of inputs, estimated before anything runs: inputs plus a few live copies of the
largest activation shape inference can size; and the budget it must fit (a fraction of available memory)."""

from __future__ import annotations

import os

import numpy as np
import onnx

from ..load.loader import weightless

BUDGET_FRACTION = 0.25  # of the memory available when onnxfuse starts

__all__ = ["BUDGET_FRACTION", "default_budget_bytes", "estimate_bytes", "fmt_bytes", "skeleton"]


def default_budget_bytes() -> int:
    """A fraction of the memory available now (MemAvailable on Linux; physical pages elsewhere)."""
    avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if not avail:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 8 << 30
    return int(avail * BUDGET_FRACTION)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its large weights (load.loader.weightless's stubs: initializers of their type and dims
    whose data is in a file that does not exist, which inference never reads and onnx's data propagation does not
    walk) and without the recorded value types (the inputs' dims change from try to try): cheap to copy and to
    infer."""
    m = onnx.ModelProto()
    m.CopyFrom(weightless(model, stubs=True))
    del m.graph.value_info[:]
    return m


def estimate_bytes(skeleton: onnx.ModelProto, shapes: dict[str, list[int]],
                   dtypes: dict[str, np.dtype]) -> int:
    """Inputs + 3x the largest activation shape inference can size (onnxruntime reuses buffers, so the peak
    is a few live tensors, not their sum). A lower bound where shapes stay unknown."""
    inputs = sum(int(np.prod(s)) * dtypes[n].itemsize for n, s in shapes.items())
    m = onnx.ModelProto()
    m.CopyFrom(skeleton)
    for vi in m.graph.input:
        if vi.name in shapes:
            vi.type.tensor_type.shape.Clear()
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    largest = 0
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # an estimate: inputs alone then
        return inputs
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            continue
        try:
            size = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except Exception:
            continue
        largest = max(largest, int(np.prod([d.dim_value for d in t.shape.dim])) * size)
    return inputs + 3 * largest


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
