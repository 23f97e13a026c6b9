"""Where the time goes: onnxruntime's profiler per op type and per node, bytes moved and FLOPs per node (from
the shapes the profiler records), achieved FLOP/s and bytes/s against peaks measured on this machine, and the
three memory-bound signals in plain words.

Bytes per call count what the kernel touches (node_bytes): a Gather reads the rows it returns, not its table;
Shape/Size read no data; a view (Reshape, Squeeze, ...) moves nothing unless onnxruntime must copy it; weights
onnxruntime pre-packed (absent from the profiler's record) are read on every call and counted. An op type whose
rate still comes out above CACHE_FACTOR x the measured copy peak is not shown as a bandwidth (see residency)."""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import OnnxfuseError
from ..inputs.shapes import parse_shape_specs
from ..measure.timing import run_times
from ..model_proto import make_model
from ..op_cost import GEMM_CLASS, entries, model_index, node_bytes, node_flops, released_bytes
from ..options import check_count, check_strings
from ..progress import Phase, quiet
from ..targets import HOST
from ..validate.runtime import make_session
from .profiler_events import (
    kernel_events,
    last_runs,
    profiled_events,
    profiler_inside_fraction,
    run_spans,
)
from .remaining import Note, notes

SHORT_US = 5.0  # an op call shorter than this is dominated by per-op overhead
# A rate above CACHE_FACTOR x the measured copy peak did not come from memory. The copy peak counts 2 bytes per
# element copied, but the copy also reads each destination line before writing it (write-allocate): 3 bytes of
# traffic. A kernel that mostly reads can so show up to 1.5x the copy figure from memory; above that its data
# was in cache (or, if it could not fit there, the bytes model is wrong: the test over the bundled models keeps
# that from happening).
CACHE_FACTOR = 1.5


@dataclass
class Peaks:
    gflops: float  # measured GEMM FLOP/s (GFLOP/s) at the profiling thread count
    gbytes: float  # measured memory copy bandwidth (GB/s, read + write) at the profiling thread count
    profiler_inside: float = 0.0  # fraction of the profiler's slowdown inside kernel events (calibrated)
    cache_bytes: int = 0  # the last-level cache of this machine (bytes; 0 if unknown)


@dataclass
class NodeStat:
    name: str
    op: str
    calls_per_run: float
    total_us: float  # per run
    bytes: float  # per call
    flops: float  # per call
    replaces: str = ""  # provenance from onnxfuse (original node names), when the node is a fused one

    @property
    def mean_us(self) -> float:
        return self.total_us / max(self.calls_per_run, 1e-9)


@dataclass
class OpStat:
    op: str
    calls_per_run: float
    total_us: float
    share: float
    mean_us: float
    gflops: float  # achieved
    gbytes: float  # achieved, by the bytes model (see residency before reading it as memory bandwidth)
    flop_util: float
    byte_util: float  # gbytes / the measured copy peak
    # "memory": gbytes is memory bandwidth; "cache": over CACHE_FACTOR x the copy peak, and every node's bytes per
    # call fit in the last-level cache; "unexplained": over it with more data than the cache holds (a bytes-model
    # or timing error). Only "memory" rates are printed as GB/s.
    residency: str = "memory"

    @property
    def gbytes_text(self) -> str:
        """The GB/s cell of a report: the rate only where it can be memory bandwidth."""
        return {"cache": "in cache", "unexplained": "?"}.get(self.residency, f"{self.gbytes:.2f}")


@dataclass
class HeadroomSplit:
    """The headroom (latency above the GEMM-bound limit) by what could remove it, in ms per run:

    * flop_memory_ms: the FLOP-carrying ops' data (weights, maps) at the measured copy peak, beyond their FLOPs at
      the GEMM peak: their roofline. A batch-1 Gemm streams its weights; a depthwise Conv reads its map for a few
      FLOPs per element. Fusion removes part of it only where it keeps a map from being written and read again.
    * flop_kernel_ms: the time the FLOP-carrying ops take above that roofline: the kernels at these shapes
      (narrow channel counts, small maps, depthwise loops). A graph rewrite changes it only by changing the
      shapes or the kernel onnxruntime picks.
    * other_ms: the ops outside the GEMM class (reorders, activations, elementwise, data movement, pooling):
      what fusion and layout remove.
    * between_ms: the latency not inside any kernel (the session's own work between ops; negative when the
      profiled kernels add up to more than the latency measured without the profiler)."""

    flop_memory_ms: float
    flop_kernel_ms: float
    other_ms: float
    between_ms: float


