"""onnxfuse: declarative YAML fusion patterns for ONNX models, validated and measured with onnxruntime.

    import onnxfuse
    result = onnxfuse.optimize("model.onnx", "model.opt.onnx")        # or a ModelProto; output path optional
    result.model                                                      # the optimized ModelProto
    result.fired, result.validation, result.measure                   # what fired, how it validated, timing
    onnxfuse.optimize(proto, options=onnxfuse.OptimizeOptions(measure=False, target="cuda"))
    onnxfuse.rewrite_model(proto).model                               # the rewrite alone: in memory, no validation
    onnxfuse.FusionPass()                                             # the same as an onnx-ir pass (onnxfuse[ir])

See docs/library.md for onnxfuse inside other pipelines (rules as objects, onnx-ir's PassManager).

Errors a user can act on (a bad model, pattern file or flag) are OnnxfuseError, with a one-line message.
"""

__version__ = "0.1.0"

# The public names load on first use (PEP 562), not with the package: `import onnxfuse.cli` must not import onnx,
# onnxruntime and numpy before the command line's entry point (cli/main.py) has its signal handling in place.
import importlib
from typing import TYPE_CHECKING

_PUBLIC = {
    ".errors": ["InputSpecError", "ModelError", "OnnxfuseError", "PatternError"],
    ".inputs": ["InputPlan"],
    ".inspect.explain": ["Explanation", "explain"],
    ".inspect.latency": ["BenchResult", "bench"],
    ".inspect.op_profile": ["ProfileResult", "profile"],
    ".inspect.selftest": ["self_test"],
    ".ir_pass": ["FusionPass"],
    ".options": ["OptimizeOptions"],
    ".patterns.rules": ["Rule"],
    ".pipeline": ["find_inputs", "find_profiles", "optimize"],
    ".result": ["Result"],
    ".rewrite.engine": ["rules_in_order"],
    ".rewrite.in_memory": ["RewriteResult", "rewrite_model"],
    ".rewrite.ruleset": ["builtin_patterns_dir", "load_rules", "pattern_schema", "rules_from_yaml"],
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = ["BenchResult", "Explanation", "FusionPass", "InputPlan", "InputSpecError", "ModelError", "OnnxfuseError",
           "OptimizeOptions", "PatternError", "ProfileResult", "Result", "RewriteResult", "Rule", "__version__",
           "bench", "builtin_patterns_dir", "explain", "find_inputs", "find_profiles", "load_rules", "optimize",
           "pattern_schema", "profile", "rewrite_model", "rules_from_yaml", "rules_in_order", "self_test"]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from .errors import InputSpecError, ModelError, OnnxfuseError, PatternError
    from .inputs import InputPlan
    from .inspect.explain import Explanation, explain
    from .inspect.latency import BenchResult, bench
    from .inspect.op_profile import ProfileResult, profile
    from .inspect.selftest import self_test
    from .ir_pass import FusionPass
    from .options import OptimizeOptions
    from .patterns.rules import Rule
    from .pipeline import find_inputs, find_profiles, optimize
    from .result import Result
    from .rewrite.engine import rules_in_order
    from .rewrite.in_memory import RewriteResult, rewrite_model
    from .rewrite.ruleset import builtin_patterns_dir, load_rules, pattern_schema, rules_from_yaml
