"""Regions: where rewrites act, cut out of a model as two small models that can be timed alone.

- `cut.py`: `find_regions` (clusters of rewrites with their context), `Region`, and why one cannot run alone
  (`Untimeable`).
- `model.py`: a region's class signature and one version as a serialized model.
- `cost.py`: what a region's rewrite does to the work its nodes describe (the op-cost prior of measured
  selection).

May import: rewrite/ and the base modules.
"""
