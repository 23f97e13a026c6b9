"""optimize(): load -> match -> rewrite -> validate (bisect and roll back bad rewrites) -> write -> Result."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

import onnx

from . import validate as V
from .errors import InputSpecError, ModelError, OnnxfuseError
from .inputs import InputPlan, Profile, at_batch, discover, discover_profiles, parse_profiles
from .ir import Model, iter_nodes
from .loader import LoadInfo, _all_tensors, load_model, save_model
from .measure import MeasureReport, Source, group_key, make_time_fn, select, weighted_time_fn
from .patterns.parser import load_path
from .patterns.rules import Rule
from .rewrite.apply import Application
from .rewrite.engine import EngineOptions, EngineResult, NearMiss, RuleSkip, near_misses, run
from .specialize import specialize
from .targets import kernel_issue, provider_registered

MAX_ROLLBACKS = 16  # rewrites found by bisection (each costs about log2(rewrites) validations)
MAX_NAMED_ROLLBACKS = 256  # in all, rewrites whose node onnxruntime names included (one validation each)
MEASURE_MAX_BYTES = 512 * 2**20


def builtin_patterns_dir() -> str:
    """The repo's patterns/ in a source checkout; the wheel's onnxfuse.builtin_patterns when installed."""
    here = Path(__file__).resolve().parent
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "patterns").is_dir():
        return str(here.parent / "patterns")
    return str(resources.files("onnxfuse.builtin_patterns"))


def load_rules(patterns: list[str] | None = None, builtin: bool = True, only: list[str] | None = None,
               skip: list[str] | None = None) -> list[Rule]:
    """Built-in rules (unless builtin=False) then user files in the order given; --only/--skip by id."""
    rules: list[Rule] = []
    if builtin:
        rules.extend(load_path(builtin_patterns_dir(), builtin=True))
    for p in patterns or []:
        if not os.path.exists(p):
            raise OnnxfuseError(f"{p}: no such pattern file or folder")
        rules.extend(load_path(p, order_base=len(rules)))
    ids = {r.id for r in rules}
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise OnnxfuseError(f"{r.span}: error: rule id {r.id!r} is already defined at {seen[r.id].span}")
        seen[r.id] = r
    for flag, names in (("--only", only), ("--skip", skip)):
        for n in names or []:
            if n not in ids:
                raise OnnxfuseError(f"{flag} {n}: no rule with that id", hint="see `onnxfuse patterns list`")
    if only:
        rules = [r for r in rules if r.id in only]
    if skip:
        rules = [r for r in rules if r.id not in skip]
    return rules


@dataclass
class OptimizeOptions:
    patterns: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    builtin: bool = True
    target: str = "cpu"
    validate: bool = True
    shapes: list[str] = field(default_factory=list)
    inputs_npz: str | None = None
    rtol: float | None = None
    atol: float | None = None
    force: bool = False
    dry_run: bool = False
    measure: bool = True
    fold: bool = True  # constant folding and If inlining (exact; --no-fold turns it off)
    pad_channels: bool = False  # also load patterns/optional/pad_channels.yaml
    static: bool = False  # fix dynamic input dims to the --shape values (the output accepts only those)
    profiles: list[str] = field(default_factory=list)  # --profile NAME:DIM=V,...[@WEIGHT] (inputs.py)
    measure_threads: int = 1
    measure_budget_s: float = 2.0  # timing per round (all variants together)


@dataclass
class Rollback:
    rule: str
    root: str
    reason: str
    node: str = ""  # the node onnxruntime (or onnx.checker) named, created by this rewrite; "" if found by bisection


@dataclass
class Result:
    input: str
    output: str | None
    target: str
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    applications: list[Application]
    skipped: list[RuleSkip]
    rolled_back: list[Rollback]
    checks: list[V.OutputCheck]
    validation: str
    timings: dict[str, float]
    written: list[str]
    sweeps: int
    measure: MeasureReport | None = None
    repairs: list[str] = field(default_factory=list)  # harmless defects repaired on load (repair.py)
    load_notes: list[str] = field(default_factory=list)  # what loading noticed and kept
    inputs: InputPlan | None = None  # the shapes validation and measuring ran on, and why (first profile)
    profiles: list[tuple[str, float, InputPlan]] = field(default_factory=list)  # every profile validated
    peak_rss_bytes: int = 0  # of this process, at the end

    @property
    def fired(self) -> dict[str, int]:
        return dict(Counter(a.rule for a in self.applications))

    def to_json(self) -> dict:
        return {
            "schema": "onnxfuse.optimize/1",
            "input": self.input, "output": self.output, "target": self.target,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "fired": self.fired,
            "applications": [asdict(a) for a in self.applications],
            "skipped_rules": [asdict(s) for s in self.skipped],
            "rolled_back": [asdict(r) for r in self.rolled_back],
            "validation": {"status": self.validation,
                           "outputs": [_check_json(c) for c in self.checks]},
            "timings_s": self.timings, "written": self.written, "sweeps": self.sweeps,
            "measure": _measure_json(self.measure),
            "inputs": self.inputs.to_json() if self.inputs is not None else None,
            "profiles": [{"name": n, "weight": w, "inputs": p.to_json()} for n, w, p in self.profiles],
            "peak_rss_bytes": self.peak_rss_bytes,
            "load": {"repairs": self.repairs, "notes": self.load_notes},
        }


def _measure_json(m: MeasureReport | None) -> dict | None:
    if m is None:
        return None
    return {
        "provider": m.provider, "threads": m.threads, "rounds": m.rounds, "seconds": m.seconds, "note": m.note,
        "final_ratio": None if m.final is None else asdict(m.final),
        "final_verdict": None if m.final is None else m.final.verdict_beyond(m.floor),
        "noise_floor": m.floor,
        "denied": [list(k) for k in sorted(m.denied)],
        "dropped_everything": m.dropped_everything,
        "groups": [{"group": g.group, "rules": g.rules, "rewrites": g.rewrites, "kept": g.kept, "gain": g.gain,
                    "with_over_without": None if g.effect is None else asdict(g.effect)} for g in m.groups],
        "strategy": m.strategy,
    }


def _check_json(c: V.OutputCheck) -> dict:
    d = asdict(c)
    d["shape"] = list(c.shape)
    return d


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in iter_nodes(model.graph))


def _check_paths(input_path: str, output_path: str | None, force: bool) -> None:
    if output_path is None:
        return
    if os.path.isdir(output_path):
        raise ModelError(f"{output_path}: is a directory, expected an output .onnx file path")
    if os.path.exists(output_path) and os.path.exists(input_path) and os.path.samefile(input_path, output_path):
        if not force:
            raise ModelError(f"{output_path}: output is the input model; refusing to overwrite it",
                             hint="pass --force to overwrite")
    out_dir = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(out_dir):
        raise ModelError(f"{output_path}: output folder {out_dir} does not exist")
    if not os.access(out_dir, os.W_OK):
        raise ModelError(f"{output_path}: output folder {out_dir} is not writable")


class _Candidate:
    """Serializes a candidate so onnxruntime (and onnx.checker) can load it. With external data it is written
    as a hidden temporary file next to the source model, so the data's relative locations resolve; if that
    folder is read-only, into a temporary folder with links to the data files (then the checker, which refuses
    links, is skipped and onnxruntime's load is the check)."""

    def __init__(self, proto: onnx.ModelProto, info: LoadInfo) -> None:
        self.path: str | None = None
        self.tmpdir: str | None = None
        self.checkable = True
        if not info.external_data:
            self.source: str | bytes = proto.SerializeToString()
            return
        src_dir = os.path.dirname(os.path.abspath(info.path))
        data = proto.SerializeToString()
        if os.access(src_dir, os.W_OK):
            fd, self.path = tempfile.mkstemp(prefix=".onnxfuse-candidate-", suffix=".onnx", dir=src_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.source = self.path
            return
        self.tmpdir = tempfile.mkdtemp(prefix="onnxfuse-")
        for t in _all_tensors(proto.graph):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = {e.key: e.value for e in t.external_data}["location"]
                link = os.path.join(self.tmpdir, loc)
                if not os.path.exists(link):
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                    os.symlink(os.path.join(src_dir, loc), link)
        path = os.path.join(self.tmpdir, "candidate.onnx")
        with open(path, "wb") as f:
            f.write(data)
        self.source = path
        self.checkable = False

    def close(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


@dataclass
class _Verdict:
    ok: bool
    checks: list[V.OutputCheck]
    reason: str
    notes: list[str] = field(default_factory=list)
    node: str = ""  # the node the failure names (onnxruntime's or onnx.checker's message), if any


@dataclass
class _ProfileRun:
    """One shape profile the validator checks: its inputs and the original's outputs on them."""

    profile: Profile
    plan: InputPlan
    reference: dict  # at ORT_DISABLE_ALL
    at_all: dict | None = None  # at ORT_ENABLE_ALL, computed when needed


class _Validator:
    """Reference outputs from the original at ORT_DISABLE_ALL; candidates checked at DISABLE_ALL and ALL, on the
    inputs of every shape profile (one unless the user gave --profile or the model is a KV-cache decoder)."""

    def __init__(self, input_path: str, proto: onnx.ModelProto, opts: OptimizeOptions, provider: str) -> None:
        self.provider = provider
        self.input_path = input_path
        self.user_inputs = bool(opts.shapes or opts.inputs_npz)
        self.spec = V.parse_shape_specs(opts.shapes) if opts.shapes else V.ShapeSpec()
        self.user_profiles = parse_profiles(opts.profiles) if opts.profiles else None
        self.npz = opts.inputs_npz
        if self.npz is None:  # a --shape naming no input fails now, before any rewriting
            V._check_spec_names(self.spec, V.model_inputs(proto))
        self.proto = proto  # the original: input discovery reads its graph inputs and tables
        self._runs: list[_ProfileRun] | None = None
        self.tolerance = (V.Tolerance(opts.rtol if opts.rtol is not None else 1e-4,
                                      opts.atol if opts.atol is not None else 1e-4)
                          if opts.rtol is not None or opts.atol is not None else None)

    @property
    def runs(self) -> list[_ProfileRun]:
        """The profiles with the original's outputs at ORT_DISABLE_ALL (computed on first use). The first call
        settles the inputs: discovered from the model and probed on it (see inputs.py)."""
        if self._runs is None:
            ref = V.make_session(self.input_path, "disable", self.provider)
            self._runs = [_ProfileRun(p, plan, out) for p, plan, out in discover_profiles(
                self.proto, lambda feeds: V.run(ref, feeds), self.spec, self.npz, self.user_profiles)]
        return self._runs

    @property
    def plan(self) -> InputPlan | None:
        """The first profile's inputs (None before anything ran)."""
        return self._runs[0].plan if self._runs else None

    @property
    def feeds(self) -> dict:
        return self.runs[0].plan.feeds

    def profiles(self) -> list[tuple[str, float, InputPlan]]:
        """(name, weight, inputs) of every profile that ran; [] before anything ran."""
        return [(r.profile.name, r.profile.weight, r.plan) for r in self._runs or []]

    def check(self, proto: onnx.ModelProto, info: LoadInfo) -> _Verdict:
        runs = self.runs  # first: it settles the inputs
        cand = _Candidate(proto, info)
        try:
            try:
                if cand.checkable:
                    onnx.checker.check_model(cand.source if isinstance(cand.source, str) else proto)
            except onnx.checker.ValidationError as e:
                return _Verdict(False, [], f"onnx.checker rejects the model: {str(e).strip().splitlines()[0]}",
                                node=V.failing_node(str(e)))
            worst: list[V.OutputCheck] = []
            notes: list[str] = []
            for level in ("disable", "all"):
                try:
                    sess = V.make_session(cand.source, level, self.provider)
                    outs = [V.run(sess, r.plan.feeds) for r in runs]
                    del sess  # one session at a time: big models must not be held twice
                except OnnxfuseError as e:
                    return _Verdict(False, worst, f"onnxruntime ({level}) fails: {e.message}",
                                    node=V.failing_node(e.message))
                for r, got in zip(runs, outs, strict=True):
                    where = f" ({r.profile.name} profile)" if len(runs) > 1 else ""
                    checks = V.compare_outputs(r.reference, got, self.tolerance)
                    bad = [c for c in checks if not c.passed]
                    if bad and level == "all":
                        # onnxruntime's own optimizations may change the original's outputs too: then the fair
                        # reference at this level is the original at this level
                        own = V.compare_outputs(self._at_all(r), got, self.tolerance)
                        if all(c.passed for c in own):
                            notes.extend(f"onnxruntime's ORT_ENABLE_ALL changes output {c.name!r} of the original "
                                         f"model too{where} (max abs {c.max_abs:.3g}); compared against the "
                                         "original at that level" for c in bad)
                            bad = []
                    if bad:
                        c = bad[0]
                        return _Verdict(False, checks, f"output {c.name!r} differs at ORT level {level}{where}: "
                                                       f"max abs {c.max_abs:.3g}, needs tolerance "
                                                       f"{c.min_tolerance:.3g} (allowed rtol {c.tolerance.rtol:g}, "
                                                       f"atol {c.tolerance.atol:g})"
                                                       + (f"; {c.note}" if c.note else ""))
                    if level == "disable" and r is runs[0]:
                        worst = checks
            return _Verdict(True, worst, "", notes)
        finally:
            cand.close()

    def _at_all(self, r: _ProfileRun) -> dict:
        if r.at_all is None:
            r.at_all = V.run(V.make_session(self.input_path, "all", self.provider), r.plan.feeds)
        return r.at_all

    def timing_profiles(self) -> list[tuple[float, dict]]:
        """(weight, feeds) per profile for measured selection: batch 1 (the usual deployment; validation runs
        batch 2, which exposes batch-broadcasting bugs) unless the user gave the inputs."""
        out = []
        for r in self.runs:
            feeds = None if self.user_inputs else at_batch(self.proto, r.plan, 1)
            out.append((r.profile.weight, feeds if feeds is not None else r.plan.feeds))
        return out

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
        probe = onnx.ModelProto()
        probe.CopyFrom(proto)
        outputs = {o.name for o in probe.graph.output}
        probe.graph.output.extend(onnx.helper.make_tensor_value_info(c, onnx.TensorProto.BOOL, None)
                                  for c in conds if c not in outputs)
        cand = _Candidate(probe, info)
        try:
            sess = V.make_session(cand.source, "disable", self.provider)
            results = [V.run(sess, feeds) for feeds in feeds_sets]
        except (OnnxfuseError, InputSpecError):
            return {}
        finally:
            cand.close()
        values: dict[str, bool] = {}
        for c in conds:
            seen = {bool(r[c].reshape(-1)[0]) for r in results if c in r and r[c].size == 1}
            if len(seen) == 1:
                values[c] = seen.pop()
        return values


def _build(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
           max_rewrites: int | None = None) -> tuple[Model, LoadInfo, EngineResult]:
    """Load and rewrite again (deterministic): `base` gives the target, folding and probed branches."""
    model, info = load_model(input_path)
    result = run(model, rules, replace(base, deny=set(deny), max_rewrites=max_rewrites))
    return model, info, result


KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.training",
                 "ai.onnx.preview.training", "com.microsoft.experimental", "com.ms.internal.nhwc")


def _unknown_ops(proto: onnx.ModelProto) -> list[str]:
    """Ops from domains with no schema anywhere (not ONNX, not onnxruntime's, not a model-local function)."""
    local = {(f.domain, f.name) for f in proto.functions}
    return sorted({f"{n.domain}:{n.op_type}" for n in iter_nodes(proto.graph)
                   if n.domain not in KNOWN_DOMAINS and (n.domain, n.op_type) not in local})


def _unvalidatable_ops(proto: onnx.ModelProto, provider: str) -> list[str]:
    missing = []
    for op in op_counts(proto):
        domain, _, name = op.rpartition(".")
        if domain and kernel_issue(domain, name, provider):
            missing.append(op)
    return missing


def optimize(input_path: str, output_path: str | None, opts: OptimizeOptions | None = None) -> Result:
    opts = opts or OptimizeOptions()
    if not opts.static:
        return _optimize(input_path, input_path, output_path, opts)
    _check_paths(input_path, None if opts.dry_run else output_path, opts.force)
    tmp = tempfile.mkdtemp(prefix="onnxfuse-static-")
    try:
        return _optimize(input_path, specialize(input_path, opts.shapes, tmp), output_path, opts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _optimize(shown_path: str, input_path: str, output_path: str | None, opts: OptimizeOptions) -> Result:
    """`input_path` is what is optimized: the user's model, or its copy with static input shapes (--static)."""
    if opts.target not in ("cpu", "cuda"):
        raise OnnxfuseError(f"--target {opts.target}: unknown target", hint="use cpu or cuda")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    extra = [os.path.join(builtin_patterns_dir(), "optional", "pad_channels.yaml")] if opts.pad_channels else []
    rules = load_rules(extra + list(opts.patterns), opts.builtin, opts.only, opts.skip)
    timings["patterns"] = time.perf_counter() - t0
    _check_paths(input_path, None if opts.dry_run else output_path, opts.force)

    t0 = time.perf_counter()
    model, info = load_model(input_path)
    base_dir = model.base_dir
    before = op_counts(model.proto)  # the engine edits node protos in place: count and read inputs first
    unknown = _unknown_ops(model.proto)
    if opts.validate and unknown:
        raise OnnxfuseError(f"{input_path}: ops with no known schema ({', '.join(unknown[:3])}):"
                            " onnxruntime cannot run the model, so it cannot be validated",
                            hint="pass --no-validate to rewrite it anyway")
    provider = opts.target
    note = ""
    if opts.target == "cuda" and not provider_registered("cuda"):
        provider, note = "cpu", " on CPU (the installed onnxruntime has no CUDA execution provider)"
    validator = _Validator(input_path, model.proto, opts, provider) if opts.validate or opts.measure else None
    timings["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    deny: set[tuple[str, str]] = set()
    held_back: list[RuleSkip] = []
    if opts.validate and provider != opts.target:  # fused ops with no CPU kernel could not be validated here
        for r in rules:
            ops = [f"{d}.{o}" for d, o in r.output_ops() if kernel_issue(d, o, provider) and opts.target in r.targets]
            if ops:
                held_back.append(RuleSkip(r.id, f"{', '.join(ops)} has no CPU kernel and no CUDA execution provider "
                                                "is installed to validate it (--no-validate applies it unchecked)"))
        rules = [r for r in rules if r.id not in {h.rule for h in held_back}]
    hot = validator.branch_values(model.proto, info) if validator is not None and opts.fold else {}
    base = EngineOptions(target=opts.target, fold=opts.fold, hot=hot)
    eng = run(model, rules, replace(base))
    eng.skipped.extend(held_back)
    proto = model.export()
    timings["rewrite"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rolled_back: list[Rollback] = []
    checks: list[V.OutputCheck] = []
    status = "skipped (--no-validate)"
    if opts.validate and not eng.applications and not info.repairs:  # repaired: check the copy is still exact
        status = "not needed: nothing was rewritten"
    elif opts.validate:
        assert validator is not None
        missing = _unvalidatable_ops(proto, provider) if provider != opts.target else []
        if missing:
            status = (f"not run: {', '.join(missing)} have no {provider.upper()} kernel and no CUDA execution "
                      "provider is installed")
        else:
            verdict = validator.check(proto, info)
            bisections = 0
            while not verdict.ok and eng.applications:
                culprit = _creator(verdict.node, eng, rules)
                if culprit is not None and len(rolled_back) < MAX_NAMED_ROLLBACKS:
                    rolled_back.append(Rollback(culprit.rule, culprit.root, f"the failure names node "
                                                f"{verdict.node!r}, created by this rewrite: {verdict.reason}",
                                                verdict.node))
                else:
                    if bisections >= MAX_ROLLBACKS or len(rolled_back) >= MAX_NAMED_ROLLBACKS:
                        raise OnnxfuseError(f"validation still fails after rolling back {len(rolled_back)} "
                                            f"rewrites: {verdict.reason}; nothing written")
                    bisections += 1
                    culprit = _bisect(input_path, rules, base, deny, validator)
                    rolled_back.append(Rollback(culprit.rule, culprit.root, verdict.reason))
                deny.add(culprit.key)
                model, info, eng = _build(input_path, rules, base, deny)
                proto = model.export()
                verdict = validator.check(proto, info)
            if not verdict.ok:
                what = "the repaired model" if info.repairs and not eng.applications else "the original model itself"
                raise OnnxfuseError(f"{what} does not pass validation: {verdict.reason}")
            checks = verdict.checks
            status = "passed" + note + (f" after rolling back {len(rolled_back)} rewrite(s)" if rolled_back else "")
            status += "".join(f"; note: {n}" for n in verdict.notes)
    timings["validate"] = time.perf_counter() - t0

    measured: MeasureReport | None = None
    if opts.measure and eng.applications:
        t0 = time.perf_counter()
        measured, model, info, eng, proto = _measure(input_path, rules, opts, base, deny, model, info, eng, proto,
                                                     validator)
        timings["measure"] = time.perf_counter() - t0

    written: list[str] = []
    if output_path is not None and not opts.dry_run:
        t0 = time.perf_counter()
        big = proto.ByteSize() > 2**31 - 2**24
        written = save_model(proto, output_path, base_dir, external=info.external_data or big)
        timings["write"] = time.perf_counter() - t0
    after = op_counts(proto)
    return Result(
        input=shown_path, output=None if opts.dry_run else output_path, target=opts.target,
        nodes_before=sum(before.values()), nodes_after=sum(after.values()),
        ops_before=dict(before), ops_after=dict(after), applications=eng.applications, skipped=eng.skipped,
        rolled_back=rolled_back, checks=checks, validation=status, timings=timings, written=written,
        sweeps=eng.sweeps, measure=measured, inputs=validator.plan if validator is not None else None,
        profiles=validator.profiles() if validator is not None else [],
        repairs=list(info.repairs), load_notes=list(info.notes),
        peak_rss_bytes=_peak_rss_bytes(),
    )


def find_inputs(model_path: str, shapes: list[str] | None = None, inputs_npz: str | None = None,
                target: str = "cpu", probe: bool = True, budget_bytes: int | None = None) -> InputPlan:
    """The inputs `optimize` would validate and measure on, and why: discovered from the model (see
    inputs.py) and, with `probe`, settled by running the original on the target's execution provider."""
    model, _ = load_model(model_path)
    spec = V.parse_shape_specs(shapes) if shapes else V.ShapeSpec()
    provider = "cpu" if target == "cuda" and not provider_registered("cuda") else target
    run_on = None
    if probe:
        sess = V.make_session(model_path, "disable", provider)

        def run_on(feeds: dict) -> dict:
            return V.run(sess, feeds)
    plan, _ = discover(model.proto, run_on, spec, inputs_npz, budget_bytes=budget_bytes)
    return plan


def _peak_rss_bytes() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _measure(input_path: str, rules: list[Rule], opts: OptimizeOptions, base: EngineOptions,
             deny: set[tuple[str, str]], model: Model,
             info: LoadInfo, eng: EngineResult, proto: onnx.ModelProto, validator: _Validator):
    """Time groups of rewrites on the target and keep only those that help (see measure.py)."""
    if opts.target == "cuda" and not provider_registered("cuda"):
        note = "not measured: the installed onnxruntime has no CUDA execution provider"
        return MeasureReport("cuda", opts.measure_threads, 0, note=note), model, info, eng, proto
    weights = info.size_bytes + info.external_bytes
    if weights > MEASURE_MAX_BYTES:
        note = (f"not measured: {weights / 2**30:.1f} GiB of weights; timing variants side by side would hold "
                "several copies in memory (validation still ran, one session at a time)")
        return MeasureReport(opts.target, opts.measure_threads, 0, note=note), model, info, eng, proto
    profiles = validator.timing_profiles()  # settles the inputs
    feeds = profiles[0][1]
    time_fn = make_time_fn(opts.target, opts.measure_threads, opts.measure_budget_s / len(profiles))
    if len(profiles) > 1:  # a group is kept only if it wins on the weighted total over the profiles
        time_fn = weighted_time_fn(time_fn, profiles)
    by_id = {r.id: r for r in rules}
    allowed = {a.rule for a in eng.applications if a.rule in by_id}  # folding is exact: always on
    earlier: list = []  # groups dropped in the first pass
    for pass_no in range(2):
        report = _select_groups(input_path, by_id, allowed, eng, opts, base, deny, feeds, time_fn)
        kept = set() if report.dropped_everything else allowed - set(report.dropped_rules)
        deny = deny | report.denied  # rewrites left out of groups kept only in part (by region)
        report.groups = report.groups + earlier
        if kept == allowed:
            break
        # Rules the dropped ones had shadowed (e.g. FusedMatMul inside an Attention that did not pay) fire
        # once those are gone: time them too, in one more pass.
        model, info, eng = _build(input_path, [r for r in rules if r.id not in allowed - kept], base, deny)
        shadowed = {a.rule for a in eng.applications if a.rule in by_id} - allowed
        if pass_no == 1 or not shadowed:
            break
        earlier = [g for g in report.groups if not g.kept]
        allowed = kept | shadowed
    model, info, eng = _build(input_path, [by_id[r] for r in sorted(kept, key=lambda r: by_id[r].order)],
                              base, deny)
    proto = model.export()
    if opts.validate and eng.applications:
        verdict = validator.check(proto, info)
        if not verdict.ok:  # cannot happen for a subset of validated rules unless a rule depends on another
            raise OnnxfuseError(f"the measured selection does not validate: {verdict.reason}; nothing written")
    return report, model, info, eng, proto


def _select_groups(input_path: str, by_id: dict[str, Rule], allowed: set[str], eng: EngineResult,
                   opts: OptimizeOptions, base: EngineOptions, deny: set[tuple[str, str]], feeds: dict, time_fn) -> MeasureReport:
    """Group the applied rewrites of the `allowed` rules by the fused ops they create and time the groups;
    candidates are built from allowed rules only, so a dropped group never lets another rule in unmeasured."""
    ops_by_rule: dict[str, set[str]] = {}
    for a in eng.applications:
        if a.rule in allowed:
            ops_by_rule.setdefault(a.rule, set()).update(a.ops)
    groups: dict[str, list[str]] = {}
    for rule_id, ops in ops_by_rule.items():
        groups.setdefault(group_key(tuple(ops)), []).append(rule_id)
    rewrites = dict(Counter(a.rule for a in eng.applications if a.rule in allowed))
    members = {g: [a.key for a in eng.applications if a.rule in rules] for g, rules in groups.items()}
    candidates: list[_Candidate] = []
    cache: dict[tuple[frozenset[str], frozenset[tuple[str, str]]], Source] = {}

    def build_denying(dropped: set[str], denied: frozenset[tuple[str, str]]) -> Source:
        key = (frozenset(dropped), denied)
        if key not in cache:
            use = [r for rid, r in by_id.items() if rid in allowed and rid not in dropped]
            m, i, _ = _build(input_path, use, base, deny | denied)
            cand = _Candidate(m.export(), i)
            candidates.append(cand)
            cache[key] = cand.source
        return cache[key]

    def build(dropped: set[str]) -> Source:
        return build_denying(dropped, frozenset())

    try:
        return select(groups, rewrites, build, input_path, feeds, time_fn, opts.target, opts.measure_threads,
                      members, build_denying)
    finally:
        for c in candidates:
            c.close()


def _creator(node: str, eng: EngineResult, rules: list[Rule]) -> Application | None:
    """The rule rewrite that created `node` (the node a failure names), or None: no node named, an original
    node, or one only an exact pass (folding) created. A node a rule created and If inlining later copied out
    of a branch is still that rule's."""
    if not node:
        return None
    ids = {r.id for r in rules}
    return next((a for a in reversed(eng.applications) if a.rule in ids and node in a.created), None)


def _bisect(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
            validator: _Validator) -> Application:
    """The culprit among the rules' rewrites: the last rewrite of the smallest failing prefix. A prefix is the
    first k rule rewrites with the exact passes (folding) before and after them, as in the full run, so a fused
    node is checked with the inputs folding gives it and an exact pass is never blamed for a rule's node. Only
    when folding alone fails (no rule rewrite at all) is a folding step the culprit (_bisect_exact)."""
    ids = {r.id for r in rules}

    def rule_apps(k: int | None) -> list[Application]:
        _, _, eng = _build(input_path, rules, base, deny, max_rewrites=k)
        return [a for a in eng.applications if a.rule in ids]

    def fails(k: int) -> bool:
        model, info, _ = _build(input_path, rules, base, deny, max_rewrites=k)
        return not validator.check(model.export(), info).ok

    n = len(rule_apps(None))
    lo, hi = 0, n  # prefix lo is assumed to pass (checked below when it matters), prefix hi fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    if hi == 0 or (hi == 1 and fails(0)):
        return _bisect_exact(input_path, rules, base, deny, validator)
    return rule_apps(hi)[hi - 1]


def _bisect_exact(input_path: str, rules: list[Rule], base: EngineOptions, deny: set[tuple[str, str]],
                  validator: _Validator) -> Application:
    """Folding alone fails validation: the exact step whose prefix (the later steps denied) first fails."""
    _, _, eng = _build(input_path, rules, base, deny, max_rewrites=0)
    steps = eng.applications
    if not steps:
        raise OnnxfuseError("validation fails, but no rewrite is left to roll back; nothing written")

    def fails(k: int) -> bool:
        model, info, _ = _build(input_path, rules, base, deny | {a.key for a in steps[k:]}, max_rewrites=0)
        return not validator.check(model.export(), info).ok

    lo, hi = 0, len(steps)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return steps[hi - 1]


@dataclass
class Explanation:
    fired: dict[str, int]
    near_misses: list[NearMiss]
    skipped: list[RuleSkip]
    misaligned: list = field(default_factory=list)  # layout.Misaligned
    vector_width: int = 8


def explain(input_path: str, patterns: list[str] | None = None, target: str = "cpu", rule: str | None = None,
            builtin: bool = True) -> Explanation:
    """Apply the rules to a fixed point, then report for every candidate left why its best attempt failed."""
    rules = load_rules(patterns, builtin, only=None)
    if rule is not None and rule not in {r.id for r in rules}:
        raise OnnxfuseError(f"--rule {rule}: no rule with that id", hint="see `onnxfuse patterns list`")
    model, _, eng = _build(input_path, rules, EngineOptions(target=target), set())
    asked = [r for r in rules if rule is None or r.id == rule]
    misses = near_misses(model, asked, target, min_progress=1 if rule else 2)
    from .layout import alignment_report, vector_width

    width = vector_width(target)
    return Explanation(dict(Counter(a.rule for a in eng.applications)), misses, eng.skipped,
                       alignment_report(model, width), width)
