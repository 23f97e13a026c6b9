"""optimize(): load -> rewrite (match, apply, fold; to a fixed point) -> validate (roll back what fails) ->
measured selection -> write -> Result. Each step is a function below; this module only sequences them."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import onnx

from .errors import InputSpecError, ModelError, OnnxfuseError, write_error
from .inputs import InputPlan, discover_profiles, parse_profiles, parse_shape_specs
from .inputs.static_shapes import fix_input_shapes
from .ir import Model
from .load.collisions import check_writes
from .load.freeze import freeze_weights
from .load.loader import LoadInfo, load_model
from .load.write import approx_bytes, drop_unused_initializers, save_model
from .measure.lock import timing_lock
from .opschema import RUNTIME_DOMAINS
from .options import OptimizeOptions, check_strings, check_target
from .patterns.rules import Rule
from .progress import Phase, quiet
from .result import Result, op_counts
from .rewrite.engine import EngineOptions, RuleSkip, run
from .rewrite.rebuild import Rewritten, defined_ops_only
from .rewrite.ruleset import builtin_patterns_dir, load_rules
from .select.decision_cache import DecisionCache
from .select.region_select import region_selection
from .select.report import MeasureReport
from .targets import HOST, available, get, kernel_issue, missing_note, runs_on
from .tensors import iter_nodes
from .validate.compare import OutputCheck
from .validate.facts import facts
from .validate.rollback import Rollback, validate_with_rollback
from .validate.runtime import make_session, peak_rss_bytes, resolve_threads
from .validate.runtime import run as run_session
from .validate.validate import Validator

__all__ = ["find_inputs", "find_profiles", "optimize"]


def optimize(model: str | os.PathLike | onnx.ModelProto, output_path: str | os.PathLike | None = None,
             options: OptimizeOptions | None = None, progress: Phase | None = None) -> Result:
    """Optimize a model (a path, or a ModelProto in memory) and return what was done; `Result.model` is the
    optimized ModelProto. With `output_path` it is also written there, atomically (a model that fails
    validation is never written). Raises OnnxfuseError (one line a user can act on) for bad input.
    `progress(phase, budget_s=None)` is called as each phase starts (see progress.py)."""
    opts = options or OptimizeOptions()
    if not isinstance(opts.measure_threads, int):  # "auto": the number, everywhere
        opts = replace(opts, measure_threads=resolve_threads(opts.measure_threads, "measure_threads"))
    opts = opts.check()
    out = None if output_path is None else os.fspath(output_path)
    if out is not None and os.path.isdir(out) and not isinstance(model, onnx.ModelProto):
        out = os.path.join(out, os.path.basename(os.fspath(model)))  # an existing folder: OUT/<input's name>
    with _source(model, opts, out) as (shown, path, notes, opts):
        result = _optimize(shown, path, out, opts, progress or quiet)
        result.load_notes[:0] = notes
        return result


@contextlib.contextmanager
def _source(model: str | os.PathLike | onnx.ModelProto, opts: OptimizeOptions,
            out: str | None) -> Iterator[tuple[str, str, list[str], OptimizeOptions]]:
    """(name shown, file optimized, notes for the report, options): a ModelProto is saved to a temporary file
    (onnxruntime and rebuilds read files); with --static the file is a copy with its dynamic input dims fixed, and
    the options' shapes become one NAME:DIMS per input (the copy has no named dims for a DIM=V); with
    --freeze-weights, one without the graph inputs that are initializers."""
    try:
        tmp = tempfile.mkdtemp(prefix="onnxfuse-")
    except OSError as e:
        raise write_error(e, "a working copy of the model") from None
    notes: list[str] = []
    try:
        if isinstance(model, onnx.ModelProto):
            shown, path = "<ModelProto>", os.path.join(tmp, "model.onnx")
            big = approx_bytes(model) > 2**31 - 2**24
            try:
                onnx.save(model, path, save_as_external_data=big, location="model.onnx.data" if big else None)
            except OSError as e:
                raise write_error(e, "the ModelProto to a file onnxruntime reads") from None
        else:
            shown = path = os.fspath(model)
        if opts.static:
            _check_paths(path, None if opts.dry_run else out, opts.force)
            static_dir = os.path.join(tmp, "static")
            os.mkdir(static_dir)
            try:
                path, shapes = fix_input_shapes(path, opts.shapes, static_dir)
            except OSError as e:
                raise write_error(e, "the copy with fixed input shapes") from None
            opts = replace(opts, shapes=shapes)
        if opts.freeze_weights:
            _check_paths(path, None if opts.dry_run else out, opts.force)
            frozen_dir = os.path.join(tmp, "frozen")
            os.mkdir(frozen_dir)
            try:
                path, n = freeze_weights(path, frozen_dir)
            except OSError as e:
                raise write_error(e, "the copy with frozen weights") from None
            if n:
                notes.append(f"{n} initializer(s) listed as graph inputs made constants (freeze_weights): the output "
                             "no longer takes them as inputs")
        yield shown, path, notes, opts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str, progress: Phase = quiet,
           budget_s: float | None = None) -> Iterator[None]:
    progress(phase, budget_s)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = time.perf_counter() - t0


@dataclass
class _Loaded:
    """The input model as loaded, with what validating it needs."""

    model: Model
    info: LoadInfo
    before: dict[str, int]
    provider: str  # the target validation and measuring run on (its runs_elsewhere when its provider is missing)
    note: str
    validator: Validator | None


def _optimize(shown: str, path: str, out: str | None, opts: OptimizeOptions, progress: Phase) -> Result:
    timings: dict[str, float] = {}
    with _timed(timings, "patterns", progress):
        extra = [os.path.join(builtin_patterns_dir(), "optional", "pad_channels.yaml")] if opts.pad_channels else []
        rules = load_rules(extra + list(opts.patterns), opts.builtin, opts.only, opts.skip)
    _check_paths(path, None if opts.dry_run else out, opts.force)
    with _timed(timings, "load", progress):
        loaded = _load(path, opts)
    with _timed(timings, "rewrite", progress):
        rules, base, state = _rewrite(loaded, rules, opts)
    deny: set[tuple[str, str]] = set()
    with _timed(timings, "validate", progress):
        state, status, checks, rolled_back = _validate(path, rules, base, deny, state, loaded, opts)
    measured: MeasureReport | None = None
    if opts.measure and state.eng.applications:
        assert loaded.validator is not None
        with timing_lock(timings, waiting=lambda: progress("waiting for the timing lock: another onnxfuse is timing")), \
                _timed(timings, "measure", progress, opts.measure_budget_s):  # one at a time
            # what the run took so far, and the validation of the kept selection still to come (about as long)
            measured, state = _measure(path, rules, opts, base, deny, state, loaded.validator,
                                       rewrite_s=timings.get("rewrite", 0.0), progress=progress)
    written: list[str] = []
    drop_unused_initializers(state.proto.graph)  # what the rewrites left unread (the Result's model is the file's)
    if out is not None and not opts.dry_run:
        with _timed(timings, "write", progress):
            big = approx_bytes(state.proto) > 2**31 - 2**24
            written = save_model(state.proto, out, loaded.model.base_dir,
                                 external=state.info.external_data or big,
                                 lazy_location=os.path.basename(state.info.path) if state.info.lazy else None)
    return _result(shown, out, opts, loaded, state, status, checks, rolled_back, measured, timings, written)


def _measure(path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions, deny: set[tuple[str, str]],
             state: Rewritten, validator: Validator, rewrite_s: float = 0.0,
             progress: Phase = quiet) -> tuple[MeasureReport, Rewritten]:
    """Measured selection on the target (select/region_select.py); `rewrite_s`: what rewriting took."""
    if not available(opts.target):
        return MeasureReport(opts.target, opts.measure_threads, 0,
                             note=f"not measured: {missing_note(opts.target)}"), state
    cache = DecisionCache(enabled=opts.cache)
    report, state = region_selection(path, rules, opts, base, deny, state, validator, cache, rewrite_s,
                                     progress)
    report.warnings.extend(cache.warnings)  # the cache never fails a run: what it left out is said
    return report, state


def _load(path: str, opts: OptimizeOptions) -> _Loaded:
    model, info = load_model(path)
    before = dict(op_counts(model.proto))  # the engine edits node protos in place: count first
    unknown = unknown_ops(model.proto)
    if opts.validate and unknown:
        raise OnnxfuseError(f"{path}: ops with no known schema ({', '.join(unknown[:3])}): onnxruntime cannot "
                            "run the model, so it cannot be validated", hint="pass --no-validate to rewrite it anyway")
    provider = runs_on(opts.target)
    note = "" if provider == opts.target else f" on {get(provider).label} ({missing_note(opts.target)})"
    validator = Validator(path, model.proto, opts, provider) if opts.validate or opts.measure else None
    return _Loaded(model, info, before, provider, note, validator)


def _rewrite(loaded: _Loaded, rules: list[Rule], opts: OptimizeOptions) -> tuple[list[Rule], EngineOptions,
                                                                                    Rewritten]:
    """Rules to a fixed point on the loaded model. Rules whose ops could not be validated here are held back; a
    rewrite leaving an op the model's opset does not define is left out (rebuild.defined_ops_only)."""
    held_back: list[RuleSkip] = []
    if opts.validate and loaded.provider != opts.target:  # fused ops with no kernel where it validates cannot be
        here, there = get(loaded.provider).label, get(opts.target).label  # validated
        for r in rules:
            ops = [f"{d}.{o}" for d, o in r.output_ops()
                   if kernel_issue(d, o, loaded.provider) and opts.target in r.targets]
            if ops:
                held_back.append(RuleSkip(r.id, f"{', '.join(ops)} has no {here} kernel and no {there} execution "
                                                "provider is installed to validate it (--no-validate applies it "
                                                "unchecked)"))
        rules = [r for r in rules if r.id not in {h.rule for h in held_back}]
    model, info = loaded.model, loaded.info
    base = EngineOptions(target=opts.target, fold=opts.fold)
    if loaded.validator is not None:
        try:
            base = facts(loaded.validator, model, info, opts.target, opts.fold)
        except InputSpecError:
            # no inputs the original runs on: the rules rewrite without what runs would show; if one fires,
            # validation needs those inputs and says so in one line; if none does, nothing needs them
            pass
    state = defined_ops_only(info.path, rules, base, set(), Rewritten(model, info, run(model, rules, replace(base))))
    state.eng.skipped.extend(held_back)
    return rules, base, state


