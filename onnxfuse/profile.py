"""Where the time goes: onnxruntime's profiler per op type and per node, bytes moved and FLOPs per node (from
the shapes the profiler records), achieved FLOP/s and bytes/s against peaks measured on this machine, and the
three memory-bound signals in plain words."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import validate as V
from .bench import run_times

DTYPE_BYTES = {"float": 4, "float16": 2, "bfloat16": 2, "double": 8, "int64": 8, "int32": 4, "int8": 1,
               "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "uint32": 4, "uint64": 8}
SHORT_US = 5.0  # an op call shorter than this is dominated by per-op overhead
CONV_OPS = {"Conv", "FusedConv", "NhwcConv", "NhwcFusedConv", "QLinearConv", "ConvInteger"}
MATMUL_OPS = {"MatMul", "FusedMatMul", "MatMulInteger", "MatMulNBits", "TransposeMatMul", "QLinearMatMul"}
GEMM_OPS = {"Gemm", "FusedGemm"}
NORM_OPS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
            "SkipSimplifiedLayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNorm",
            "EmbedLayerNormalization"}


@dataclass
class Peaks:
    gflops: float  # measured GEMM FLOP/s (GFLOP/s) at the profiling thread count
    gbytes: float  # measured memory copy bandwidth (GB/s, read + write)
    profiler_inside: float = 0.0  # fraction of the profiler's slowdown inside kernel events (calibrated)


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
    gbytes: float  # achieved
    flop_util: float
    byte_util: float


@dataclass
class ProfileResult:
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

    @property
    def agreement(self) -> float:
        """Kernel time total / measured latency (1.0 = the table accounts for all of it)."""
        return self.kernel_ms / self.latency_ms if self.latency_ms else 0.0

    def to_json(self) -> dict:
        return {
            "path": self.path, "runs": self.runs, "run_ms": self.run_ms, "latency_ms": self.latency_ms,
            "kernel_ms": self.kernel_ms, "agreement": self.agreement, "peaks": self.peaks.__dict__,
            "profiler_overhead_us_per_call": self.overhead_us,
            "by_type": [s.__dict__ for s in self.by_type],
            "by_node": [{**s.__dict__, "mean_us": s.mean_us} for s in self.by_node],
            "signals": self.signals,
        }


def _shape_bytes(entries: list[dict]) -> tuple[float, list[list[int]]]:
    total, shapes = 0.0, []
    for e in entries or []:
        for dtype, dims in e.items():
            shapes.append(list(dims))
            total += float(np.prod(dims) if dims else 1) * DTYPE_BYTES.get(dtype, 4)
    return total, shapes


def node_flops(op: str, ins: list[list[int]], outs: list[list[int]]) -> float:
    """FLOPs of one call from its input/output shapes (multiply-add = 2)."""
    out_elems = float(np.prod(outs[0])) if outs and outs[0] else 1.0
    if op in CONV_OPS and len(ins) > 1:
        return 2.0 * out_elems * float(np.prod(ins[1][1:]))
    if op == "ConvTranspose" and len(ins) > 1:
        return 2.0 * float(np.prod(ins[0])) * float(np.prod(ins[1][1:]))
    if op in MATMUL_OPS and ins and ins[0]:
        return 2.0 * out_elems * ins[0][-1]
    if op in GEMM_OPS and len(ins) > 1 and outs:
        k = float(np.prod(ins[0])) / max(outs[0][0], 1)
        return 2.0 * out_elems * k
    if op in ("Attention", "MultiHeadAttention") and ins and len(ins[0]) == 3:
        b, s, h = ins[0]
        return 2.0 * b * s * h * 3 * h + 4.0 * b * s * s * h
    if op in NORM_OPS:
        return 8.0 * out_elems
    if op == "Softmax":
        return 5.0 * out_elems
    return out_elems


_PEAKS: dict[int, Peaks] = {}


def measure_peaks(threads: int = 1) -> Peaks:
    """Compute peak: the better of a GEMM (onnxruntime MatMul, 1024^3) and a 3x3 convolution probe, best of
    12 runs each; bandwidth: a memory copy (numpy, 128 MiB, best of 5)."""
    if threads in _PEAKS:
        return _PEAKS[threads]
    import onnx.helper as oh

    n = 1024
    b = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    g = oh.make_graph([oh.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                      [oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [n, n])],
                      [oh.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n, n])],
                      [onnx.numpy_helper.from_array(b, "b")])  # constant B: onnxruntime pre-packs it
    s = V.make_session(oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8).SerializeToString(),
                       "all", "cpu", threads)
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
    _PEAKS[threads] = Peaks(gflops, gbytes, profiler_inside_fraction(threads))
    return _PEAKS[threads]


def _conv_probe_gflops(threads: int) -> float:
    """A 3x3 convolution, 64 -> 64 channels on 56x56 (the shape class where onnxruntime's NCHWc kernels shine)."""
    import onnx.helper as oh

    w = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32)
    g = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 56, 56])],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 56, 56])],
                      [onnx.numpy_helper.from_array(w, "w")])
    s = V.make_session(oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8).SerializeToString(),
                       "all", "cpu", threads)
    feeds = {"x": np.ones((1, 64, 56, 56), np.float32)}
    flops = 2.0 * 64 * 56 * 56 * 64 * 9
    return flops / min(run_times(s, feeds, 12, warmup=2)) / 1e9


