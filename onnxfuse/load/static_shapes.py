"""`--static`: fix a model's dynamic input dims to the `--shape` values before optimizing.

With every input shape known, shape arithmetic folds away and If nodes that test a shape (silero VAD checks its
frame count that way) are inlined. The optimized model then accepts only those shapes: the user asks for it,
and the report says so.
"""

from __future__ import annotations

import os

import onnx

from ..errors import OnnxfuseError
from ..inputs.shapes import model_inputs, parse_shape_specs, resolve_shapes
from ..tensors import all_tensors


def fix_input_shapes(path: str, specs: list[str], out_dir: str) -> str:
    """Write a copy of the model at `path` into `out_dir` with its inputs' dynamic dims fixed; return its path."""
    proto = onnx.load(path, load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(proto.graph)):
        raise OnnxfuseError(f"{path}: fixing the input shapes (static) does not support models with external data "
                            "yet", hint="leave the shapes dynamic (drop --static / static=True)")
    inputs = model_inputs(proto)
    spec = parse_shape_specs(specs)
    bound = dict(spec.dims)
    for info in inputs:
        if info.name in spec.tensors:
            for want, value in zip(info.shape or [], spec.tensors[info.name], strict=False):
                if isinstance(want, str):
                    bound.setdefault(want, value)
    missing = sorted({f"{info.name}[{i}] ({d})" for info in inputs if info.name not in spec.tensors
                      for i, d in enumerate(info.shape or []) if not isinstance(d, int) and d not in bound})
    if missing or any(info.shape is None and info.name not in spec.tensors for info in inputs):
        raise OnnxfuseError(f"fixing the input shapes (static) needs a value for every dynamic input dim; missing: "
                            f"{', '.join(missing)}", hint="give them as shapes: --shape NAME:1x3x224x224 or --shape "
                            "DIM=4 (shapes=['DIM=4'] in Python)")
    shapes = resolve_shapes(inputs, spec)
    for vi in proto.graph.input:
        if vi.name not in shapes:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in shapes[vi.name]:
            shape.dim.add().dim_value = int(d)
    out = os.path.join(out_dir, os.path.basename(path))
    onnx.save(proto, out)
    return out
