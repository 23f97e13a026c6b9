"""Select: measured selection, keeping only the rewrites that make the model faster on the target
(docs/measured-selection.md).

- `units.py`: what is decided (`Unit`, `Kind`); `classes.py`: classes of alike regions (regions/).
- `decide.py`: `Evidence`, and the one pure decision policy `decide(units, evidence, expects)`.
- `region_select.py`: the sequence (units, capture, timing, decide, confirm, report);
  `region_run.py`: one selection's state and steps (timing goes through measure/); `on_model.py`: units timed
  on the whole model; `report.py`: the report types.
- `decision_cache.py`: the persistent cache of evidence; `cache_entries.py` its entries' shape;
  `cached_report.py` a selection's report as the cache keeps it.

May import: measure/, regions/, validate/, rewrite/, load/, inputs/ and the base modules. Nothing from inspect/.
"""
