"""Inspect: looking at models and rules from above the pipeline (these modules may call every stage).

- `latency.py`: `onnxfuse bench`, a model's latency (or two models' ratio) on the target.
- `op_profile.py`: `onnxfuse profile`, op times, bytes and FLOPs per kernel call (the base module `op_cost.py`);
  `remaining.py`: what onnxfuse knows about the op types that take the most time outside GEMM work.
- `alignment.py`: misaligned channel dims. `explain.py`: why each rule did or did not fire.
- `selftest.py` with `selftest_models.py`: `onnxfuse patterns test`, the tests generated from each rule.
- `report.py`, `html_report.py`: terminal and HTML output.

May import: select/, validate/, rewrite/, load/, inputs/, the base modules and `result`. Nothing imports
inspect/ except the API (`onnxfuse/__init__.py`) and the CLI.
"""