def _validate(path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]], state: Rewritten,
              loaded: _Loaded, opts: OptimizeOptions) -> tuple[Rewritten, str, list[OutputCheck], list[Rollback]]:
    """(state after rollbacks, status line, per-output checks, rollbacks)."""
    if not opts.validate:
        return state, "skipped (--no-validate)", [], []
    if not state.eng.applications and not state.info.repairs:  # repaired: check the copy is still exact
        return state, "not needed: nothing was rewritten", [], []
    assert loaded.validator is not None
    missing = unvalidatable_ops(state.proto, loaded.provider) if loaded.provider != opts.target else []
    if missing:
        return state, (f"not run: {', '.join(missing)} have no {get(loaded.provider).label} kernel and no "
                       f"{get(opts.target).label} execution provider is installed"), [], []
    state, outcome, rolled_back = validate_with_rollback(path, rules, base, deny, state, loaded.validator)
    status = "passed" + loaded.note + (f" after rolling back {len(rolled_back)} rewrite(s)" if rolled_back else "")
    status += "".join(f"; note: {n}" for n in outcome.notes)
    return state, status, outcome.checks, rolled_back


def _result(shown: str, out: str | None, opts: OptimizeOptions, loaded: _Loaded, state: Rewritten, status: str,
            checks: list[OutputCheck], rolled_back: list[Rollback], measured: MeasureReport | None,
            timings: dict[str, float], written: list[str]) -> Result:
    after = op_counts(state.proto)
    v = loaded.validator
    return Result(
        input=shown, output=None if opts.dry_run else out, target=opts.target,
        nodes_before=sum(loaded.before.values()), nodes_after=sum(after.values()),
        ops_before=loaded.before, ops_after=dict(after), applications=state.eng.applications,
        skipped=state.eng.skipped, rolled_back=rolled_back, checks=checks, validation=status, timings=timings,
        written=written, sweeps=state.eng.sweeps, measure=measured, repairs=list(state.info.repairs),
        load_notes=list(state.info.notes), inputs=v.plan if v is not None else None,
        profiles=v.profiles() if v is not None else [], peak_rss_bytes=peak_rss_bytes(), model=state.proto,
        warnings=list(state.eng.warnings) + (list(measured.warnings) if measured is not None else []))


