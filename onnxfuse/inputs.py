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

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import validate as V
from .errors import InputSpecError

__all__ = ["DimChoice", "InputPlan", "Profile", "at_batch", "default_budget_bytes", "discover", "discover_profiles",
           "fmt_bytes", "parse_profiles"]

# role -> ladder of values, most realistic first; the probe walks down them together
LADDERS: dict[str, tuple[int, ...]] = {
    "seq": (128, 64, 32, 16, 8),
    "image": (224, 192, 160, 128, 96, 64, 32),
    "audio": (16000, 8000, 4000, 2048, 1024, 512, 256),
    "other": (16, 64, 256, 1024, 8, 1),  # unknown meaning: up first (minimums from pads, windows), then down
}
MAX_PROBES = 8
BUDGET_FRACTION = 0.25  # of the memory available when onnxfuse starts
_PAST_WORDS = ("past", "cache")
_TOTAL_WORDS = ("total", "+")


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
        return shapes + (f" ({why})" if why else "") + (f"; {len(self.tried)} smaller try(s) before" if self.tried
                                                          else "")

    def to_json(self) -> dict:
        return {"source": self.source, "shapes": self.shapes, "dims": [d.to_json() for d in self.dims],
                "tried": self.tried, "estimate_bytes": self.estimate_bytes, "budget_bytes": self.budget_bytes}


def default_budget_bytes() -> int:
    """A fraction of the memory available now (MemAvailable on Linux; physical pages elsewhere)."""
    avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if not avail:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 8 << 30
    return int(avail * BUDGET_FRACTION)


# ---- roles --------------------------------------------------------------------------------------------------


@dataclass
class _Dim:
    key: str
    role: str
    ladder: tuple[int, ...]
    why: str
    fixed: int | None = None  # bound by the user or tied: not walked down


def _words(name: str) -> str:
    return name.lower()


def _role(name: str | None, info: V.InputInfo, axis: int, rank: int, model_kind: str) -> str:
    """batch / past / total / seq / image / audio / other, from the dim's name, the input and the model."""
    is_float = V._is_inexact(V._np_dtype(info))
    low = _words(name or "")
    if axis == 0 and rank > 1 and not any(w in low for w in ("seq", "len", "token", "time", "past", "total")):
        return "batch"  # the leading dim of a tensor input, whatever the exporter named it
    if "batch" in low:
        return "batch"
    if any(w in low for w in _TOTAL_WORDS):  # first: 'past_sequence_length + 1' is a total
        return "total"
    if any(w in low for w in _PAST_WORDS) or any(w in _words(info.name) for w in _PAST_WORDS) and axis == rank - 2:
        return "past"
    if is_float and rank == 4 and axis in (2, 3) and model_kind == "image":
        return "image"
    if is_float and model_kind == "audio" and axis == rank - 1:
        return "audio"
    if not is_float and rank >= 2 and axis == rank - 1:
        return "seq"
    if name and any(w in low for w in ("seq", "len", "token")):
        return "seq"
    return "other"


def _model_kind(inputs: list[V.InputInfo]) -> str:
    """'audio' when a float input of rank 2-3 has a dynamic last axis and no input is an image."""
    floats = [i for i in inputs if i.shape is not None and V._is_inexact(V._np_dtype(i)) and not _is_cache(i)]
    if any(len(i.shape) == 4 for i in floats):
        return "image"
    for i in floats:
        if len(i.shape) in (2, 3) and not isinstance(i.shape[-1], int) and not any(
                w in _words(i.name) for w in ("hidden", "embed", "state", "past", "cache", "feature")):
            return "audio"
    return "text" if any(not V._is_inexact(V._np_dtype(i)) for i in inputs if i.elem_type) else "other"


def _is_cache(info: V.InputInfo) -> bool:
    """A KV-cache input (past_key_values.0.key, past_key, cache_v, ...)."""
    return any(w in _words(info.name) for w in _PAST_WORDS)


