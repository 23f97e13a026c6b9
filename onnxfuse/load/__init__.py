"""Load: model files in and out, before any rewrite.

- `loader.py`: reading a model (checks, value types by shape inference), writing it (atomic, > 2 GB as external
  data), weights read lazily from their files.
- `repair.py`, `repair_types.py`: models onnxruntime loads but `onnx.checker` rejects, repaired in the loaded copy.
- `ort_check.py`: asks onnxruntime about the original file.
- `static_shapes.py`: `--static-shapes`, the model's dynamic input dims fixed from `--shape`.

May import: `errors`, `ir`, `tensors`, `opschema`, `inputs/`. Nothing from rewrite/, validate/, select/, inspect/.
"""
