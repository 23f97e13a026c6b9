"""OptimizeOptions: everything `optimize` can be told (the CLI's flags map onto it one to one)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import OnnxfuseError
from .targets import HOST

__all__ = ["OptimizeOptions", "check_choice", "check_target", "check_strings", "check_count", "check_seconds", "check_tolerance"]


@dataclass
class OptimizeOptions:
    """How `onnxfuse.optimize` runs. The defaults are the CLI's: validate, measure, fold, built-in rules, CPU."""

    patterns: list[str] = field(default_factory=list)  # extra pattern files or folders (--patterns)
    only: list[str] = field(default_factory=list)  # apply only these rule ids (--only)
    skip: list[str] = field(default_factory=list)  # never apply these rule ids (--skip)
    builtin: bool = True  # load patterns/*.yaml (--no-builtin turns it off)
    target: str = HOST  # the registered target the output is for: cpu, cuda, openvino (targets.REGISTRY; --target)
    validate: bool = True  # check the output against the original in onnxruntime (--no-validate)
    shapes: list[str] = field(default_factory=list)  # NAME:1x3x224x224 or DIM=4 (--shape)
    inputs_npz: str | None = None  # validation inputs from an .npz file (--inputs)
    rtol: float | None = None  # tolerances (default by dtype, compare.default_tolerance)
    atol: float | None = None
    force: bool = False  # allow the output to be the input file
    dry_run: bool = False  # report what would change, write nothing
    measure: bool = True  # measured selection: keep only groups of rewrites that are faster (--no-measure)
    fold: bool = True  # constant folding, If inlining and versioning (exact; --no-fold turns it off)
    pad_channels: bool = False  # also load patterns/optional/pad_channels.yaml
    static: bool = False  # fix dynamic input dims to the --shape values (the output accepts only those)
    freeze_weights: bool = False  # initializers listed as graph inputs become constants (--freeze-weights; the
    # output no longer takes them as inputs: load/freeze.py)
    profiles: list[str] = field(default_factory=list)  # --profile NAME:DIM=V,...[@WEIGHT] (inputs/profiles.py)
    measure_threads: int | str = 1  # onnxruntime intra-op threads while timing (--threads); "auto": one per
    # physical core, onnxruntime's default (resolved to that number before anything runs)
    measure_budget_s: float | None = None  # --measure-budget: seconds for the whole measuring phase, on the
    # budget's clock (measure/budget.py; default: automatic, see region_run.automatic_budget)
    cache: bool = True  # read and write the persistent decision cache (--no-cache)

    def check(self) -> OptimizeOptions:
        """Every value checked before anything runs (optimize calls it; so does the CLI, before a batch starts):
        one OnnxfuseError naming the option. A str where a list is expected is taken as one item
        (`shapes="batch=1"` is `shapes=["batch=1"]`). Returns self."""
        for name in _LISTS:
            setattr(self, name, check_strings(name, getattr(self, name)))
        check_target("target", self.target)
        check_tolerance("rtol", self.rtol)
        check_tolerance("atol", self.atol)
        if not (isinstance(self.measure_threads, str) and self.measure_threads.strip().lower() == "auto"):
            check_count("measure_threads", self.measure_threads)  # "auto": resolved by optimize
        if self.measure_budget_s is not None:
            check_seconds("measure_budget_s", self.measure_budget_s)
        if self.inputs_npz is not None and not isinstance(self.inputs_npz, str):
            raise OnnxfuseError("expected the path of an .npz file", option="inputs_npz", value=self.inputs_npz)
        # the environment too: a value it cannot use is refused, not ignored
        from .targets import nchwc_setting

        nchwc_setting()
        return self

_LISTS = ("patterns", "only", "skip", "shapes", "profiles")


def check_strings(option: str, value: object) -> list[str]:
    """A list of strings; one str is one item (`"batch=1"` is `["batch=1"]`, not read a character at a time);
    None is []."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise OnnxfuseError(f"expected a list of strings, got {type(value).__name__}", option=option, value=value)
    return list(value)


def check_target(option: str, value: object) -> str:
    """`value` names a registered target (targets.REGISTRY), else one OnnxfuseError naming the option and every
    registered target."""
    from .targets import get

    return get(value, option).name


def check_choice(option: str, value: object, choices: tuple[str, ...]) -> str:
    """`value` is one of `choices`, else one OnnxfuseError naming the option and the choices."""
    if value not in choices:
        raise OnnxfuseError(f"expected {' or '.join(choices)}" if len(choices) < 3 else
                            f"expected one of {', '.join(choices)}", option=option, value=value)
    return value  # type: ignore[return-value]


def check_count(option: str, value: object, minimum: int = 1) -> int:
    """A whole number >= minimum (threads, jobs, runs)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OnnxfuseError("expected a whole number", option=option, value=value)
    if value < minimum:
        raise OnnxfuseError(f"must be >= {minimum}", option=option, value=value)
    return value


def check_seconds(option: str, value: object) -> float:
    """A finite number of seconds > 0 (budgets)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OnnxfuseError("expected a number of seconds", option=option, value=value)
    if not math.isfinite(value) or value <= 0:
        raise OnnxfuseError("must be a number of seconds > 0", option=option, value=value)
    return float(value)


def check_tolerance(option: str, value: object) -> float | None:
    """None (the default by dtype) or a finite number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OnnxfuseError("expected a number", option=option, value=value)
    if not math.isfinite(value) or value < 0:
        raise OnnxfuseError("must be a finite number >= 0", option=option, value=value)
    return float(value)
