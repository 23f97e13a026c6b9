"""OptimizeOptions: everything `optimize` can be told (the CLI's flags map onto it one to one)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OptimizeOptions"]


@dataclass
class OptimizeOptions:
    """How `onnxfuse.optimize` runs. The defaults are the CLI's: validate, measure, fold, built-in rules, CPU."""

    patterns: list[str] = field(default_factory=list)  # extra pattern files or folders (--patterns)
    only: list[str] = field(default_factory=list)  # apply only these rule ids (--only)
    skip: list[str] = field(default_factory=list)  # never apply these rule ids (--skip)
    builtin: bool = True  # load patterns/*.yaml (--no-builtin turns it off)
    target: str = "cpu"  # execution provider the output is for: cpu or cuda (--target)
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
    profiles: list[str] = field(default_factory=list)  # --profile NAME:DIM=V,...[@WEIGHT] (inputs/profiles.py)
    measure_threads: int | str = 1  # onnxruntime intra-op threads while timing (--threads); "auto": one per
    # physical core, onnxruntime's default (resolved to that number before anything runs)
    measure_budget_s: float | None = None  # --measure-budget: seconds for the whole measuring phase (default:
    # automatic, see region_select.automatic_budget); with measure_by="model", seconds of timing per round
    # (default ROUND_BUDGET_S)
    measure_by: str = "regions"  # regions (each class of alike regions timed alone, then the whole model
    # confirmed) or model (rounds of whole-model variants) (--measure-by)
    cache: bool = True  # read and write the persistent decision cache (--no-cache)

    @property
    def round_budget_s(self) -> float:
        """Seconds of timing per round with measure_by="model"."""
        return self.measure_budget_s if self.measure_budget_s is not None else ROUND_BUDGET_S


ROUND_BUDGET_S = 2.0
