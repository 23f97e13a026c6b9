"""What the engine learns from running the original model, as optimize does: which branch each top-level If
takes on the inputs validation and timing use, and the shapes of values onnx's shape inference leaves without
one (Validator.observed_types). optimize gives them to every rebuild; explain asks for them here, so that it
sees what optimize sees."""

from __future__ import annotations

from ..errors import InputSpecError, OnnxfuseError
from ..ir import Model
from ..load.loader import LoadInfo, load_model
from ..options import OptimizeOptions
from ..rewrite.engine import EngineOptions
from ..targets import HOST, runs_on
from .validate import Validator

__all__ = ["facts", "run_facts", "unshaped"]


def unshaped(model: Model) -> list[str]:
    """Main-graph node outputs shape inference gave no shape (what Validator.observed_types looks at)."""
    g = model.graph
    return [o for n in g.nodes for o in n.outputs
            if o and (g.types.get(o) is None or g.types[o].shape is None)]


def facts(validator: Validator, model: Model, info: LoadInfo, target: str, fold: bool = True) -> EngineOptions:
    """The engine options for rewriting `model`: the target, which branch each If takes (with folding) and the
    shapes the runs show."""
    hot = validator.branch_values(model.proto, info) if fold else {}
    observed = validator.observed_types(model.proto, info, unshaped(model))
    return EngineOptions(target=target, fold=fold, hot=hot, observed=observed)


def run_facts(path: str, target: str = HOST) -> EngineOptions:
    """The engine options optimize would rewrite `path` with (`facts`); only the target when the model cannot be
    run on the inputs found."""
    opts = OptimizeOptions(target=target, measure=False).check()
    try:
        model, info = load_model(path)
        return facts(Validator(path, model.proto, opts, runs_on(target)), model, info, target)
    except (OnnxfuseError, InputSpecError):
        return EngineOptions(target=target)
