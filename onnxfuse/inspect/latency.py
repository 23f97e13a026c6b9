"""Latency protocol: same session options for A and B, warm-up until timings settle, A and B interleaved in
one process (measure/timing.py), then median / p90 / p99 / min / spread on wall time, and B against A with a
bootstrap 95% confidence interval and the verdict optimize gives (measure/verdicts.py: beyond the noise floor, what
a second session of each model differs by on average (A B B2 A2), on the same estimator: thread CPU time at one thread on the CPU). Optional batch sweep
for models with a dynamic batch dimension."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from ..inputs import discover, discover_profiles, parse_profiles, timing_feeds
from ..inputs.shapes import ShapeSpec, model_inputs, parse_shape_specs, resolve_shapes
from ..inputs.synth import make_inputs
from ..measure.clock import WALL, estimator_for
from ..measure.stats import Ratio, paired_ratio, percentile
from ..measure.timing import MIN_RUNS_FLOOR, Progress, in_generations, interleave, warm_up
from ..measure.verdicts import verdict
from ..options import check_choice, check_count, check_seconds, check_strings, check_target
from ..targets import HOST
from ..validate.runtime import LEVELS, make_session, resolve_threads, run

# bench's A/B timing runs on past its budget, up to this many times it, while the verdict is undecided (its
# interval across the faster line): noise is a reason to measure longer. gpt2_tiny against its optimized
# output (a 1.5-2% effect, a margin of 1%), quiet: "faster" in 4 of 5 benches of 5 s, the fifth 0.988 [0.982, 0.994]
UNDECIDED_BUDGETS = 2.0

CONTROL, TWIN_B = "A/A control", "B/B control"  # second sessions of A and of B (measure/sessions.py)


@dataclass
class Latency:
    label: str
    path: str
    session_ms: float
    first_run_ms: float
    warmup_runs: int
    runs: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    spread: float  # (p90 - p10) / median
    samples_ms: list[float] = field(default_factory=list, repr=False)


@dataclass
class BatchPoint:
    batch: int
    median_ms: dict[str, float]  # label -> median latency
    throughput: dict[str, float]  # label -> samples per second


@dataclass
class BenchResult:
    """What `bench` measured; `to_json()` is `onnxfuse bench --json`."""

    provider: str
    threads: int
    level: str
    inputs: dict[str, list[int]]
    models: list[Latency]
    speedup: float | None = None  # median of t(A)/t(B) per round: > 1 means B is faster
    ratio: Ratio | None = None  # t(B)/t(A) with its 95% CI
    verdict: str | None = None  # faster / slower / no significant change (B against A)
    batches: list[BatchPoint] = field(default_factory=list)
    control: Ratio | None = None  # the same model A in a second session against A: the noise floor
    profile: str = "default"  # the shape profile timed (prefill, decode, a --profile, or default)
    estimator: str = WALL  # the clock the verdict reads (measure/clock.py); latencies are wall time
    floor: float = 0.0  # the A/A control's distance from 1: the noise floor the verdict clears
    profiles: list[BenchResult] = field(default_factory=list)  # the other profiles (a KV-cache decoder: decode)

    def to_json(self) -> dict:
        return {
            "schema": "onnxfuse.bench/1", "profile": self.profile,
            "provider": self.provider, "threads": self.threads, "level": self.level, "inputs": self.inputs,
            "models": [{k: v for k, v in m.__dict__.items() if k != "samples_ms"} for m in self.models],
            "speedup": self.speedup, "estimator": self.estimator, "noise_floor": self.floor,
            "ratio": None if self.ratio is None else self.ratio.__dict__,
            "verdict": self.verdict,
            "control_ratio": None if self.control is None else self.control.__dict__,
            "batches": [b.__dict__ for b in self.batches],
            "profiles": [p.to_json() for p in self.profiles],
        }


def _load(path: str, provider: str, threads: int, level: str):
    t = time.perf_counter()
    s = make_session(path, level, provider, threads)
    return s, (time.perf_counter() - t) * 1e3


def probed_inputs(path: str, proto: onnx.ModelProto, spec: ShapeSpec | None, inputs_npz: str | None,
                   provider: str, session=None) -> dict:
    """The inputs optimize would use (inputs/): read from the model and probed on it, with `session` when the
    caller has one of the model whose runs nothing times yet, else with a session of its own."""
    probe = session if session is not None else make_session(path, "disable", provider)
    plan, _ = discover(proto, lambda feeds: run(probe, feeds), spec, inputs_npz)
    return timing_feeds(proto, plan, bool(spec or inputs_npz))


def bench(paths: list[str], labels: list[str] | None = None, provider: str = HOST, threads: int | str = 1,
          level: str = "all", shapes: list[str] | None = None, inputs_npz: str | None = None,
          min_runs: int = 50, budget_s: float = 5.0, batches: list[int] | None = None,
          progress: Progress | None = None, profiles: list[str] | None = None) -> BenchResult:
    """Latency of one model, or of two (A and B) interleaved in one process with an A/A control: median, p90,
    p99, min, spread, and B's speedup over A with a 95% CI and a verdict. Inputs as `optimize` finds them (or
    `shapes`/`inputs_npz`); `batches` adds a batch sweep (latency and samples/s per batch size). A decoder with a
    KV cache is timed at prefill and at decode (or at each of `profiles`, texts as `--profile` takes them), the
    budget shared between them: the result is the first profile's, the others under `profiles`."""
    threads = resolve_threads(threads) if isinstance(threads, str) else threads  # "auto": one per physical core
    check_bench_options(provider, threads, level, min_runs, budget_s, batches)
    shapes, profiles = check_strings("shapes", shapes), check_strings("profiles", profiles)
    labels = labels or [chr(ord("A") + i) for i in range(len(paths))]
    spec = parse_shape_specs(shapes) if shapes else None
    proto = onnx.load(paths[0], load_external_data=False)
    probe = functools.partial(run, make_session(paths[0], "disable", provider))
    plans = [(prof, plan) for prof, plan, _ in discover_profiles(proto, probe, spec or ShapeSpec(), inputs_npz,
                                                                 parse_profiles(profiles) if profiles else None)]
    del probe  # its session: not alive while timing
    # with two models, a second session of each (B's, then A's, created last: A B B2 A2) measures what order and
    # placement alone do, and the comparison is of the two sessions' mean on each side (measure/sessions.py); the
    # sessions are made twice, the second time in the opposite order (measure/timing.py in_generations)
    control = len(paths) == 2
    twins = [TWIN_B, CONTROL] if control else []
    sources = dict(zip(labels + twins, paths + (paths[::-1] if control else []), strict=True))
    load_ms: dict[str, float] = {}  # each label's first load

    def open_sessions(which: list[str], reverse: bool = False) -> dict:
        made = {}
        for label in which[::-1] if reverse else which:
            if progress and label not in load_ms:
                progress(f"loading {label}", 0.0)
            made[label], ms = _load(sources[label], provider, threads, level)
            load_ms.setdefault(label, ms)
        return {label: made[label] for label in which}

    results = []
    for n, (prof, plan) in enumerate(plans):
        step = None if progress is None else (
            lambda what, f, n=n, name=prof.name: progress(f"{name}: {what}" if len(plans) > 1 else what,
                                                          (n + f) / len(plans)))
        feeds = timing_feeds(proto, plan, bool(spec or inputs_npz))  # optimize's timing inputs: batch 1
        r = _bench_feeds(lambda reverse: open_sessions(list(sources), reverse), load_ms, paths, labels, feeds,
                         provider, threads, level, min_runs, budget_s / len(plans), step)
        r.profile = prof.name
        if batches:
            r.batches = batch_sweep(open_sessions(labels), proto, spec, batches, min_runs, budget_s / 2 / len(plans),
                                    step)
        results.append(r)
    first = results[0]
    first.profiles = results[1:]
    return first


