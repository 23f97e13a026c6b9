"""Shape profiles: named sets of shapes a model is deployed at (prefill and decode for a decoder with a KV
cache), each validated, weighted in measured selection's total."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from ..errors import InputSpecError
from .discover import DimChoice, InputPlan, discover, plan_dims, shapes_at
from .shapes import BATCH_DEFAULT, ShapeSpec, check_spec_names, model_inputs, parse_shape_specs
from .synth import synthesize

__all__ = ["Profile", "at_batch", "check_names", "default_profiles", "discover_profiles", "parse_profiles",
           "timing_feeds"]


@dataclass
class Profile:
    """A named set of shapes the model is deployed at (prefill, decode), with its weight in measured
    selection's total."""

    name: str
    spec: ShapeSpec
    weight: float = 1.0
    text: str = ""  # as the user wrote it (error messages)


_PROFILE = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*:(.*?)(?:@\s*([0-9.]+))?\s*$")


def parse_profiles(texts: list[str]) -> list[Profile]:
    """`NAME:DIM=V,DIM=V[@WEIGHT]`; an item may also be a whole input shape `INPUT:AxBxC`. Repeatable."""
    out: list[Profile] = []
    for text in texts:
        m = _PROFILE.match(text)
        where = {"option": "profiles", "value": text}
        if not m or not m.group(2).strip():
            raise InputSpecError("expected NAME:DIM=V,DIM=V[@WEIGHT]",
                                 hint="e.g. decode:sequence=1,past_sequence=127@4", **where)
        name, body, weight = m.group(1), m.group(2), m.group(3)
        if any(p.name == name for p in out):
            raise InputSpecError(f"profile '{name}' given twice", **where)
        spec = parse_shape_specs([item for item in body.split(",") if item.strip()], "profiles", text)
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise InputSpecError(f"the weight {weight!r} is not a number", **where) from None
        if w <= 0:
            raise InputSpecError("the weight must be positive", **where)
        out.append(Profile(name, spec, w, text))
    return out


def check_names(model: onnx.ModelProto, spec: ShapeSpec, profiles: list[Profile] | None) -> None:
    """The inputs and dims the user's shapes and profiles name are the model's (else one error naming the
    unknown one and listing the model's): before anything runs."""
    inputs = model_inputs(model)
    check_spec_names(spec, inputs)
    for p in profiles or []:
        check_spec_names(p.spec, inputs, "profiles", p.text or p.name)


def _merged(user: ShapeSpec, profile: ShapeSpec) -> ShapeSpec:
    return ShapeSpec(tensors={**user.tensors, **profile.tensors}, dims={**user.dims, **profile.dims})


def default_profiles(model: onnx.ModelProto, spec: ShapeSpec, length: int | None = None) -> list[Profile]:
    """Decoders with a KV cache: prefill (the discovered length, or `length`, with an empty cache) and decode
    (one new token after a cache one short of that length), weighted equally. None for other models, or when
    the user fixed the cache length."""
    inputs = model_inputs(model)
    if any(i.shape is None for i in inputs):
        return []
    dims = plan_dims(model, inputs, spec, BATCH_DEFAULT)
    past = [k for k, d in dims.items() if d.role == "past" and d.fixed is None]
    seq = [k for k, d in dims.items() if d.role == "seq" and d.fixed is None]
    if not past or len(seq) != 1:
        return []
    n = length or dims[seq[0]].ladder[0]
    return [Profile("prefill", ShapeSpec(dims={seq[0]: n, **{p: 0 for p in past}})),
            Profile("decode", ShapeSpec(dims={seq[0]: 1, **{p: n - 1 for p in past}}))]


def discover_profiles(model: onnx.ModelProto, probe: Callable[[dict], object] | None, spec: ShapeSpec,
                      npz_path: str | None, profiles: list[Profile] | None,
                      budget_bytes: int | None = None) -> list[tuple[Profile, InputPlan, object]]:
    """One plan per profile (the user's, or the defaults for a KV-cache decoder; else one plan named
    'default'). A default profile the original cannot run falls back to the plain discovered shapes."""
    def single() -> list[tuple[Profile, InputPlan, object]]:
        plan, result = discover(model, probe, spec, npz_path, budget_bytes=budget_bytes)
        return [(Profile("default", spec), plan, result)]

    def each(chosen: list[Profile]) -> list[tuple[Profile, InputPlan, object]]:
        return [(p, *discover(model, probe, _merged(spec, p.spec), budget_bytes=budget_bytes,
                              given=f"{p.name} profile")) for p in chosen]

    check_names(model, ShapeSpec() if npz_path is not None else spec, profiles)
    if npz_path is not None:
        return single()
    if profiles:
        return each(profiles)  # a user's profile the model cannot run is an error
    chosen = default_profiles(model, spec)
    if not chosen:
        return single()
    try:
        return each(chosen)
    except InputSpecError:  # too long for this export (a position table the graph hides): at the length the
        plain = single()    # plain discovery settled on, else its plain shapes
        seq = [d.value for d in plain[0][1].dims if d.role == "seq"]
        if len(seq) == 1 and seq[0] > 1:
            try:
                return each(default_profiles(model, spec, seq[0]))
            except InputSpecError:
                pass
        return plain


def at_batch(model: onnx.ModelProto, plan: InputPlan, batch: int, seed: int = 0) -> dict[str, np.ndarray] | None:
    """The plan's inputs with every batch dim set to `batch` (timing runs batch 1); None when the plan has no
    batch dim or did not choose every dim itself."""
    if not any(d.role == "batch" for d in plan.dims):
        return None
    return at_dims(model, plan, lambda d: batch if d.role == "batch" else d.value, seed)


def timing_feeds(model: onnx.ModelProto, plan: InputPlan, user_given: bool) -> dict[str, np.ndarray]:
    """The inputs timing runs on, in optimize, bench and profile alike: the plan's at batch 1 (the usual
    deployment; validation runs batch 2, which exposes batch-broadcasting bugs), unless the user gave the shapes
    or inputs (`user_given`), or the plan has no batch dim."""
    feeds = None if user_given else at_batch(model, plan, 1)
    return feeds if feeds is not None else plan.feeds


def at_dims(model: onnx.ModelProto, plan: InputPlan, value: Callable[[DimChoice], int],
            seed: int = 0) -> dict[str, np.ndarray] | None:
    """The plan's inputs with each dim at value(dim); None when the plan did not choose every dim itself."""
    if plan.source == "--inputs":
        return None
    values = {d.key: value(d) for d in plan.dims}
    inputs = model_inputs(model)
    try:
        shapes = shapes_at(inputs, ShapeSpec(), values)
    except KeyError:  # a --shape tensor fixed some input
        return None
    spec = ShapeSpec(tensors=shapes, dims={k: v for k, v in values.items() if "[" not in k})
    return synthesize(model, inputs, spec, seed)