@dataclass
class ProfileResult:
    """What `profile` measured for one model; `to_json()` is one entry of `onnxfuse profile --json`."""

    path: str
    runs: int
    run_ms: float  # median model_run duration under the profiler
    latency_ms: float  # median latency measured without the profiler
    kernel_ms: float  # sum of kernel times per run
    by_type: list[OpStat]
    by_node: list[NodeStat]
    peaks: Peaks
    signals: list[str] = field(default_factory=list)
    overhead_us: float = 0.0  # profiler cost subtracted from each kernel event
    known: dict[str, Note] = field(default_factory=dict)  # remaining cost op type -> what onnxfuse knows of it

    @property
    def agreement(self) -> float:
        """Kernel time total / measured latency (1.0 = the table accounts for all of it)."""
        return self.kernel_ms / self.latency_ms if self.latency_ms else 0.0

    @property
    def gemm_bound_ms(self) -> float:
        """The GEMM-bound limit: the time the FLOP-carrying ops (Conv, MatMul, Gemm, attention and their fused
        forms: op_cost.GEMM_CLASS) would take at the GEMM peak measured in this run; all else is headroom."""
        flops = sum(s.flops * s.calls_per_run for s in self.by_node if s.op in GEMM_CLASS)
        return flops / (self.peaks.gflops * 1e9) * 1e3 if self.peaks.gflops else 0.0

    @property
    def headroom_ms(self) -> float:
        """Measured latency above the GEMM-bound limit: what fusion and layout can remove at best."""
        return max(0.0, self.latency_ms - self.gemm_bound_ms)

    def headroom_split(self) -> HeadroomSplit:
        """Where the headroom is, by what could remove it (HeadroomSplit)."""
        flop_peak = self.peaks.gflops * 1e3  # FLOPs per microsecond
        byte_peak = self.peaks.gbytes * 1e3  # bytes per microsecond
        memory = kernel = other = 0.0
        for s in self.by_node:
            if s.op not in GEMM_CLASS:
                other += s.total_us
                continue
            calls = s.calls_per_run
            at_peak = s.flops * calls / flop_peak if flop_peak else 0.0
            traffic = s.bytes * calls / byte_peak if byte_peak else 0.0
            above = max(0.0, s.total_us - at_peak)
            floor = min(above, max(0.0, traffic - at_peak))  # data in cache can beat the copy peak: not above
            memory += floor
            kernel += above - floor
        return HeadroomSplit(memory / 1e3, kernel / 1e3, other / 1e3, self.latency_ms - self.kernel_ms)

    def remaining_costs(self, k: int = 5) -> list[OpStat]:
        """The op types outside the GEMM class that take the most time: where the headroom goes."""
        return [s for s in self.by_type if s.op not in GEMM_CLASS][:k]

    def to_json(self) -> dict:
        return {
            "path": self.path, "runs": self.runs, "run_ms": self.run_ms, "latency_ms": self.latency_ms,
            "kernel_ms": self.kernel_ms, "agreement": self.agreement, "peaks": self.peaks.__dict__,
            "profiler_overhead_us_per_call": self.overhead_us,
            "by_type": [s.__dict__ for s in self.by_type],
            "by_node": [{**s.__dict__, "mean_us": s.mean_us} for s in self.by_node],
            "signals": self.signals,
            "gemm_bound_ms": self.gemm_bound_ms, "headroom_ms": self.headroom_ms,
            "headroom_split": self.headroom_split().__dict__,
            "remaining_costs": [{"op": s.op, "ms": s.total_us / 1e3, "share": s.share, "calls": s.calls_per_run,
                                 "known": self.known[s.op].to_json() if s.op in self.known else None}
                                for s in self.remaining_costs()],
        }


def captured_share(before: ProfileResult, after: ProfileResult) -> float | None:
    """How much of the gap between `before` (the input) and its GEMM-bound limit `after` (the optimized model)
    removed: (before - after) / (before - limit); None where the input has no headroom."""
    gap = before.latency_ms - before.gemm_bound_ms
    return None if gap <= 0 else (before.latency_ms - after.latency_ms) / gap


_PEAKS: dict[int, Peaks] = {}


