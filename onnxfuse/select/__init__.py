"""Select: measured selection, keeping only the rewrites that make the model faster on the target.

- `regions.py`: where rewrites act: clusters of applied rewrites cut out (with one edge of context) as two small
  models, and their class signature.
- `region_select.py`: selection by region (the default): the regions' inputs captured from runs of the
  original, each class timed once within the budget, the choice confirmed on the whole model (the sequence);
  `region_run.py`: one selection's state and steps; `region_timing.py`: timing one class against the noise floor.
- `rounds.py`: selection by whole-model rounds (`--measure-by model`), and the report types both strategies
  share (`MeasureReport`, `GroupEffect`).
- `timing.py`: the timing protocol and its statistics (interleaved runs, paired ratios, bootstrap CIs).
- `decision_cache.py`: the persistent decision cache. `timing_lock.py`: one process times at a time.

May import: validate/, rewrite/, load/, inputs/ and the base modules. Nothing from inspect/.
"""
