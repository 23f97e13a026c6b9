"""Validate: a rewritten model must give the original's outputs on onnxruntime, else its rewrites are rolled back.

- `runtime.py`: onnxruntime sessions and runs, one-line errors, candidates serialized where onnxruntime can load
  them (also used by select/ and inspect/, which sit above this stage).
- `compare.py`: output comparison and the tolerance of each dtype.
- `precision.py`: where a rewrite changes a value's precision.
- `validate.py`: the Validator (the original's reference outputs per profile) and `CHECKS`, the checks a
  candidate must pass.
- `rollback.py`: what to roll back when a check fails (the node onnxruntime names, else bisection).

May import: load/, inputs/, rewrite/ and the base modules. Nothing from select/ or inspect/.
"""