def measure_peaks(threads: int = 1) -> Peaks:
    """Compute peak: the better of a GEMM (onnxruntime MatMul, 1024^3) and a 3x3 convolution probe, best of
    12 runs each; bandwidth: a memory copy (numpy, 128 MiB, best of 5; at more than one thread also through
    onnxruntime's threads, the better of the two); and the size of the last-level cache."""
    if threads in _PEAKS:
        return _PEAKS[threads]
    import onnx.helper as oh

    n = 1024
    b = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    g = oh.make_graph([oh.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                      [oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [n, n])],
                      [oh.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n, n])],
                      [onnx.numpy_helper.from_array(b, "b")])  # constant B: onnxruntime pre-packs it
    s = make_session(make_model(g, {"": 13}).SerializeToString(),
                       "all", HOST, threads)
    feeds = {"a": b}
    gflops = 2 * n**3 / min(run_times(s, feeds, 12, warmup=2)) / 1e9
    gflops = max(gflops, _conv_probe_gflops(threads))  # onnxruntime's blocked convolutions can beat its GEMM
    src = np.ones(32 * 2**20, np.float32)
    dst = np.empty_like(src)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t)
    gbytes = 2 * src.nbytes / min(ts) / 1e9
    del src, dst
    if threads != 1:  # numpy copies on one core; onnxruntime's threads together can move more
        gbytes = max(gbytes, _ort_copy_gbytes(threads))
    _PEAKS[threads] = Peaks(gflops, gbytes, profiler_inside_fraction(threads), last_level_cache_bytes())
    return _PEAKS[threads]


def _ort_copy_gbytes(threads: int) -> float:
    """Copy bandwidth through onnxruntime at `threads`: Mul by a scalar 1 over 128 MiB (reads it, writes it)."""
    import onnx.helper as oh

    n = 32 * 2**20
    g = oh.make_graph([oh.make_node("Mul", ["x", "one"], ["y"])], "copy",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n])],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [n])],
                      [onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    s = make_session(make_model(g, {"": 13}).SerializeToString(),
                       "all", HOST, threads)
    feeds = {"x": np.ones(n, np.float32)}
    return 2 * 4 * n / min(run_times(s, feeds, 5, warmup=1)) / 1e9


def _conv_probe_gflops(threads: int) -> float:
    """A 3x3 convolution, 64 -> 64 channels on 56x56 (the shape class where onnxruntime's NCHWc kernels shine)."""
    import onnx.helper as oh

    w = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32)
    g = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 56, 56])],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 56, 56])],
                      [onnx.numpy_helper.from_array(w, "w")])
    s = make_session(make_model(g, {"": 13}).SerializeToString(),
                       "all", HOST, threads)
    feeds = {"x": np.ones((1, 64, 56, 56), np.float32)}
    flops = 2.0 * 64 * 56 * 56 * 64 * 9
    return flops / min(run_times(s, feeds, 12, warmup=2)) / 1e9


