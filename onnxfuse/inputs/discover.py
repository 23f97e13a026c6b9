"""Inputs that run: the shapes onnxfuse feeds a model when the user gives none, read from the model itself,
kept within a memory budget and settled by probing the original.

Each dynamic input dim gets a *role* from the graph (batch, text sequence, past/total length of a KV cache,
image side, audio samples, other) and a realistic first value for it (text 128, image 224, audio 1 s),
bounded by what the graph says (a position table of 64 rows caps a text sequence at 64; past + new must fit
it too). A candidate set of shapes is first estimated (inputs plus the largest activation that shape
inference gives) and skipped when it exceeds the memory budget; then the original model runs on it. When it
fails, the next, smaller rung of every dim's ladder is tried (a short, bounded search). The plan records which
shapes were used and why; when nothing runs, one error names the dims to give with --shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import InputSpecError
from ..words import count
from .budget import default_budget_bytes, estimate_bytes, fmt_bytes, skeleton
from .retry import retry_from_error, short_message
from .roles import (
    DimState,
    dim_role,
    fixed_by_constants,
    guess_model_kind,
    is_cache,
    memory_caches,
    position_table_rows,
    reshape_multiples,
    round_to,
    sample_rate_hint,
)
from .shapes import (
    BATCH_DEFAULT,
    InputInfo,
    ShapeSpec,
    check_spec_names,
    dim_key,
    model_inputs,
    np_dtype,
    resolve_one,
)
from .synth import make_inputs, synthesize

__all__ = ["DimChoice", "InputPlan", "default_budget_bytes", "discover", "fmt_bytes", "plan_dims", "shapes_at"]

# role -> ladder of values, most realistic first; the probe walks down them together
LADDERS: dict[str, tuple[int, ...]] = {
    "seq": (128, 64, 32, 16, 8),
    "image": (224, 192, 160, 128, 96, 64, 32),
    "audio": (16000, 8000, 4000, 2048, 1024, 512, 256),
    "frames": (3000, 1500, 1000, 500, 256, 128, 64),  # feature frames (10 ms each): Whisper's 30 s is 3000
    "other": (16, 64, 256, 1024, 8, 1),  # unknown meaning: up first (minimums from pads, windows), then down
}
MAX_PROBES = 8
@dataclass
class DimChoice:
    """One dynamic dim: the name users give with --shape, its role, the value used and why."""

    key: str  # the dim_param, or "input[axis]" for an unnamed dim
    role: str
    value: int
    why: str

    def to_json(self) -> dict:
        return {"dim": self.key, "role": self.role, "value": self.value, "why": self.why}


@dataclass
class InputPlan:
    """The feeds onnxfuse runs the model on, with the reasons and the search that found them."""

    feeds: dict[str, np.ndarray]
    dims: list[DimChoice] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # candidates that did not run, with why
    source: str = "discovered"  # "discovered", "--shape", "--inputs"
    estimate_bytes: int = 0
    budget_bytes: int = 0

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {k: list(v.shape) for k, v in self.feeds.items()}

    def summary(self) -> str:
        """One line: the shapes used, e.g. `input_ids[2x128] (sequence=128: position table of 512 rows)`."""
        shapes = ", ".join(f"{k}[{'x'.join(map(str, v.shape)) or 'scalar'}]" for k, v in self.feeds.items())
        why = "; ".join(f"{d.key}={d.value}: {d.why}" for d in self.dims)
        return shapes + (f" ({why})" if why else "") + (f"; {count(len(self.tried), 'smaller try', 'smaller tries')} before"
                                                          if self.tried else "")

    def to_json(self) -> dict:
        return {"source": self.source, "shapes": self.shapes, "dims": [d.to_json() for d in self.dims],
                "tried": self.tried, "estimate_bytes": self.estimate_bytes, "budget_bytes": self.budget_bytes}


# ---- discovery ----------------------------------------------------------------------------------------------


def plan_dims(model: onnx.ModelProto, inputs: list[InputInfo], spec: ShapeSpec,
               batch: int, given: str = "--shape") -> dict[str, DimState]:
    kind = guess_model_kind(inputs)
    table = position_table_rows(model) if kind == "text" else None
    memory = memory_caches(model, inputs) if any(is_cache(i) for i in inputs) else frozenset()
    has_past = False
    dims: dict[str, DimState] = {}
    bound = dict(spec.dims)  # symbols a --shape tensor fixes bind the other inputs that share them
    for info in inputs:
        for want, value in zip(info.shape or [], spec.tensors.get(info.name, []), strict=False):
            if isinstance(want, str):
                bound.setdefault(want, value)
    for info in inputs:
        if info.shape is None or info.name in spec.tensors:
            continue
        rank = len(info.shape)
        for axis, d in enumerate(info.shape):
            if isinstance(d, int):
                continue
            key = _dim_key(info, axis)
            if key in dims:
                continue
            role = dim_role(d, info, axis, rank, kind, memory)
            has_past |= role == "past"
            if key in bound:
                dims[key] = DimState(key, role, (bound[key],), given, fixed=bound[key])
            elif role == "batch":
                dims[key] = DimState(key, role, (batch,), "batch", fixed=batch)
            elif role == "audio":
                rate = sample_rate_hint(inputs)
                ladder = LADDERS["audio"][1:] if rate == 8000 else LADDERS["audio"]
                dims[key] = DimState(key, role, ladder, f"1 s of audio at {rate or 16000} Hz")
            else:
                dims[key] = DimState(key, role, LADDERS.get(role, LADDERS["seq" if role in ("past", "total", "memory")
                                                                     else "other"]), _DEFAULT_WHY[role])
    for dim in dims.values():  # what the graph bounds
        if dim.fixed is not None or dim.role not in ("seq", "past", "total") or table is None:
            continue
        rows, name = table
        limit = (rows + 1) // 2 if has_past else rows  # past + new must fit the table too
        if dim.ladder[0] > limit:
            dim.ladder = (limit, *[v for v in dim.ladder if v < limit])
            dim.why = f"position table '{name}' has {rows} rows" + (" (past + new share it)" if has_past else "")
    batch_keys = {k for k, d in dims.items() if d.role == "batch"}
    for key, (kind_, k, node) in reshape_multiples(model, inputs, batch_keys).items():
        dim = dims.get(key)
        if dim is None or dim.fixed is not None:
            continue
        if kind_ == "exact":
            dim.ladder, dim.why = (k,), f"Reshape '{node}' needs exactly {k}"
        else:
            dim.ladder = round_to(dim.ladder, k)
            dim.why += f", rounded to a multiple of {k} (Reshape '{node}' cuts it into {k}s)"
    for key, (k, node) in fixed_by_constants(model, inputs).items():
        dim = dims.get(key)
        if dim is not None and dim.fixed is None and dim.role not in ("batch", "past", "total"):
            # k at every level of the search: with the rest of its ladder after it, k met only the other dims'
            # first sizes (a ViT export's 3 channels were tried at 224x224 only, never at its 32x32)
            dim.ladder, dim.why = (k,), f"{node} meets a constant dim of {k}"
    return dims


_dim_key = dim_key


def shapes_at(inputs: list[InputInfo], spec: ShapeSpec, values: dict[str, int]) -> dict[str, list[int]]:
    """Every input's shape: --shape tensors as given, the rest from fixed dims and the dims' values."""
    return {i.name: list(spec.tensors[i.name]) if i.name in spec.tensors else
            [d if isinstance(d, int) else values[_dim_key(i, a)] for a, d in enumerate(i.shape or [])]
            for i in inputs}


_DEFAULT_WHY = {"seq": "text length 128", "past": "KV cache length (new length - 1)",
                "memory": "cross-attention memory (an encoder's sequence, nothing appends to it): length 128",
                "total": "past + new length", "image": "image side 224", "batch": "batch",
                "other": "no role from the graph (not batch, text, image or audio) and no constant fixes it: "
                         "a mid-size default",
                "frames": "30 s of 10 ms feature frames"}


def _values_at(dims: dict[str, DimState], level: int) -> dict[str, int]:
    values = {k: d.fixed if d.fixed is not None else d.ladder[min(level, len(d.ladder) - 1)]
              for k, d in dims.items()}
    seq = next((values[k] for k, d in dims.items() if d.role == "seq"), None)
    past = None
    for k, d in dims.items():  # a KV cache: past = new - 1 (one decode step short of 2x), total = past + new
        if d.role == "past" and d.fixed is None and seq is not None:
            values[k] = max(seq - 1, 0)
        if d.role == "past":  # fixed (a --shape, a profile) or just set: the total follows it either way
            past = values[k]
    for k, d in dims.items():
        if d.role == "total" and d.fixed is None:
            values[k] = _total_of(k, values, dims) if _total_of(k, values, dims) else (
                (past or 0) + (seq or values[k]))
    return values


def _total_of(key: str, values: dict[str, int], dims: dict[str, DimState]) -> int | None:
    """'past_sequence_length + 1', 's0 + s1': a sum of known dims and integers, as exporters write them."""
    parts = [p.strip() for p in key.split("+")]
    if len(parts) < 2:
        return None
    total = 0
    for p in parts:
        if p.isdigit():
            total += int(p)
        elif p in values and p != key:
            total += values[p]
        else:
            return None
    return total


def _why(d: DimState, value: int, decided: str, tried: list[str]) -> str:
    """What decided a dim's value: its default and bounds, and, after failed tries, what the failure said."""
    if d.fixed is not None and value != d.fixed and decided:  # the default batch moved by a failed try
        return f"{d.why}, default {d.fixed}; {value}: {decided} (after {count(len(tried), 'failed try', 'failed tries')})"
    if d.fixed is not None or not tried:
        return d.why
    if decided:
        return f"{d.why}; {value}: {decided} (after {count(len(tried), 'failed try', 'failed tries')})"
    if d.role == "other" and value <= 8 and value < d.ladder[0]:
        return (f"{d.why}; only {value} ran after {count(len(tried), 'failed try', 'failed tries')} (a toy size: a dim that only broadcasts? "
                "give the real one with --shape)")
    return f"{d.why}; {value} after {count(len(tried), 'failed try', 'failed tries')}"


