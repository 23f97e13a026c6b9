"""Which rules make a model faster or slower on this machine: optimize with each fired rule alone and with every
rule but it, and compare each variant with the original by the tool's own protocol (onnxfuse.measure.compare:
A/A pairs, sessions made twice, interleaved, a verdict beyond the noise floor; onnxruntime CPU, ORT_ENABLE_ALL).

    python -m benchmarks.rule_ablation MODEL [--threads 1] [--seconds 2] [--shape name:dims]...

About (2 x rules fired + 1) x 2-6 seconds of timing, plus one optimize per variant.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import onnx

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.inputs.shapes import parse_shape_specs
from onnxfuse.inputs.synth import make_inputs
from onnxfuse.measure.compare import compare


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of runs per comparison (at least)")
    ap.add_argument("--shape", action="append", default=[])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "all.onnx")
        res = optimize(a.model, full, OptimizeOptions(shapes=a.shape, measure=False))
        variants = {"all rules": full}
        for rule in sorted(res.fired):
            p = os.path.join(tmp, f"{rule}.onnx")
            optimize(a.model, p, OptimizeOptions(shapes=a.shape, only=[rule], measure=False))
            variants[f"only {rule}"] = p
            p = os.path.join(tmp, f"no-{rule}.onnx")
            optimize(a.model, p, OptimizeOptions(shapes=a.shape, skip=[rule], measure=False))
            variants[f"all but {rule}"] = p
        feeds = make_inputs(onnx.load(a.model, load_external_data=False),
                            parse_shape_specs(a.shape) if a.shape else None)
        print(f"{os.path.basename(a.model)}  threads={a.threads}  fired={res.fired}")
        for k, path in variants.items():
            c = compare(a.model, path, feeds, threads=a.threads, seconds=a.seconds)
            print(f"  {k:40s} {c.line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
