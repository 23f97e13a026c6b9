"""Load: model files in and out, before any rewrite.

- `loader.py`: reading a model (checks, clear errors, value types by shape inference on a weightless copy).
- `write.py`: writing it (atomic, the model and its data file as a pair, > 2 GB as external data, streamed one
  initializer at a time).
- `collisions.py`: the files a run reads; an output or report that would replace one is refused before work.
- `lazy.py`: large embedded weights read lazily from the model file itself.
- `repair.py`, `repair_types.py`: models onnxruntime loads but `onnx.checker` rejects, repaired in the loaded copy.
- `ort_check.py`: asks onnxruntime about the original file.

May import: `errors`, `ir`, `tensors`, `opschema`. Nothing from inputs/ (which imports from here), rewrite/, validate/,
select/, inspect/.
"""
