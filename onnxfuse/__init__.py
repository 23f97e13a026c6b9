"""onnxfuse: declarative YAML fusion patterns for ONNX models, validated and measured with onnxruntime.

    import onnxfuse
    result = onnxfuse.optimize("model.onnx", "model.opt.onnx")        # or a ModelProto; output path optional
    result.model                                                      # the optimized ModelProto
    result.fired, result.validation, result.measure                   # what fired, how it validated, timing
    onnxfuse.optimize(proto, options=onnxfuse.OptimizeOptions(measure=False, target="cuda"))

Errors a user can act on (a bad model, pattern file or flag) are OnnxfuseError, with a one-line message.
"""

__version__ = "0.1.0"

from .errors import InputSpecError, ModelError, OnnxfuseError, PatternError
from .inputs import InputPlan
from .inspect.explain import Explanation, explain
from .inspect.latency import BenchResult, bench
from .inspect.op_profile import ProfileResult, profile
from .inspect.selftest import self_test
from .options import OptimizeOptions
from .pipeline import find_inputs, find_profiles, optimize
from .result import Result
from .rewrite.engine import rules_in_order
from .rewrite.ruleset import builtin_patterns_dir, load_rules, pattern_schema

__all__ = ["BenchResult", "Explanation", "InputPlan", "InputSpecError", "ModelError", "OnnxfuseError",
           "OptimizeOptions", "PatternError", "ProfileResult", "Result", "__version__", "bench",
           "builtin_patterns_dir", "explain", "find_inputs", "find_profiles", "load_rules", "optimize",
           "pattern_schema", "profile", "rules_in_order", "self_test"]