def discover(model: onnx.ModelProto, probe: Callable[[dict], object] | None, spec: ShapeSpec | None = None,
             npz_path: str | None = None, batch: int = BATCH_DEFAULT, budget_bytes: int | None = None,
             seed: int = 0, given: str = "--shape") -> tuple[InputPlan, object]:
    """Feeds for the model and the probe's result on them. `probe(feeds)` runs the original (raising
    InputSpecError when it cannot); None skips probing (the first candidate within budget is used). With
    --inputs the file is used as it is; --shape values are kept and only the other dims searched."""
    spec = spec or ShapeSpec()
    if npz_path is not None:
        feeds = make_inputs(model, spec, npz_path)
        return InputPlan(feeds, source="--inputs"), (probe(feeds) if probe else None)
    inputs = model_inputs(model)
    check_spec_names(spec, inputs)
    dims = plan_dims(model, inputs, spec, batch, given)
    budget = budget_bytes if budget_bytes is not None else default_budget_bytes()
    dtypes = {i.name: np_dtype(i) for i in inputs}
    skel: onnx.ModelProto | None = None
    tried: list[str] = []
    first_error: InputSpecError | None = None
    levels = max([len(d.ladder) for d in dims.values() if d.fixed is None], default=1)
    # (values, what decided them, the values of the failed try that suggested them)
    queue: list[tuple[dict[str, int], str, dict[str, int]]] = [(_values_at(dims, level), "", {})
                                                                 for level in range(levels)]
    seen: set[tuple] = set()
    stuck: set[str] = set()
    probes = 0
    while queue and probes < MAX_PROBES:
        values, decided, parent = queue.pop(0)
        if tuple(sorted(values.items())) in seen:
            continue
        seen.add(tuple(sorted(values.items())))
        for i in inputs:
            if i.shape is None and i.name not in spec.tensors:
                resolve_one(i, {})  # rank unknown: the error says to give it with --shape
        shapes = shapes_at(inputs, spec, values)
        cand = ShapeSpec(tensors=shapes, dims={k: v for k, v in values.items() if "[" not in k})
        if skel is None:
            skel = skeleton(model)
        est = estimate_bytes(skel, shapes, dtypes)
        label = ", ".join(f"{k}={v}" for k, v in values.items() if dims[k].fixed is None) or "given shapes"
        if est > budget:
            tried.append(f"{label}: needs ~{fmt_bytes(est)}, over the memory budget of {fmt_bytes(budget)}")
            continue
        feeds = synthesize(model, inputs, cand, seed)
        probes += 1
        try:
            result = probe(feeds) if probe else None
        except InputSpecError as e:
            first_error = first_error or e
            tried.append(f"{label}: {short_message(e.message)}")
            if not [d for d in dims.values() if d.fixed is None]:
                raise
            retries = retry_from_error(e.message, values, dims)
            # a dim the last retry moved that this error asks to move again does not converge (silero's LSTM
            # state wants batch 2 -> 62 -> 1922: the wanted value grows with it): no more retries move it
            stuck.update(k for k in values if k in parent and parent[k] != values[k]
                         and any(t[k] != values[k] for t, _ in retries))
            queue[:0] = [(t, why, values) for t, why in retries if all(t[k] == values[k] for k in stuck)]
            continue
        choices = [DimChoice(k, d.role, values[k], _why(d, values[k], decided if parent.get(k) != values[k] else "",
                                                         tried)) for k, d in dims.items()]
        return InputPlan(feeds, choices, tried, given if spec.tensors or spec.dims else "discovered",
                         est, budget), result
    free = [k for k, d in dims.items() if d.fixed is None]
    last = tried[-1] if tried else "no candidate"
    flags = sorted({k if not re.search(r"\[\d+\]$", k) else k.rsplit("[", 1)[0] for k in free})
    raise InputSpecError(
        f"no input shapes found that the original model runs on ({len(tried)} tried; last: {last})",
        hint=("give them with " + " ".join(f"--shape {f}=N" if f in dims else f"--shape {f}:DIMS" for f in flags))
        if free else "check --shape / --inputs") from first_error
