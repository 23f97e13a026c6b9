"""Select: measured selection, keeping only the rewrites that make the model faster on the target.

- `regions.py`: where rewrites act: clusters of applied rewrites cut out (with one edge of context) as two small
  models, and their class signature.
- `region_select.py`: selection by region (the default): the regions' inputs captured from runs of the
  original, each class timed once within the budget, the choice confirmed on the whole model (the sequence);
  `region_run.py`: one selection's state and steps (timing goes through measure/).
- `rounds.py`: selection by whole-model rounds (`--measure-by model`), and the report types both strategies
  share (`MeasureReport`, `GroupEffect`).
- `decision_cache.py`: the persistent decision cache; `cache_entries.py` its entries' shape; `cached_report.py`
  a selection's report as the cache keeps it.

May import: measure/, validate/, rewrite/, load/, inputs/ and the base modules. Nothing from inspect/.
"""