def check_bench_options(provider: str, threads: int, level: str, runs: int | None = None,
                        budget_s: float | None = None, batches: list[int] | None = None,
                        runs_option: str = "min_runs") -> None:
    """bench's and profile's values, checked before anything loads: one OnnxfuseError naming the option."""
    check_target("provider", provider)
    check_count("threads", threads)
    check_choice("level", level, LEVELS)
    if runs is not None:
        check_count(runs_option, runs)
    if budget_s is not None:
        check_seconds("budget_s", budget_s)
    for b in batches or []:
        check_count("batches", b)


def _bench_feeds(open_sessions: Callable[[bool], dict], load_ms: dict[str, float], paths: list[str],
                 labels: list[str], feeds: dict, provider: str, threads: int, level: str, min_runs: int,
                 budget_s: float, progress: Progress | None) -> BenchResult:
    """One shape profile of `bench` on the sessions of every model (and the A/A control), made in two generations
    (in_generations): first run and warm-up of each session, interleaved timing, statistics. The first run and
    the warm-up reported are the first generation's."""
    first_ms: dict[str, float] = {}
    warm: dict[str, int] = {}

    def opened(reverse: bool) -> dict:
        sessions = open_sessions(reverse)
        for label, s in sessions.items():
            t = time.perf_counter()
            run(s, feeds)
            first_ms.setdefault(label, (time.perf_counter() - t) * 1e3)
            warm.setdefault(label, warm_up(s, feeds))
        return sessions

    estimator = estimator_for(provider, threads)
    control = len(labels) == 2
    settled = None
    if control:  # an A/B verdict still undecided (its interval across the faster line) is measured longer
        a, b = labels

        def settled(t) -> bool:
            return verdict(t, (b, TWIN_B), (a, CONTROL)).decided

    times = in_generations(opened, [(1.0, feeds)], estimator=estimator, min_runs=MIN_RUNS_FLOOR,
                           runs_each=min_runs, min_seconds=budget_s, max_runs=20 * min_runs, progress=progress,
                           keep_runs=True, settled=settled, max_seconds=UNDECIDED_BUDGETS * budget_s)
    models = []
    for label, path in zip(labels, paths, strict=True):
        ms = [t * 1e3 for t in times.single_runs(label, clock=WALL)]  # a latency's percentiles are of runs
        med = statistics.median(ms)
        models.append(Latency(label, path, load_ms[label], first_ms[label], warm[label], len(ms), med,
                              percentile(ms, 90), percentile(ms, 99), min(ms),
                              (percentile(ms, 90) - percentile(ms, 10)) / med, ms))
    result = BenchResult(provider, threads, level, {k: list(v.shape) for k, v in feeds.items()}, models,
                         estimator=estimator)
    if control:
        v = verdict(times, (b, TWIN_B), (a, CONTROL))
        result.ratio, result.floor, result.verdict = v.ratio, v.floor, v.word
        result.control = paired_ratio(times[CONTROL], times[a])
        result.speedup = 1.0 / v.ratio.median
    return result


