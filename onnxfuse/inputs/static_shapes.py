"""`--static`: fix a model's dynamic input dims to the `--shape` values before optimizing.

With every input shape known, shape arithmetic folds away and If nodes that test a shape (silero VAD checks its
frame count that way) are inlined. The optimized model then accepts only those shapes: the user asks for it,
and the report says so.
"""

from __future__ import annotations

import os

import onnx

from ..errors import OnnxfuseError
from ..tensors import all_tensors
from .shapes import check_spec_names, dim_key, model_inputs, parse_shape_specs, resolve_shapes


def fix_input_shapes(path: str, specs: list[str], out_dir: str) -> tuple[str, list[str]]:
    """Write a copy of the model at `path` into `out_dir` with its inputs' dynamic dims fixed. Returns its path
    and the same shapes as one `NAME:DIMS` spec per input: the fixed copy has no named dims left, so a `DIM=V`
    spec no longer names one of its dims, while the tensor specs describe the copy (and the original) exactly."""
    proto = onnx.load(path, load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(proto.graph)):
        raise OnnxfuseError(f"{path}: fixing the input shapes (static) does not support models with external data "
                            "yet", hint="leave the shapes dynamic (drop --static / static=True)")
    inputs = model_inputs(proto)
    spec = parse_shape_specs(specs)
    check_spec_names(spec, inputs)  # a typo is named as such, not reported as the dim it leaves missing
    bound = dict(spec.dims)
    for info in inputs:
        if info.name in spec.tensors:
            for want, value in zip(info.shape or [], spec.tensors[info.name], strict=False):
                if isinstance(want, str):
                    bound.setdefault(want, value)
    missing = sorted({f"{info.name}[{i}] ({d or '?'})" for info in inputs if info.name not in spec.tensors
                      for i, d in enumerate(info.shape or [])
                      if not isinstance(d, int) and d not in bound and dim_key(info, i) not in bound})
    if missing or any(info.shape is None and info.name not in spec.tensors for info in inputs):
        raise OnnxfuseError(f"fixing the input shapes (static) needs a value for every dynamic input dim; missing: "
                            f"{', '.join(missing)}", hint="give them as shapes: --shape NAME:1x3x224x224 or --shape "
                            "DIM=4 (shapes=['DIM=4'] in Python)")
    shapes = resolve_shapes(inputs, spec)
    for info in inputs:  # a dim with no name, given as `input[axis]=V`
        for i, d in enumerate(info.shape or []):
            if info.name not in spec.tensors and not isinstance(d, int) and dim_key(info, i) in spec.dims:
                shapes[info.name][i] = spec.dims[dim_key(info, i)]
    for vi in proto.graph.input:
        if vi.name not in shapes:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in shapes[vi.name]:
            shape.dim.add().dim_value = int(d)
    out = os.path.join(out_dir, os.path.basename(path))
    onnx.save(proto, out)
    return out, [f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items()]