def _check_paths(input_path: str, output_path: str | None, force: bool) -> None:
    if output_path is None:
        return
    if os.path.isdir(output_path):
        raise ModelError(f"{output_path}: is a directory, expected an output .onnx file path",
                         hint="a model given as a ModelProto has no file name: name the output file")
    if os.path.exists(output_path) and os.path.exists(input_path) and os.path.samefile(input_path, output_path):
        if not force:
            raise ModelError(f"{output_path}: output is the input model; refusing to overwrite it",
                             hint="pass --force to overwrite")
    out_dir = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(out_dir):
        raise ModelError(f"{output_path}: output folder {out_dir} does not exist")
    if not os.access(out_dir, os.W_OK):
        raise ModelError(f"{output_path}: output folder {out_dir} is not writable")
    check_writes([(input_path, output_path)], force)  # never the input's data files, nor the input unless forced


def unknown_ops(proto: onnx.ModelProto) -> list[str]:
    """Ops from domains with no schema anywhere (not ONNX, not onnxruntime's, not a model-local function)."""
    local = {(f.domain, f.name) for f in proto.functions}
    return sorted({f"{n.domain}:{n.op_type}" for n in iter_nodes(proto.graph)
                   if n.domain not in RUNTIME_DOMAINS and (n.domain, n.op_type) not in local})


