"""`onnxfuse inputs`: the shapes optimize would run a model on, and why."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..targets import HOST
from .app import BenchShape, TargetOpt, app, out, parse_target


@app.command("inputs")
def inputs_cmd(
    model: Annotated[str, typer.Argument(help="Model to inspect.")],
    shape: BenchShape = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable), as optimize takes it (default for a "
                                                      "decoder with a KV cache: prefill and decode).")] = None,
    target: TargetOpt = HOST,
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Do not run the model; print the first "
                                           "candidate within the memory budget.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the inputs as JSON (docs/json.md).")] = False,
) -> None:
    """The input shapes optimize would use when none are given, and why (read from the model, probed on it):
    one set per shape profile (a decoder with a KV cache: prefill and decode)."""
    from .. import find_profiles
    from ..inspect.report import print_inputs

    found = find_profiles(model, shape or [], None, parse_target(target), probe=not no_probe, profiles=profile or [])
    if as_json:
        print(json.dumps({"schema": "onnxfuse.inputs/1", **found[0][2].to_json(),
                          "profiles": [{"name": n, "weight": w, "inputs": p.to_json()} for n, w, p in found]},
                         indent=2))
        return
    for name, weight, plan in found:
        if len(found) > 1 or name != "default":
            out.print(f"{name} profile (weight {weight:g}):", markup=False)
        print_inputs(plan, out)