def _sample_rate_hint(inputs: list[V.InputInfo]) -> int | None:
    """An 8 kHz model (a name saying so) wants 0.5-1 s at 8000 samples per second."""
    for i in inputs:
        if "8k" in _words(i.name) or "8000" in _words(i.name):
            return 8000
    return None


# ---- bounds read from the graph -----------------------------------------------------------------------------


def position_table_rows(model: onnx.ModelProto) -> tuple[int, str] | None:
    """The smallest table (rank 2, 16+ rows) gathered on axis 0 by indices the graph computes itself (not ids
    fed by the user): a position table; a text sequence (past + new included) cannot be longer."""
    index = V._GraphIndex.build(model)
    feeds = {i.name for i in model.graph.input}
    derived_from_input = _values_fed_by(index, feeds)
    best: tuple[int, str] | None = None
    for node in V.iter_nodes(model.graph):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        shape = index.static_shape(node.input[0])
        if not shape or len(shape) != 2 or shape[0] < 16 or V._gather_axis(node, 2) != 0:
            continue
        if node.input[1] in derived_from_input and not _named_position(node.input[1]):
            continue
        if best is None or shape[0] < best[0]:
            best = (shape[0], node.input[0])
    return best


def _named_position(value: str) -> bool:
    """Ids that are positions (position_ids input, or computed from one)."""
    return "position" in value.lower() or "pos" in value.lower().split("/")[-1]


def _values_fed_by(index: V._GraphIndex, sources: set[str]) -> set[str]:
    """Values computed from the feeds' *values* through pass-through ops (ids, not shapes)."""
    seen: set[str] = set()
    stack = list(sources)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        for node in index.consumers.get(v, []):
            if node.op_type in V._PASS_THROUGH or node.op_type in ("Add", "Sub", "Mul", "Cast", "Clip", "Where"):
                stack.extend(o for o in node.output if o)
    return seen


# ---- memory estimate ----------------------------------------------------------------------------------------


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its large weights (they become typed inputs): cheap to copy and to infer."""
    g = model.graph
    small = [t for t in g.initializer if int(np.prod(t.dims)) <= 4096 and not t.data_location]
    big = [t for t in g.initializer if not (int(np.prod(t.dims)) <= 4096 and not t.data_location)]
    graph = onnx.helper.make_graph(list(g.node), g.name, list(g.input), list(g.output), small)
    known = {i.name for i in g.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in big if t.name not in known)
    m = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    m.functions.extend(model.functions)
    return m


def estimate_bytes(skeleton: onnx.ModelProto, shapes: dict[str, list[int]],
                   dtypes: dict[str, np.dtype]) -> int:
    """Inputs + 3x the largest activation shape inference can size (onnxruntime reuses buffers, so the peak
    is a few live tensors, not their sum). A lower bound where shapes stay unknown."""
    inputs = sum(int(np.prod(s)) * dtypes[n].itemsize for n, s in shapes.items())
    m = onnx.ModelProto()
    m.CopyFrom(skeleton)
    for vi in m.graph.input:
        if vi.name in shapes:
            vi.type.tensor_type.shape.Clear()
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    largest = 0
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # an estimate: inputs alone then
        return inputs
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            continue
        try:
            size = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except Exception:
            continue
        largest = max(largest, int(np.prod([d.dim_value for d in t.shape.dim])) * size)
    return inputs + 3 * largest


def _short(message: str, limit: int = 160) -> str:
    """onnxruntime's innermost status message (it nests one per If/Loop level), on one line."""
    text = " ".join(message.removeprefix("onnxruntime failed to run the model: ").split())
    inner = text.rsplit("Status Message: ", 1)[-1]
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", text)
    where = f"{node[-1][0]} '{node[-1][1]}': " if node else ""
    out = where + inner
    return out if len(out) <= limit else out[: limit - 3] + "..."


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# ---- discovery ----------------------------------------------------------------------------------------------


