"""Inputs that run: the shapes and values onnxfuse feeds a model.

`shapes.py` (`--shape`, the model's inputs), `npz.py` (`--inputs`), `synth.py` (values: ids inside their tables,
masks, positions), `budget.py` (memory estimate and budget), `profiles.py` (prefill/decode shape profiles); how
shapes are found when none are given: `roles.py` (roles and bounds read from the graph), `retry.py` (retries read
from onnxruntime's errors), `discover.py` (the search); `static_shapes.py` (`--static`: the dynamic input dims fixed
to the `--shape` values). May import the base modules and load/ (budget.py: a model without its weights); load/
imports nothing from here.
"""

from .discover import DimChoice, InputPlan, default_budget_bytes, discover, fmt_bytes
from .profiles import Profile, at_batch, at_dims, check_names, discover_profiles, parse_profiles, timing_feeds
from .shapes import InputInfo, ShapeSpec, model_inputs, parse_shape_specs
from .synth import make_inputs

__all__ = ["timing_feeds", "DimChoice", "InputInfo", "InputPlan", "Profile", "ShapeSpec", "at_batch", "at_dims", "check_names", "default_budget_bytes",
           "discover", "discover_profiles", "fmt_bytes", "make_inputs", "model_inputs", "parse_profiles",
           "parse_shape_specs"]