def profile(path: str, provider: str = HOST, threads: int | str = 1, level: str = "all", runs: int = 30,
            warmup: int = 10, shapes: list[str] | None = None, inputs_npz: str | None = None,
            latency_ms: float | None = None, batches: list[int] | None = None,
            progress: Phase | None = None, known: bool = True, inputs_from: str | None = None) -> ProfileResult:
    """Profile one model on the inputs optimize would use (probed; `shapes`/`inputs_npz` as in optimize).
    With one of `batches`, the model is profiled at that batch size (its dynamic first dimension); with two or
    more, at the inputs optimize would use, and the third memory-bound signal (throughput against batch size)
    is measured with a batch sweep. With `known`, what onnxfuse knows about each remaining cost's op type (remaining.py:
    rules that would rewrite it, are held back, nearly match; the layout boundaries). `progress(phase)` as each
    step starts: finding inputs, profiled runs, batch sweep, what onnxfuse knows (progress.py). `inputs_from`: a
    model (the original, when `path` is its optimized version) whose inputs are found and used, as `bench`
    times both models on the first one's."""
    from ..validate.runtime import resolve_threads
    from .latency import at_batch, batch_dim_or_refuse, bench, check_bench_options, probed_inputs

    threads = resolve_threads(threads) if isinstance(threads, str) else threads  # "auto": one per physical core

    check_bench_options(provider, threads, level, runs, None, batches, runs_option="runs")
    check_count("warmup", warmup, 0)
    shapes = check_strings("shapes", shapes)
    spec = parse_shape_specs(shapes) if shapes else None
    progress = progress or quiet
    progress("finding inputs")
    proto = onnx.load(path, load_external_data=False)
    if batches and len(batches) == 1:  # one batch size: profiled there
        b = batches[0]
        if inputs_npz is not None:
            raise OnnxfuseError("profiling at one batch size cannot take an inputs file (its arrays fix the batch "
                                "size)", option="batches", value=str(b))
        dim = batch_dim_or_refuse(proto, batches, "profiling at one batch size")
        given = ([spec.dims[dim]] if spec and dim in spec.dims else []) + [d[0] for d in (spec.tensors.values()
                                                                                          if spec else ()) if d]
        if any(g != b for g in given):
            raise OnnxfuseError(f"the shapes given set the batch size to {given[0]}", option="batches", value=str(b))
        spec = at_batch(proto, spec, dim, b)
    plain = make_session(path, level, provider, threads) if latency_ms is None else None  # unprofiled runs
    if inputs_from is not None and inputs_from != path:
        feeds = probed_inputs(inputs_from, onnx.load(inputs_from, load_external_data=False), spec, inputs_npz,
                              provider)
    else:
        feeds = probed_inputs(path, proto, spec, inputs_npz, provider, plain)
    progress("profiled runs")
    result = _profile(path, proto, feeds, provider, threads, level, runs, warmup, latency_ms, plain)
    if batches and len(batches) > 1:
        progress("batch sweep", 2.0)
        sweep = bench([path], provider=provider, threads=threads, level=level, shapes=shapes, min_runs=20,
                      budget_s=2.0, batches=batches).batches
        gain = sweep[-1].throughput["A"] / sweep[0].throughput["A"]
        result.signals = memory_bound_signals(result, gain, f"{batches[0]} to {batches[-1]}")
    if known:
        progress("what onnxfuse knows")
        result.known = notes(path, {s.op: [n.name for n in result.by_node if n.op == s.op]
                                    for s in result.remaining_costs()}, provider, level, threads)
    return result


def _profile(path: str, proto: onnx.ModelProto, feeds: dict, provider: str, threads: int, level: str, runs: int,
             warmup: int, latency_ms: float | None, plain) -> ProfileResult:
    events, plain_times = profiled_events(path, feeds, level, provider, threads, warmup + runs, plain)
    if latency_ms is None:  # unprofiled latency, measured in alternation with the profiled runs
        latency_ms = statistics.median(plain_times[warmup:]) * 1e3
    runs_ev = last_runs(events, runs)
    spans = run_spans(events, runs)
    peaks = measure_peaks(threads)
    # the profiler slows every event down; the share of that slowdown inside kernel events is subtracted
    # evenly from each event (calibrated once per process, see profiler_inside_fraction)
    kernels = kernel_events(events, runs)
    all_events = len(kernels) / runs
    run_us = statistics.median(e["dur"] for e in runs_ev)
    slowdown_us = max(0.0, run_us - latency_ms * 1e3) / max(all_events, 1.0)
    per_event_us = peaks.profiler_inside * slowdown_us
    outside_us = slowdown_us - per_event_us  # recorded inside a control-flow node for each nested event
    index = model_index(proto)
    per_node: dict[str, NodeStat] = {}
    samples: dict[str, list[float]] = {}  # node -> its time in each run (robust to outlier runs: median)
    for e in kernels:
        args = e.get("args", {})
        name = e["name"][: -len("_kernel_time")]
        st = per_node.get(name)
        if st is None:
            raw_in, raw_out = args.get("input_type_shape", []), args.get("output_type_shape", [])
            ins, outs = [d for _, d in entries(raw_in)], [d for _, d in entries(raw_out)]
            op = args.get("op_name", "?")
            info = index.get(name)
            released = (None if info is None or info.declared is None
                        else released_bytes(entries(raw_in), info.declared))
            byts = node_bytes(op, raw_in, raw_out, released, info is not None and info.view_copies)
            st = per_node[name] = NodeStat(name, op, 0, 0.0, byts, node_flops(op, ins, outs),
                                           info.replaces if info else "")
            samples[name] = [0.0] * len(spans)
        st.calls_per_run += 1
        run = next((i for i, (a, b) in enumerate(spans) if a <= e["ts"] <= b), None)
        if run is not None:
            samples[name][run] += max(0.0, e["dur"] - per_event_us - e.get("nested", 0) * outside_us)
    for name, st in per_node.items():
        st.calls_per_run /= runs
        st.total_us = statistics.median(samples[name])
    kernel_us = sum(s.total_us for s in per_node.values())
    by_type_acc: dict[str, list[NodeStat]] = defaultdict(list)
    for st in per_node.values():
        by_type_acc[st.op].append(st)
    by_type = []
    for op, sts in by_type_acc.items():
        total = sum(s.total_us for s in sts)
        calls = sum(s.calls_per_run for s in sts)
        flops = sum(s.flops * s.calls_per_run for s in sts)
        byts = sum(s.bytes * s.calls_per_run for s in sts)
        gf = flops / (total * 1e-6) / 1e9 if total else 0.0
        gb = byts / (total * 1e-6) / 1e9 if total else 0.0
        by_type.append(OpStat(op, calls, total, total / kernel_us if kernel_us else 0.0, total / max(calls, 1e-9),
                              gf, gb, gf / peaks.gflops, gb / peaks.gbytes,
                              residency(gb, max(s.bytes for s in sts), peaks)))
    by_type.sort(key=lambda s: -s.total_us)
    res = ProfileResult(path, runs, run_us / 1e3, latency_ms, kernel_us / 1e3, by_type,
                        sorted(per_node.values(), key=lambda s: -s.total_us), peaks, overhead_us=per_event_us)
    res.signals = memory_bound_signals(res)
    return res


