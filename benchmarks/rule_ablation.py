"""Which rules make a model faster or slower on this machine: optimize with each fired rule alone, time every
variant interleaved with the original in one process (onnxruntime CPU, ORT_ENABLE_ALL, N threads).

    python benchmarks/rule_ablation.py MODEL [--threads 1] [--runs 200] [--shape name:dims]...
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import onnxruntime as ort

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.inputs.shapes import parse_shape_specs
from onnxfuse.inputs.synth import make_inputs


def session(path: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--shape", action="append", default=[])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "all.onnx")
        res = optimize(a.model, full, OptimizeOptions(shapes=a.shape, measure=False))
        variants = {"original": a.model, "all rules": full}
        for rule in sorted(res.fired):
            p = os.path.join(tmp, f"{rule}.onnx")
            optimize(a.model, p, OptimizeOptions(shapes=a.shape, only=[rule], measure=False))
            variants[f"only {rule}"] = p
            p = os.path.join(tmp, f"no-{rule}.onnx")
            optimize(a.model, p, OptimizeOptions(shapes=a.shape, skip=[rule], measure=False))
            variants[f"all but {rule}"] = p
        import onnx

        feeds = make_inputs(onnx.load(a.model, load_external_data=False),
                              parse_shape_specs(a.shape) if a.shape else None)
        sessions = {k: session(p, a.threads) for k, p in variants.items()}
        for s in sessions.values():
            for _ in range(10):
                s.run(None, feeds)
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(a.runs):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds)
                times[k].append(time.perf_counter() - t)
        base = statistics.median(times["original"])
        print(f"{os.path.basename(a.model)}  threads={a.threads} runs={a.runs}  fired={res.fired}")
        for k, ts in times.items():
            med = statistics.median(ts)
            print(f"  {k:40s} median {med * 1e3:8.3f} ms  ratio {med / base:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
