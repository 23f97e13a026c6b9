"""onnxruntime's profiler, read: profiled runs (alternating with unprofiled ones of the same model), the events
of the last runs, kernel time per run with control-flow nodes reduced to their own time, and how much of the
profiler's own slowdown lands inside the kernel events (calibrated on a chain of no-op kernels)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile

import numpy as np
import onnx

from ..measure.timing import run_times
from ..model_proto import make_model
from ..op_cost import CONTROL_FLOW
from ..targets import HOST
from ..validate.runtime import make_session

__all__ = ["kernel_events", "last_runs", "per_run_kernel_us", "profiled_events", "profiler_inside_fraction",
           "run_spans"]


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
    data = make_model(g, {"": 13}).SerializeToString()
    feeds = {"v0": np.ones(1, np.float32)}
    plain = make_session(data, "all", HOST, threads)
    events, plain_times = profiled_events(data, feeds, "all", HOST, threads, 10 + runs, plain)
    latency = statistics.median(plain_times[10:]) * 1e6
    kernels = statistics.median(per_run_kernel_us(events, runs))
    run = statistics.median(e["dur"] for e in last_runs(events, runs))
    return min(1.0, max(0.0, (kernels - latency) / max(run - latency, 1e-9)))


def profiled_events(model: str | bytes, feeds: dict, level: str, provider: str, threads: int, n: int,
                     plain=None) -> tuple[list[dict], list[float]]:
    """Profiled runs; with `plain` (an unprofiled session of the same model) its runs alternate with the
    profiled ones, so both see the same machine state. Returns the events and the plain run times (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = make_session(model, level, provider, threads, profile_prefix=os.path.join(tmp, "prof"))
        plain_times: list[float] = []
        for _ in range(n):
            if plain is not None:
                plain_times.extend(run_times(plain, feeds, 1))
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            return json.load(f), plain_times


def last_runs(events: list[dict], runs: int) -> list[dict]:
    return sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-runs:]


def kernel_events(events: list[dict], runs: int) -> list[dict]:
    """Kernel events of the last `runs` runs. A control-flow node's duration is reduced to its own time
    (its subgraph's kernels are events of their own), so nothing is counted twice."""
    start = last_runs(events, runs)[0]["ts"]
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


def run_spans(events: list[dict], runs: int) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in last_runs(events, runs)]


def per_run_kernel_us(events: list[dict], runs: int) -> list[float]:
    spans = run_spans(events, runs)
    totals = [0.0] * len(spans)
    for e in kernel_events(events, runs):
        for i, (a, b) in enumerate(spans):
            if a <= e["ts"] <= b:
                totals[i] += e["dur"]
                break
    return totals
