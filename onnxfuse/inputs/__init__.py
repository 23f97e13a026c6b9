"""Inputs that run: the shapes and values onnxfuse feeds a model (see discover.py for how they are found)."""

from .discover import DimChoice, InputPlan, default_budget_bytes, discover, fmt_bytes
from .profiles import Profile, at_batch, at_dims, check_names, discover_profiles, parse_profiles
from .shapes import InputInfo, ShapeSpec, model_inputs, parse_shape_specs
from .synth import make_inputs

__all__ = ["DimChoice", "InputInfo", "InputPlan", "Profile", "ShapeSpec", "at_batch", "at_dims", "check_names", "default_budget_bytes",
           "discover", "discover_profiles", "fmt_bytes", "make_inputs", "model_inputs", "parse_profiles",
           "parse_shape_specs"]