def _plan_dims(model: onnx.ModelProto, inputs: list[V.InputInfo], spec: V.ShapeSpec,
               batch: int) -> dict[str, _Dim]:
    kind = _model_kind(inputs)
    table = position_table_rows(model) if kind == "text" else None
    has_past = False
    dims: dict[str, _Dim] = {}
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
            role = _role(d, info, axis, rank, kind)
            has_past |= role == "past"
            if key in bound:
                dims[key] = _Dim(key, role, (bound[key],), "--shape", fixed=bound[key])
            elif role == "batch":
                dims[key] = _Dim(key, role, (batch,), "batch", fixed=batch)
            elif role == "audio":
                rate = _sample_rate_hint(inputs)
                ladder = LADDERS["audio"][1:] if rate == 8000 else LADDERS["audio"]
                dims[key] = _Dim(key, role, ladder, f"1 s of audio at {rate or 16000} Hz")
            else:
                dims[key] = _Dim(key, role, LADDERS.get(role, LADDERS["seq" if role in ("past", "total")
                                                                     else "other"]), _DEFAULT_WHY[role])
    for dim in dims.values():  # what the graph bounds
        if dim.fixed is not None or dim.role not in ("seq", "past", "total") or table is None:
            continue
        rows, name = table
        limit = (rows + 1) // 2 if has_past else rows  # past + new must fit the table too
        if dim.ladder[0] > limit:
            dim.ladder = (limit, *[v for v in dim.ladder if v < limit])
            dim.why = f"position table '{name}' has {rows} rows" + (" (past + new share it)" if has_past else "")
    return dims


_UNNAMED = ("?", "-1", "None", "none", "unk", "")


def _dim_key(info: V.InputInfo, axis: int) -> str:
    """The dim_param (inputs sharing it share the value), or `input[axis]` for a dim with no real name."""
    d = (info.shape or [])[axis]
    return d if isinstance(d, str) and d.strip() not in _UNNAMED else f"{info.name}[{axis}]"


def _shapes_at(inputs: list[V.InputInfo], spec: V.ShapeSpec, values: dict[str, int]) -> dict[str, list[int]]:
    """Every input's shape: --shape tensors as given, the rest from fixed dims and the dims' values."""
    return {i.name: list(spec.tensors[i.name]) if i.name in spec.tensors else
            [d if isinstance(d, int) else values[_dim_key(i, a)] for a, d in enumerate(i.shape or [])]
            for i in inputs}


_DEFAULT_WHY = {"seq": "text length 128", "past": "KV cache length (new length - 1)",
                "total": "past + new length", "image": "image side 224", "other": "default", "batch": "batch"}


def _values_at(dims: dict[str, _Dim], level: int) -> dict[str, int]:
    values = {k: d.fixed if d.fixed is not None else d.ladder[min(level, len(d.ladder) - 1)]
              for k, d in dims.items()}
    seq = next((values[k] for k, d in dims.items() if d.role == "seq"), None)
    past = None
    for k, d in dims.items():  # a KV cache: past = new - 1 (one decode step short of 2x), total = past + new
        if d.role == "past" and d.fixed is None and seq is not None:
            values[k] = past = max(seq - 1, 0)
    for k, d in dims.items():
        if d.role == "total" and d.fixed is None:
            values[k] = _total_of(k, values, dims) if _total_of(k, values, dims) else (
                (past or 0) + (seq or values[k]))
    return values


def _total_of(key: str, values: dict[str, int], dims: dict[str, _Dim]) -> int | None:
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


