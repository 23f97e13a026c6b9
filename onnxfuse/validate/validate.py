"""The validator: the original model's outputs are the reference, and a candidate passes when every check in
CHECKS passes on the inputs of every shape profile. To add a check, write a function taking (validator,
candidate) and returning an Outcome on failure (None when it passes), and append it to CHECKS."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import InputSpecError, OnnxfuseError
from ..inputs import (
    InputPlan,
    Profile,
    at_dims,
    check_names,
    discover_profiles,
    parse_profiles,
    timing_feeds,
)
from ..inputs.shapes import ShapeSpec, model_inputs, parse_shape_specs
from ..load.loader import LoadInfo, checker_error, infer_types
from ..options import OptimizeOptions
from ..tensors import TensorType
from .compare import OutputCheck, Tolerance, compare_outputs, default_tolerance
from .precision import JITTER, NOISE_FACTOR, graph_precision, jittered
from .runtime import Candidate, failing_node, make_session, release_memory, run, session_with_outputs

__all__ = ["CHECKS", "Outcome", "ProfileRun", "Validator"]

OBSERVE_CHUNK = 256  # values fetched per run of the original when observing shapes, at most
OBSERVE_FIRST = 32  # in the first run; then as many as fit OBSERVE_BYTES by the bytes the last run returned
OBSERVE_BYTES = 256 * 2**20  # the values one observing run returns, about
OBSERVE_MAX = 2048  # values observed in all
OBSERVE_BUDGET_S = 5.0  # runs of the original spent on observing, at most (by the slowest reference run's time)


@dataclass
class Outcome:
    """What validating one candidate found."""

    ok: bool
    checks: list[OutputCheck]  # per output, at ORT_DISABLE_ALL on the first profile
    reason: str = ""  # why it failed
    notes: list[str] = field(default_factory=list)
    node: str = ""  # the node the failure names (onnxruntime's or onnx.checker's message), if any


@dataclass
class ProfileRun:
    """One shape profile the validator checks: its inputs and the original's outputs on them."""

    profile: Profile
    plan: InputPlan
    reference: dict  # at ORT_DISABLE_ALL
    at_all: dict | None = None  # at ORT_ENABLE_ALL, computed when needed