def unvalidatable_ops(proto: onnx.ModelProto, provider: str) -> list[str]:
    """Contrib ops in `proto` with no kernel on `provider`."""
    missing = []
    for op in op_counts(proto):
        domain, _, name = op.rpartition(".")
        if domain and kernel_issue(domain, name, provider):
            missing.append(op)
    return missing


def find_inputs(model: str | os.PathLike, shapes: list[str] | None = None, inputs_npz: str | None = None,
                target: str = HOST, probe: bool = True, budget_bytes: int | None = None,
                profiles: list[str] | None = None) -> InputPlan:
    """The inputs `optimize` would validate and measure on first (`Result.inputs`), and why: discovered from the
    model (see inputs/discover.py) and, with `probe`, settled by running the original on the target's provider.
    A KV-cache decoder has more than one shape profile: `find_profiles` gives every one."""
    return find_profiles(model, shapes, inputs_npz, target, probe, budget_bytes, profiles)[0][2]


def find_profiles(model: str | os.PathLike, shapes: list[str] | None = None, inputs_npz: str | None = None,
                  target: str = HOST, probe: bool = True, budget_bytes: int | None = None,
                  profiles: list[str] | None = None) -> list[tuple[str, float, InputPlan]]:
    """(name, weight, inputs) of every shape profile `optimize` would validate and measure on (`Result.profiles`):
    prefill and decode for a decoder with a KV cache, the `profiles` given (texts as `--profile` takes them),
    else one named 'default'."""
    check_target("target", target)
    shapes = check_strings("shapes", shapes)
    chosen = parse_profiles(check_strings("profiles", profiles)) or None
    path = os.fspath(model)
    loaded, _ = load_model(path)
    spec = parse_shape_specs(shapes)
    run_on = None
    if probe:
        sess = make_session(path, "disable", runs_on(target), arena=False)

        def run_on(feeds: dict) -> dict:
            return run_session(sess, feeds)
    found = discover_profiles(loaded.proto, run_on, spec, inputs_npz, chosen, budget_bytes=budget_bytes)
    return [(p.name, p.weight, plan) for p, plan, _ in found]
