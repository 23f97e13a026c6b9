"""Select: measured selection, keeping only the rewrites that make the model faster on the target
(docs/measured-selection.md).

- `units.py`: what is decided (`Unit`, `Kind`) and why a region cannot be timed alone (`Untimeable`).
- `decide.py`: `Evidence`, and the one pure decision policy `decide(units, evidence, expects)`.
- `regions.py`: where rewrites act, cut out as two small models; classes of alike regions.
- `region_select.py`: the sequence (units, capture, timing, decide, confirm, report);
  `region_run.py`: one selection's state and steps (timing goes through measure/); `on_model.py`: units timed
  on the whole model; `op_prior.py`: the op-cost prior; `report.py`: the report types.
- `decision_cache.py`: the persistent cache of evidence; `cache_entries.py` its entries' shape;
  `cached_report.py` a selection's report as the cache keeps it.

May import: measure/, validate/, rewrite/, load/, inputs/ and the base modules. Nothing from inspect/.
"""