def dynamic_batch_dim(proto: onnx.ModelProto) -> str | None:
    """The name of a symbolic first dimension shared by the inputs, if any."""
    names = set()
    for i in proto.graph.input:
        dims = i.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            names.add(dims[0].dim_param)
        elif dims and dims[0].dim_value <= 0 and not dims[0].dim_param:
            names.add("")
    return names.pop() if len(names) == 1 else None


def batch_dim_or_refuse(proto: onnx.ModelProto, batches: list[int], what: str = "a batch sweep") -> str:
    """dynamic_batch_dim, or one InputSpecError naming `batches` when the model has none."""
    dim = dynamic_batch_dim(proto)
    if dim is None:
        from ..errors import InputSpecError

        raise InputSpecError(f"{what} needs a model whose inputs share a dynamic first (batch) dimension",
                             option="batches", value=",".join(map(str, batches)))
    return dim


def at_batch(proto: onnx.ModelProto, spec: ShapeSpec | None, dim: str, b: int) -> ShapeSpec:
    """`spec` with the batch dimension `dim` (dynamic_batch_dim; "" when unnamed) set to `b`."""
    base = spec or ShapeSpec()
    tensors = {name: [b, *dims[1:]] for name, dims in base.tensors.items()}
    dims = dict(base.dims)
    if dim:
        dims[dim] = b
    else:
        for i in proto.graph.input:
            if i.name not in tensors:
                shape = resolve_shapes(model_inputs(proto), ShapeSpec(tensors, dims))[i.name]
                tensors[i.name] = [b, *shape[1:]]
    return ShapeSpec(tensors, dims)


def batch_sweep(sessions: dict[str, object], proto: onnx.ModelProto, spec, batches: list[int], min_runs: int,
                budget_s: float, progress: Progress | None = None) -> list[BatchPoint]:
    dim = batch_dim_or_refuse(proto, batches)
    points = []
    for n, b in enumerate(batches):
        if progress:
            progress(f"batch {b}", n / len(batches))
        feeds = make_inputs(proto, at_batch(proto, spec, dim, b))
        runs = max(10, min_runs // 2)
        times = interleave(sessions, [(1.0, feeds)], estimator=WALL, min_runs=runs, floor_runs=runs,
                           min_seconds=budget_s / len(batches), max_runs=20 * runs, keep_runs=True)
        med = {k: statistics.median(times.single_runs(k)) * 1e3 for k in times}
        points.append(BatchPoint(b, med, {k: b / (m / 1e3) for k, m in med.items()}))
    return points