def profiler_inside_fraction(threads: int = 1) -> float:
    """Which fraction of the profiler's slowdown lands inside the kernel events it records: on a chain of 200
    one-element Neg kernels (no real work), (kernel sum - unprofiled latency) / (profiled run - unprofiled
    latency). Median of three alternating measurements."""
    return statistics.median(_chain_fraction(threads) for _ in range(3))


def _chain_fraction(threads: int, chain: int = 200, runs: int = 40) -> float:
    import onnx.helper as oh

    nodes = [oh.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(chain)]
    g = oh.make_graph(nodes, "calib", [oh.make_tensor_value_info("v0", onnx.TensorProto.FLOAT, [1])],
                      [oh.make_tensor_value_info(f"v{chain}", onnx.TensorProto.FLOAT, [1])])
    data = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8).SerializeToString()
    feeds = {"v0": np.ones(1, np.float32)}
    plain = V.make_session(data, "all", "cpu", threads)
    events, plain_times = _profiled_events(data, feeds, "all", "cpu", threads, 10 + runs, plain)
    latency = statistics.median(plain_times[10:]) * 1e6
    kernels = statistics.median(_per_run_kernel_us(events, runs))
    run = statistics.median(e["dur"] for e in _last_runs(events, runs))
    return min(1.0, max(0.0, (kernels - latency) / max(run - latency, 1e-9)))


def _profiled_events(model: str | bytes, feeds: dict, level: str, provider: str, threads: int, n: int,
                     plain=None) -> tuple[list[dict], list[float]]:
    """Profiled runs; with `plain` (an unprofiled session of the same model) its runs alternate with the
    profiled ones, so both see the same machine state. Returns the events and the plain run times (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = V.make_session(model, level, provider, threads, profile_prefix=os.path.join(tmp, "prof"))
        plain_times: list[float] = []
        for _ in range(n):
            if plain is not None:
                plain_times.extend(run_times(plain, feeds, 1))
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            return json.load(f), plain_times


def _last_runs(events: list[dict], runs: int) -> list[dict]:
    return sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-runs:]


CONTROL_FLOW = {"If", "Loop", "Scan"}  # their events include their subgraphs' nodes, which are listed themselves


def _kernel_events(events: list[dict], runs: int) -> list[dict]:
    """Kernel events of the last `runs` runs. A control-flow node's duration is reduced to its own time
    (its subgraph's kernels are events of their own), so nothing is counted twice."""
    start = _last_runs(events, runs)[0]["ts"]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
               and e["ts"] >= start]
    out = []
    for e in kernels:
        if e.get("args", {}).get("op_name") in CONTROL_FLOW:
            end = e["ts"] + e["dur"]
            inner = [k for k in kernels if k is not e and e["ts"] <= k["ts"] and k["ts"] + k["dur"] <= end]
            e = {**e, "dur": max(0.0, e["dur"] - sum(k["dur"] for k in inner)), "nested": len(inner)}
        out.append(e)
    return out


