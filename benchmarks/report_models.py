"""For each model: optimize it (defaults), bench input vs output twice (do the verdicts agree?), profile both
(does the op-time table add up to the measured latency?), the utilization figures and memory-bound signals,
and one HTML report per model.

    python -m benchmarks.report_models [--out DIR] [MODEL ...]   (default: ../shared/models/*.onnx)
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.inspect.html_report import render, write
from onnxfuse.inspect.latency import bench
from onnxfuse.inspect.op_profile import profile

HERE = os.path.dirname(os.path.abspath(__file__))
# shapes as ../shared/tools/peer_bench.py feeds them (realistic sizes for the image models)
SHAPES = {"ppocr_det_v4": ["x:1x3x320x320"], "ppocr_cls_v2": ["x:1x3x48x192"], "silero_vad_op15": ["input:1x512"],
          "bert_tiny": ["batch=1", "seq=64"], "gpt2_tiny": ["batch=1", "seq=64"], "vit_tiny": ["batch=1"],
          "resnet_mini": ["batch=1"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--out", default="/tmp/onnxfuse-reports")
    a = ap.parse_args()
    paths = a.models or sorted(glob.glob(os.path.join(HERE, "..", "..", "shared", "models", "*.onnx")))
    os.makedirs(a.out, exist_ok=True)
    print("| model | kept rewrites | bench 1: speedup, verdict | bench 2: speedup, verdict | agree | "
          "profile total / latency (in, out) | top op (out): GFLOP/s, GB/s, util |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            name = os.path.basename(p)[:-5]
            shapes = SHAPES.get(name, [])
            out = os.path.join(tmp, f"{name}.opt.onnx")
            r = optimize(p, out, OptimizeOptions(shapes=shapes))
            b1 = bench([p, out], ["input", "output"], shapes=shapes, budget_s=4.0)
            b2 = bench([p, out], ["input", "output"], shapes=shapes, budget_s=4.0)
            profs = [profile(x, shapes=shapes) for x in (p, out)]
            top = profs[1].by_type[0]
            write(os.path.join(a.out, f"{name}.html"), render(f"onnxfuse: {name}", bench=b1, profiles=profs,
                                                                labels=["input", "output"], result=r))
            print(f"| {name} | {sum(r.fired.values())} | {b1.speedup:.3f} {b1.verdict} | {b2.speedup:.3f} "
                  f"{b2.verdict} | {'yes' if b1.verdict == b2.verdict else 'NO'} | "
                  f"{profs[0].agreement * 100:.0f}%, {profs[1].agreement * 100:.0f}% | {top.op}: {top.gflops:.1f}, "
                  f"{top.gbytes:.1f}, {top.flop_util * 100:.0f}% / {top.byte_util * 100:.0f}% |", flush=True)
            for s in profs[1].signals:
                print(f"|   | {s} |||||")
    return 0


if __name__ == "__main__":
    sys.exit(main())
