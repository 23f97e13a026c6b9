"""`--freeze-weights`: initializers also listed as graph inputs (the ONNX Model Zoo style, IR >= 4) made plain
constants before optimizing.

onnxruntime lets a caller override such an input, so neither it nor onnxfuse treats those weights as constants:
BatchNormalization does not fold into the Conv before it, and fusions that need constant weights skip them. Most
such models were exported that way by default (older torch exporters), not to be fed. With the flag the inputs
are dropped from the model's interface (onnxruntime's own advice, its remove_initializer_from_input tool) and
the output no longer takes them; the report says how many. Validation runs the original with its defaults.
"""

from __future__ import annotations

import os

import onnx

from ..errors import OnnxfuseError
from ..tensors import all_tensors

__all__ = ["freeze_weights"]


def freeze_weights(path: str, out_dir: str) -> tuple[str, int]:
    """(path of a copy in `out_dir` without the graph inputs that are initializers, how many were dropped); the
    model itself when it has none."""
    proto = onnx.load(path, load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    listed = [v for v in proto.graph.input if v.name in inits]
    if not listed:
        return path, 0
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(proto.graph)):
        raise OnnxfuseError(f"{path}: freezing weights listed as inputs does not support models with external "
                            "data yet", hint="leave them as inputs (drop --freeze-weights / freeze_weights=True)")
    kept = [v for v in proto.graph.input if v.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    out = os.path.join(out_dir, os.path.basename(path))
    onnx.save(proto, out)
    return out, len(listed)