def _run_index(events: list[dict], runs: int) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in _last_runs(events, runs)]


def _per_run_kernel_us(events: list[dict], runs: int) -> list[float]:
    spans = _run_index(events, runs)
    totals = [0.0] * len(spans)
    for e in _kernel_events(events, runs):
        for i, (a, b) in enumerate(spans):
            if a <= e["ts"] <= b:
                totals[i] += e["dur"]
                break
    return totals


def _provenance(path: str) -> dict[str, str]:
    m = onnx.load(path, load_external_data=False)
    out = {}
    for n in m.graph.node:
        if n.doc_string.startswith("onnxfuse:"):
            replaced = n.doc_string.split("replaced=", 1)[-1]
            out[n.name] = replaced
            for o in n.output:  # onnxruntime's NCHWc transform renames a conv after its output value
                out[f"{o}_nchwc"] = replaced
    return out


def profile(path: str, provider: str = "cpu", threads: int = 1, level: str = "all", runs: int = 30,
            warmup: int = 10, shapes: list[str] | None = None, inputs_npz: str | None = None,
            latency_ms: float | None = None) -> ProfileResult:
    spec = V.parse_shape_specs(shapes) if shapes else None
    proto = onnx.load(path, load_external_data=False)
    feeds = V.make_inputs(proto, spec, inputs_npz)
    plain = V.make_session(path, level, provider, threads) if latency_ms is None else None
    events, plain_times = _profiled_events(path, feeds, level, provider, threads, warmup + runs, plain)
    if latency_ms is None:  # unprofiled latency, measured in alternation with the profiled runs
        latency_ms = statistics.median(plain_times[warmup:]) * 1e3
    runs_ev = _last_runs(events, runs)
    spans = _run_index(events, runs)
    peaks = measure_peaks(threads)
    # the profiler slows every event down; the share of that slowdown inside kernel events is subtracted
    # evenly from each event (calibrated once per process, see profiler_inside_fraction)
    kernel_events = _kernel_events(events, runs)
    all_events = len(kernel_events) / runs
    run_us = statistics.median(e["dur"] for e in runs_ev)
    slowdown_us = max(0.0, run_us - latency_ms * 1e3) / max(all_events, 1.0)
    per_event_us = peaks.profiler_inside * slowdown_us
    outside_us = slowdown_us - per_event_us  # recorded inside a control-flow node for each nested event
    prov = _provenance(path)
    per_node: dict[str, NodeStat] = {}
    samples: dict[str, list[float]] = {}  # node -> its time in each run (robust to outlier runs: median)
    for e in kernel_events:
        args = e.get("args", {})
        name = e["name"][: -len("_kernel_time")]
        st = per_node.get(name)
        if st is None:
            b_in, ins = _shape_bytes(args.get("input_type_shape", []))
            b_out, outs = _shape_bytes(args.get("output_type_shape", []))
            op = args.get("op_name", "?")
            st = per_node[name] = NodeStat(name, op, 0, 0.0, b_in + b_out, node_flops(op, ins, outs),
                                           prov.get(name, ""))
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
                              gf, gb, gf / peaks.gflops, gb / peaks.gbytes))
    by_type.sort(key=lambda s: -s.total_us)
    res = ProfileResult(path, runs, run_us / 1e3, latency_ms, kernel_us / 1e3, by_type,
                        sorted(per_node.values(), key=lambda s: -s.total_us), peaks, overhead_us=per_event_us)
    res.signals = memory_bound_signals(res)
    return res


def memory_bound_signals(p: ProfileResult, batch_gain: float | None = None, batch_range: str = "") -> list[str]:
    """The three signals that a model is memory- or overhead-bound, in words, with the numbers behind them."""
    out = []
    idle = [s for s in p.by_type if s.flop_util < 0.10 and s.byte_util > 0.25]
    share = sum(s.share for s in idle)
    if idle:
        ops = ", ".join(f"{s.op} ({s.gbytes:.1f} GB/s, {s.flop_util * 100:.0f}% of peak FLOP/s)" for s in idle[:4])
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