class Validator:
    """Reference outputs from the original at ORT_DISABLE_ALL; candidates checked by CHECKS on the inputs of every
    shape profile (one unless the user gave --profile or the model is a KV-cache decoder)."""

    def __init__(self, input_path: str, proto: onnx.ModelProto, opts: OptimizeOptions, provider: str) -> None:
        self.provider = provider
        self.input_path = input_path
        self.user_inputs = bool(opts.shapes or opts.inputs_npz)
        self.spec = parse_shape_specs(opts.shapes) if opts.shapes else ShapeSpec()
        self.user_profiles = parse_profiles(opts.profiles) if opts.profiles else None
        self.npz = opts.inputs_npz
        # a shape or profile naming no input or dim of the model fails now, before any rewriting
        check_names(proto, self.spec if self.npz is None else ShapeSpec(), self.user_profiles)
        self.proto = proto  # the original: input discovery reads its graph inputs and tables
        self._runs: list[ProfileRun] | None = None
        self.session_s = 0.0  # creating the reference session of the original (what measuring can expect)
        self.run_s = 0.0  # its slowest run at ORT_DISABLE_ALL, probing included
        self.tolerance = (Tolerance(opts.rtol if opts.rtol is not None else 1e-4,
                                    opts.atol if opts.atol is not None else 1e-4)
                          if opts.rtol is not None or opts.atol is not None else None)
        # why the tolerance is what it is, when the graph's precision set it (precision.py); settled on first check
        self.tolerance_note = ""
        self._tolerance_settled = self.tolerance is not None

    @property
    def runs(self) -> list[ProfileRun]:
        """The profiles with the original's outputs at ORT_DISABLE_ALL (computed on first use). The first call
        settles the inputs: discovered from the model and probed on it (see inputs/discover.py)."""
        if self._runs is None:
            t = time.perf_counter()
            ref = make_session(self.input_path, "disable", self.provider, arena=False)
            self.session_s = time.perf_counter() - t

            def timed_run(feeds: dict) -> dict:
                t = time.perf_counter()
                out = run(ref, feeds)
                self.run_s = max(self.run_s, time.perf_counter() - t)
                return out

            self._runs = [ProfileRun(p, plan, out) for p, plan, out in discover_profiles(
                self.proto, timed_run, self.spec, self.npz, self.user_profiles)]
            del ref
            release_memory()
        return self._runs

    @property
    def plan(self) -> InputPlan | None:
        """The first profile's inputs (None before anything ran)."""
        return self._runs[0].plan if self._runs else None

    def profiles(self) -> list[tuple[str, float, InputPlan]]:
        """(name, weight, inputs) of every profile that ran; [] before anything ran."""
        return [(r.profile.name, r.profile.weight, r.plan) for r in self._runs or []]

    def check(self, proto: onnx.ModelProto, info: LoadInfo) -> Outcome:
        """Run CHECKS on the candidate in order; the first failure is the outcome."""
        _ = self.runs  # first: it settles the inputs
        self._settle_tolerance(info)
        cand = Candidate(proto, info)
        try:
            notes: list[str] = [self.tolerance_note] if self.tolerance_note else []
            checks: list[OutputCheck] = []
            for check in CHECKS:
                out = check(self, cand, proto)
                if out is not None and not out.ok:
                    return out
                if out is not None:
                    notes.extend(out.notes)
                    checks = checks or out.checks
            return Outcome(True, checks, "", notes)
        finally:
            cand.close()
            release_memory()  # the candidate's sessions are gone: the next export or write starts lower

    def _settle_tolerance(self, info: LoadInfo) -> None:
        """The tolerance from the precision the original computes in (precision.py), unless the user gave one."""
        if self._tolerance_settled:
            return
        self._tolerance_settled = True
        p = graph_precision(self.proto)
        if p.quantizers:
            noise = self._jitter_noise(info)
            if noise is not None:
                t = max(1e-4, NOISE_FACTOR * noise)
                self.tolerance = Tolerance(rtol=t, atol=t)
                self.tolerance_note = (
                    f"tolerance {t:.2g}: the graph quantizes at run time ({p.quantizers} quantizer(s)), where a "
                    f"reordered float32 sum can move a value by a whole step; the original itself moves by up to "
                    f"{noise:.2g} when its quantizers' inputs change by {JITTER:.1g} (x{NOISE_FACTOR:g})")
                return
        if p.narrow:
            self.tolerance = default_tolerance(getattr(onnx.TensorProto, p.narrow.upper()))
            self.tolerance_note = (f"tolerance {self.tolerance.rtol:g}: the graph computes in {p.narrow} inside "
                                   "(its float outputs are rounded through it)")

    def _jitter_noise(self, info: LoadInfo) -> float | None:
        """The largest change (as |diff| / (1 + |ref|)) of any float output when every quantizer's input is
        jittered up or down (precision.jittered), over all profiles; None when it cannot be run."""
        inferred = infer_types(self.proto)
        types = {t.name: t.data_type for t in self.proto.graph.initializer}
        for vi in (list(inferred.graph.value_info) + list(inferred.graph.input) if inferred is not None else []):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        noise = 0.0
        for sign in (1, -1):
            cand = Candidate(jittered(self.proto, types, sign), info)
            try:
                sess = make_session(cand.source, "disable", self.provider, arena=False)
                for r in self.runs:
                    got = run(sess, r.plan.feeds)
                    noise = max([noise] + [c.min_tolerance for c in compare_outputs(r.reference, got)
                                           if not math.isnan(c.min_tolerance)])
                del sess
            except OnnxfuseError:
                return None
            finally:
                cand.close()
        return noise

    def observed_types(self, proto: onnx.ModelProto, info: LoadInfo, names: list[str]) -> dict[str, TensorType]:
        """Types of main-graph values shape inference left without a shape (a Reshape target computed from Shape
        at opset 12, say), as the original computes them on the validation and timing inputs: the element type
        and rank; each dim that is the same in both runs is that number, and one that takes the values a dynamic
        input dim takes is that dim (its name; another varying dim gets a name of its values). The second run
        halves every dynamic input dim (1 becomes 2; a quarter of the memory where two dims halve), or, where the
        model refuses that, doubles it; an empty one, a past of length 0, stays empty, so sums such as past + new
        stay consistent. So a rule sees what the
        model fixes, never a size of this run: a dim the model derives by striding (224 -> 7 at stride 32) moves
        too, where a move by one (223 -> 7) would not show it. Where the model refuses both, the timing inputs
        are the second run; a dim equal to a dynamic input dim's value in both is taken to be that dim, and, if
        some dynamic input dim kept its size there, a dim the same in both runs is not taken as fixed.
        At most OBSERVE_MAX values, up to OBSERVE_CHUNK (and about OBSERVE_BYTES) per run, and about
        OBSERVE_BUDGET_S seconds of runs (the values nearest the inputs first); {} when the original cannot be run so."""
        if not names:
            return {}  # nothing to observe: the original is not run for it
        _ = self.runs  # settles the inputs and times the original's runs
        # chunks of a run and a second run at up to twice each dim (up to 4x the work where two dims double)
        runs_allowed = max(1, int(OBSERVE_BUDGET_S / max(self.run_s, 1e-3)) // 5)
        names = names[:min(OBSERVE_MAX, runs_allowed * OBSERVE_CHUNK)]
        plan = self.runs[0].plan
        # a second run with every dynamic dim halved (else doubled) shows what follows the inputs; where the model
        # refuses both (dims tied: past + new, a position table), the timing inputs (another batch) are the second
        feeds_sets = [plan.feeds]
        seen: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        try:
            with session_with_outputs(proto, info, names, self.provider) as sess:
                for move in (lambda d: d.value // 2 if d.value > 1 else 2 * d.value, lambda d: 2 * d.value):
                    moved = at_dims(self.proto, plan, move)
                    if moved is None:
                        break
                    try:
                        sess.run(names[:1], moved)
                    except Exception:  # noqa: BLE001
                        continue
                    feeds_sets.append(moved)
                    break
                if len(feeds_sets) == 1:
                    feeds_sets += [f for _, f in self.timing_profiles()[:1]]
                # chunks sized by the bytes the last one returned (a doubled run returns up to 4x the values'
                # bytes), and no more runs than the time allows: the values nearest the inputs come first
                k, size, t0 = 0, OBSERVE_FIRST, time.perf_counter()
                while k < len(names) and (k == 0 or time.perf_counter() - t0 < OBSERVE_BUDGET_S):
                    chunk, biggest = names[k:k + size], 0
                    for feeds in feeds_sets:
                        got = [np.asarray(a) for a in sess.run(chunk, feeds)]
                        biggest = max(biggest, sum(a.nbytes for a in got))
                        for v, a in zip(chunk, got, strict=True):
                            seen.setdefault(v, []).append((onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
                        del got
                    k += len(chunk)
                    size = max(1, min(OBSERVE_CHUNK, int(OBSERVE_BYTES * len(chunk) / max(biggest, 1))))
        except Exception:  # noqa: BLE001 - a value onnxruntime cannot return (bfloat16, a sequence): no shapes
            return {}
        return _types_seen(self.proto, feeds_sets, seen)

    def at_all(self, r: ProfileRun) -> dict:
        """The original's outputs at ORT_ENABLE_ALL on a profile's inputs."""
        if r.at_all is None:
            r.at_all = run(make_session(self.input_path, "all", self.provider, arena=False), r.plan.feeds)
        return r.at_all

    def timing_profiles(self) -> list[tuple[float, dict]]:
        """(weight, feeds) per profile for measured selection: batch 1 (the usual deployment; validation runs
        batch 2, which exposes batch-broadcasting bugs) unless the user gave the inputs."""
        return [(r.profile.weight, timing_feeds(self.proto, r.plan, self.user_inputs)) for r in self.runs]

    def branch_values(self, proto: onnx.ModelProto, info: LoadInfo) -> dict[str, bool]:
        """The condition of each top-level If (by the condition's value name) on the validation inputs and on
        the timing inputs, where all agree: the branch that validation checks and timing measures.
        Run on the original at ORT_DISABLE_ALL with the conditions as extra outputs; {} when it has none."""
        g = proto.graph
        fixed = {i.name for i in g.input} | {t.name for t in g.initializer}
        conds = list(dict.fromkeys(n.input[0] for n in g.node if n.op_type == "If" and n.domain in ("", "ai.onnx")
                                   and n.input and n.input[0] not in fixed))
        if not conds:
            return {}
        feeds_sets = [r.plan.feeds for r in self.runs] + [f for _, f in self.timing_profiles()]
        try:
            with session_with_outputs(proto, info, conds, self.provider) as sess:
                results = [run(sess, feeds) for feeds in feeds_sets]
        except (OnnxfuseError, InputSpecError):
            return {}
        values: dict[str, bool] = {}
        for c in conds:
            seen = {bool(r[c].reshape(-1)[0]) for r in results if c in r and r[c].size == 1}
            if len(seen) == 1:
                values[c] = seen.pop()
        return values


# ---- the checks ---------------------------------------------------------------------------------------------

Check = Callable[[Validator, Candidate, onnx.ModelProto], "Outcome | None"]


def checker_accepts(v: Validator, cand: Candidate, proto: onnx.ModelProto) -> Outcome | None:
    """onnx.checker accepts the candidate. It runs on a weightless copy (the large initializers as typed inputs):
    the checker serializes what it is given, and onnxruntime, which loads the whole candidate next, is the check
    of the weights themselves."""
    error = checker_error(proto)
    if error:
        return Outcome(False, [], f"onnx.checker rejects the model: {error.splitlines()[0]}",
                       node=failing_node(error))
    return None


def _after_label(message: str) -> str:
    """make_session's "onnxruntime cannot load <temporary path>: why" and run's "onnxruntime failed to run the
    model: why" without their first part (the caller says what failed)."""
    heads = ("onnxruntime cannot load ", "onnxruntime failed to run ")
    message = message.split(": ", 1)[1] if message.startswith(heads) and ": " in message else message
    return re.sub(r"Load model from \S+ failed: ?", "", message)  # the candidate's temporary path says nothing


def _matches_at(level: str) -> Check:
    def matches(v: Validator, cand: Candidate, proto: onnx.ModelProto) -> Outcome | None:
        """onnxruntime loads and runs the candidate at this level, and every output matches the original's."""
        try:  # the step that failed is named: a file onnxruntime cannot load is not a numeric failure
            sess = make_session(cand.source, level, v.provider, arena=False)
        except OnnxfuseError as e:
            return Outcome(False, [], f"onnxruntime cannot load the rewritten model at ORT level {level}: "
                                      f"{_after_label(e.message)}", node=failing_node(e.message))
        try:
            outs = [run(sess, r.plan.feeds) for r in v.runs]
        except OnnxfuseError as e:
            return Outcome(False, [], f"onnxruntime cannot run the rewritten model at ORT level {level}: "
                                      f"{_after_label(e.message)}", node=failing_node(e.message))
        finally:
            del sess  # one session at a time: big models must not be held twice
        notes: list[str] = []
        first: list[OutputCheck] = []
        for r, got in zip(v.runs, outs, strict=True):
            where = f" ({r.profile.name} profile)" if len(v.runs) > 1 else ""
            checks = compare_outputs(r.reference, got, v.tolerance)
            bad = [c for c in checks if not c.passed]
            if bad and level == "all":
                # onnxruntime's own optimizations may change the original's outputs too: then the fair
                # reference at this level is the original at this level
                own = compare_outputs(v.at_all(r), got, v.tolerance)
                if all(c.passed for c in own):
                    notes.extend(f"onnxruntime's ORT_ENABLE_ALL changes output {c.name!r} of the original model "
                                 f"too{where} (max abs {c.max_abs:.3g}); compared against the original at that "
                                 "level" for c in bad)
                    bad = []
            if bad:
                c = bad[0]
                return Outcome(False, checks, f"output {c.name!r} differs at ORT level {level}{where}: max abs "
                                              f"{c.max_abs:.3g}, needs tolerance {c.min_tolerance:.3g} (allowed "
                                              f"rtol {c.tolerance.rtol:g}, atol {c.tolerance.atol:g})"
                                              + (f"; {c.note}" if c.note else ""))
            first = first or checks
        return Outcome(True, first if level == "disable" else [], "", notes)

    matches.__name__ = f"matches_at_{level}"
    return matches


CHECKS: list[Check] = [checker_accepts, _matches_at("disable"), _matches_at("all")]


def _types_seen(proto: onnx.ModelProto, feeds_sets: list[dict], seen: dict[str, list[tuple[int, tuple[int, ...]]]]
                ) -> dict[str, TensorType]:
    """The types the runs on `feeds_sets` showed for each value (its element type and shape per run): a dim that
    takes the values a dynamic input dim takes is that dim, one the same in every run that number (unless some
    dynamic input dim kept its size too), another a name of its values (Validator.observed_types)."""
    # a dynamic input dim's values over the runs name every dim that takes the same values
    names_by_values: dict[tuple[int, ...], str] = {}
    kept_size = False  # some dynamic input dim has the same size in both runs: a fixed dim proves nothing
    for i in model_inputs(proto):
        for axis, d in enumerate(i.shape or []):
            if not isinstance(d, int) and all(i.name in f and f[i.name].ndim > axis for f in feeds_sets):
                key = tuple(int(f[i.name].shape[axis]) for f in feeds_sets)
                names_by_values.setdefault(key, d if isinstance(d, str) and d else f"{i.name}[{axis}]")
                kept_size |= len(set(key)) == 1 and key[0] != 0  # an empty past stays empty: nothing strides it
    out: dict[str, TensorType] = {}
    for v, runs in seen.items():
        elems, shapes = {e for e, _ in runs}, [s for _, s in runs]
        if len(elems) != 1 or len({len(s) for s in shapes}) != 1:
            continue
        dims = tuple(names_by_values.get(d, d[0] if len(set(d)) == 1 and not kept_size
                                         else f"?{'/'.join(map(str, d))}")
                     for d in zip(*shapes, strict=True))
        out[v] = TensorType(elems.pop(), dims)
    return out
