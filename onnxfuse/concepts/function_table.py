"""The functions of the `computes(x, "gelu")` concept, as the pattern language knows them: each one's name, what
it computes (its doc line), the ops one of which its region must have, the parameter it binds (`eps=`, `alpha=`),
and its family; and the ops a region may consist of. The matcher proves a region computes one (function_regions.py, which holds
each function's float64 reference); this module is the language side, read by the parser, the rule loader and
the docs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FUNCTIONS", "Function", "REGION_OPS"]


@dataclass(frozen=True)
class Function:
    """A function `computes(x, NAME)` proves: the ops one of which its region must have (a cheap first test),
    the parameter it binds (`param`: eps, a number the region adds; alpha, a factor it multiplies by), its family
    (functions told apart by which one the region is nearer), and the nodes a rule counts it as (for the order rules are tried in: about its usual spelling; silu and the hard activations
    as many as the spelling rules they replaced had, so that the order stays as it was)."""

    name: str
    doc: str
    needs: frozenset[str]
    size: int
    param: str = ""  # "eps" | "alpha" | "" (none)
    family: str = ""

    @property
    def eps(self) -> bool:
        return self.param == "eps"


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("gelu", "x * 0.5 * (1 + erf(x / sqrt(2)))", frozenset({"Erf"}), 5, family="gelu"),
    Function("gelu_tanh", "x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))", frozenset({"Tanh"}), 5,
             family="gelu"),
    Function("silu", "x * sigmoid(x)", frozenset({"Sigmoid", "Exp"}), 2),
    Function("quickgelu", "x * sigmoid(alpha * x), alpha a factor the region multiplies by (or divides by its "
             "reciprocal)", frozenset({"Sigmoid", "Exp"}), 3, param="alpha"),
    Function("hardsigmoid", "min(max(x + 3, 0), 6) / 6", frozenset({"Clip", "Relu", "Min", "Max"}), 3),
    Function("hardswish", "x * min(max(x + 3, 0), 6) / 6", frozenset({"Clip", "Relu", "Min", "Max"}), 4),
    Function("layernorm", "(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) over the last axis",
             frozenset({"ReduceMean", "ReduceSum", "GlobalAveragePool"}), 5, param="eps"),
    Function("rmsnorm", "x / sqrt(mean(x^2) + eps) over the last axis",
             frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "GlobalAveragePool"}), 5, param="eps"),
)}

# The ops a region may consist of (elementwise, casts, axis insertion and removal, reductions): the matcher runs
# each of them in float64.
REGION_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Erf", "Tanh", "Sigmoid", "Exp", "Identity",
    "Cast", "Max", "Min", "Relu", "Clip", "Unsqueeze", "Squeeze", "ReduceMean", "ReduceSum", "ReduceSumSquare",
    "GlobalAveragePool",
})
