#!/usr/bin/env python3
"""The NCHWc layout rules (patterns/layout.yaml) alone, per model: how many reorders onnxruntime's CPU provider
inserts before and after, and the latency of the rewritten model against its input, interleaved.

Usage::

    python -m corpora.membound /tmp/membound
    python -m benchmarks.nchwc_layout /tmp/membound/*.onnx [--rule se-gate-broadcast] [--budget 6]

For each model: ``onnxfuse.optimize`` with only the named rules of patterns/layout.yaml (validated, no measured
selection, so every match is rewritten), then onnxruntime (ORT_ENABLE_ALL, 1 thread) on the input and on the
output, saved with ``optimized_model_filepath``: the count of ReorderOutput / ReorderInput nodes in each; then
``onnxfuse.bench`` of input (A) and output (B), interleaved, with its A/A control. One line per model: rewrites,
reorders before -> after, B/A latency ratio with its 95% CI, the A/A control and the verdict. Heavy: run it
alone on the machine (timing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

import onnx
import onnxruntime as ort

import onnxfuse

LAYOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "patterns", "layout.yaml")


def reorders(path: str, tmp: str) -> tuple[int, int]:
    """(ReorderOutput, ReorderInput) nodes in what onnxruntime runs for this model at ORT_ENABLE_ALL."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.optimized_model_filepath = os.path.join(tmp, "ort_optimized.onnx")
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ops = Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)
    return ops["ReorderOutput"], ops["ReorderInput"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rule", action="append", help="rule ids of layout.yaml to use (default: all)")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of interleaved timing per model")
    ap.add_argument("--shape", action="append", default=[], help="as onnxfuse optimize --shape")
    args = ap.parse_args()
    print("| model | rewrites | reorders (out+in) before -> after | after/before latency (95% CI) | A/A | verdict |")
    print("|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for src in args.models:
            name = os.path.splitext(os.path.basename(src))[0]
            out = os.path.join(tmp, name + ".layout.onnx")
            r = onnxfuse.optimize(src, out, onnxfuse.OptimizeOptions(
                patterns=[LAYOUT], builtin=False, only=args.rule, measure=False, shapes=args.shape or None))
            fired = ", ".join(f"{k} {v}" for k, v in sorted(r.fired.items())) or "none"
            ro0, ri0 = reorders(src, tmp)
            ro1, ri1 = reorders(out, tmp)
            if not r.fired:
                print(f"| {name} | none | {ro0}+{ri0} | - | - | - |", flush=True)
                continue
            b = onnxfuse.bench([src, out], shapes=args.shape or None, budget_s=args.budget)
            ratio, ctl = b.ratio, b.control
            print(f"| {name} | {fired} | {ro0}+{ri0} -> {ro1}+{ri1} | {ratio.median:.3f} ({ratio.low:.3f}.."
                  f"{ratio.high:.3f}) | {ctl.median:.3f} | {b.verdict} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