def residency(gbytes: float, bytes_per_call: float, peaks: Peaks) -> str:
    """Where an achieved rate can have come from (see OpStat.residency and CACHE_FACTOR)."""
    if gbytes <= CACHE_FACTOR * peaks.gbytes:
        return "memory"
    return "cache" if not peaks.cache_bytes or bytes_per_call <= peaks.cache_bytes else "unexplained"


def last_level_cache_bytes() -> int:
    """The largest cache of CPU 0 (Linux sysfs); 0 when unknown."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


def memory_bound_signals(p: ProfileResult, batch_gain: float | None = None, batch_range: str = "") -> list[str]:
    """The three signals that a model is memory- or overhead-bound, in words, with the numbers behind them."""
    out = []
    idle = [s for s in p.by_type if s.flop_util < 0.10 and s.byte_util > 0.25]
    share = sum(s.share for s in idle)
    if idle:
        ops = ", ".join(f"{s.op} ({_rate_words(s)}, {s.flop_util * 100:.0f}% of peak FLOP/s)" for s in idle[:4])
        out.append(f"compute idle while traffic is high: {share * 100:.0f}% of kernel time is in ops that move data "
                   f"at over 25% of the measured {p.peaks.gbytes:.1f} GB/s but compute at under 10% of the "
                   f"measured {p.peaks.gflops:.1f} GFLOP/s: {ops}")
    else:
        out.append("compute idle while traffic is high: not seen (no op type moves data at over 25% of peak "
                   "bandwidth while under 10% of peak FLOP/s)")
    calls = sum(s.calls_per_run for s in p.by_node)
    short = [s for s in p.by_node if s.mean_us < SHORT_US]
    short_share = sum(s.total_us for s in short) / (p.kernel_ms * 1e3) if p.kernel_ms else 0.0
    verdict = "per-op overhead matters" if short_share > 0.2 else "per-op overhead is minor"
    out.append(f"many short ops: {calls:.0f} op calls per run, {len(short)} of {len(p.by_node)} nodes average under "
               f"{SHORT_US:g} us and take {short_share * 100:.0f}% of kernel time ({verdict})")
    if batch_gain is None:
        out.append("utilization vs work per op: not measured (profile with --batch 1,8 to sweep batch sizes)")
    else:
        word = "rises" if batch_gain > 1.3 else "stays flat"
        out.append(f"utilization vs work per op: throughput {word} {batch_gain:.2f}x from batch {batch_range} "
                   + ("(small batches leave compute idle: bigger work per op uses it better)" if batch_gain > 1.3
                      else "(the model is compute-bound already at small batch)"))
    return out


def _rate_words(s: OpStat) -> str:
    if s.residency == "cache":
        return f"over {CACHE_FACTOR:g}x the copy peak: data in cache"
    if s.residency == "unexplained":
        return "rate above the copy peak with more data than the cache holds: not a bandwidth"
    return f"{s.gbytes:.1f} GB/s"