def discover(model: onnx.ModelProto, probe: Callable[[dict], object] | None, spec: V.ShapeSpec | None = None,
             npz_path: str | None = None, batch: int = V.BATCH_DEFAULT, budget_bytes: int | None = None,
             seed: int = 0) -> tuple[InputPlan, object]:
    """Feeds for the model and the probe's result on them. `probe(feeds)` runs the original (raising
    InputSpecError when it cannot); None skips probing (the first candidate within budget is used). With
    --inputs the file is used as it is; --shape values are kept and only the other dims searched."""
    spec = spec or V.ShapeSpec()
    if npz_path is not None:
        feeds = V.make_inputs(model, spec, npz_path)
        return InputPlan(feeds, source="--inputs"), (probe(feeds) if probe else None)
    inputs = V.model_inputs(model)
    V._check_spec_names(spec, inputs)
    dims = _plan_dims(model, inputs, spec, batch)
    budget = budget_bytes if budget_bytes is not None else default_budget_bytes()
    dtypes = {i.name: V._np_dtype(i) for i in inputs}
    skeleton: onnx.ModelProto | None = None
    tried: list[str] = []
    first_error: InputSpecError | None = None
    levels = max([len(d.ladder) for d in dims.values() if d.fixed is None], default=1)
    seen: set[tuple] = set()
    for level in range(min(levels, MAX_PROBES)):
        values = _values_at(dims, level)
        if tuple(sorted(values.items())) in seen:
            continue
        seen.add(tuple(sorted(values.items())))
        for i in inputs:
            if i.shape is None and i.name not in spec.tensors:
                V._resolve_one(i, {})  # rank unknown: the error says to give it with --shape
        shapes = _shapes_at(inputs, spec, values)
        cand = V.ShapeSpec(tensors=shapes, dims={k: v for k, v in values.items() if "[" not in k})
        if skeleton is None:
            skeleton = _skeleton(model)
        est = estimate_bytes(skeleton, shapes, dtypes)
        label = ", ".join(f"{k}={v}" for k, v in values.items() if dims[k].fixed is None) or "given shapes"
        if est > budget:
            tried.append(f"{label}: needs ~{fmt_bytes(est)}, over the memory budget of {fmt_bytes(budget)}")
            continue
        feeds = V._synthesize(model, inputs, cand, seed)
        try:
            result = probe(feeds) if probe else None
        except InputSpecError as e:
            first_error = first_error or e
            tried.append(f"{label}: {_short(e.message)}")
            if not [d for d in dims.values() if d.fixed is None]:
                raise
            continue
        choices = [DimChoice(k, d.role, values[k], d.why if level == 0 or d.fixed is not None else
                             f"{d.why}; smaller after {len(tried)} failed try(s)") for k, d in dims.items()]
        return InputPlan(feeds, choices, tried, "--shape" if spec.tensors or spec.dims else "discovered",
                         est, budget), result
    free = [k for k, d in dims.items() if d.fixed is None]
    last = tried[-1] if tried else "no candidate"
    flags = sorted({k if not re.search(r"\[\d+\]$", k) else k.rsplit("[", 1)[0] for k in free})
    raise InputSpecError(
        f"no input shapes found that the original model runs on ({len(tried)} tried; last: {last})",
        hint=("give them with " + " ".join(f"--shape {f}=N" if f in dims else f"--shape {f}:DIMS" for f in flags))
        if free else "check --shape / --inputs") from first_error


# ---- shape profiles -----------------------------------------------------------------------------------------


@dataclass
class Profile:
    """A named set of shapes the model is deployed at (prefill, decode), with its weight in measured
    selection's total."""

    name: str
    spec: V.ShapeSpec
    weight: float = 1.0


_PROFILE = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*:(.*?)(?:@\s*([0-9.]+))?\s*$")


