"""Generators of test corpora, shared by the tests and the benchmarks (not shipped in the wheel). Run from the
repository root, e.g. `python -m corpora.forms /tmp/forms`; docs/benchmarks.md says which benchmark reads each.

- `forms.py` (with `forms_torch.py`): transformer graphs the way other exporters and converters write them.
- `concepts.py`: the concept-variation corpus (one concept axis varied at a time); `provenance.py`: its axis of
  where operands come from.
- `fuzz_graphs.py`: random valid graphs for the property tests (tests/test_fuzz.py) and benchmarks/fuzz_long.py.
- `membound.py`, `membound_exports.py`: memory-bound CNNs, built with onnx.helper and exported by torch and tf2onnx.
- `optimum.py`, `keras_encoders.py`, `realistic.py`: exports by Optimum, tf2onnx (Keras) and torch of
  realistic size (random weights, nothing downloaded).

The small sample models and the committed corpora under models/ are made by the scripts beside them.
"""