def parse_profiles(texts: list[str]) -> list[Profile]:
    """`NAME:DIM=V,DIM=V[@WEIGHT]`; an item may also be a whole input shape `INPUT:AxBxC`. Repeatable."""
    out: list[Profile] = []
    for text in texts:
        m = _PROFILE.match(text)
        if not m or not m.group(2).strip():
            raise InputSpecError(f"invalid --profile '{text}'",
                                 hint="use NAME:DIM=V,DIM=V[@WEIGHT], e.g. decode:sequence=1,past_sequence=127@4")
        name, body, weight = m.group(1), m.group(2), m.group(3)
        if any(p.name == name for p in out):
            raise InputSpecError(f"--profile '{name}' given twice")
        try:
            spec = V.parse_shape_specs([item for item in body.split(",") if item.strip()])
            w = float(weight) if weight else 1.0
        except ValueError as e:
            raise InputSpecError(f"invalid --profile '{text}': {e}") from e
        if w <= 0:
            raise InputSpecError(f"invalid --profile '{text}': the weight must be positive")
        out.append(Profile(name, spec, w))
    return out


def _merged(user: V.ShapeSpec, profile: V.ShapeSpec) -> V.ShapeSpec:
    return V.ShapeSpec(tensors={**user.tensors, **profile.tensors}, dims={**user.dims, **profile.dims})


def default_profiles(model: onnx.ModelProto, spec: V.ShapeSpec) -> list[Profile]:
    """Decoders with a KV cache: prefill (the discovered length, empty cache) and decode (one new token after
    a cache one short of that length), weighted equally. None for other models, or when the user fixed the
    cache length."""
    inputs = V.model_inputs(model)
    if any(i.shape is None for i in inputs):
        return []
    dims = _plan_dims(model, inputs, spec, V.BATCH_DEFAULT)
    past = [k for k, d in dims.items() if d.role == "past" and d.fixed is None]
    seq = [k for k, d in dims.items() if d.role == "seq" and d.fixed is None]
    if not past or len(seq) != 1:
        return []
    n = dims[seq[0]].ladder[0]
    return [Profile("prefill", V.ShapeSpec(dims={seq[0]: n, **{p: 0 for p in past}})),
            Profile("decode", V.ShapeSpec(dims={seq[0]: 1, **{p: n - 1 for p in past}}))]


def discover_profiles(model: onnx.ModelProto, probe: Callable[[dict], object] | None, spec: V.ShapeSpec,
                      npz_path: str | None, profiles: list[Profile] | None,
                      budget_bytes: int | None = None) -> list[tuple[Profile, InputPlan, object]]:
    """One plan per profile (the user's, or the defaults for a KV-cache decoder; else one plan named
    'default'). A default profile the original cannot run falls back to the plain discovered shapes."""
    def single() -> list[tuple[Profile, InputPlan, object]]:
        plan, result = discover(model, probe, spec, npz_path, budget_bytes=budget_bytes)
        return [(Profile("default", spec), plan, result)]

    if npz_path is not None:
        return single()
    chosen = profiles or default_profiles(model, spec)
    out: list[tuple[Profile, InputPlan, object]] = []
    for p in chosen:
        try:
            plan, result = discover(model, probe, _merged(spec, p.spec), budget_bytes=budget_bytes)
        except InputSpecError:
            if profiles:
                raise
            return single()  # the default profiles do not fit this export: its plain shapes then
        out.append((p, plan, result))
    return out or single()


def at_batch(model: onnx.ModelProto, plan: InputPlan, batch: int, seed: int = 0) -> dict[str, np.ndarray] | None:
    """The plan's inputs with every batch dim set to `batch` (timing runs batch 1); None when the plan has no
    batch dim or did not choose every dim itself."""
    if plan.source == "--inputs" or not any(d.role == "batch" for d in plan.dims):
        return None
    values = {d.key: batch if d.role == "batch" else d.value for d in plan.dims}
    inputs = V.model_inputs(model)
    try:
        shapes = _shapes_at(inputs, V.ShapeSpec(), values)
    except KeyError:  # a --shape tensor fixed some input
        return None
    spec = V.ShapeSpec(tensors=shapes, dims={k: v for k, v in values.items() if "[" not in k})
    return V._synthesize(model, inputs, spec, seed)
