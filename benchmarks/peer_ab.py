"""Direct interleaved A/B of onnxfuse against onnxslim and onnxscript's ort_fusions, one model at a time.

peer_bench.py times its variants one after another, so on a noisy machine a model's ratios drift between runs.
Here each peer's output and onnxfuse's are timed interleaved in one process (`onnxfuse bench`), with an A/A
control session, at the shapes peer_bench uses. Prints one line per model and peer: onnxfuse's time / the
peer's, with its 95% CI and the verdict.

    python -m benchmarks.peer_ab                      # every model in ../shared/models
    python -m benchmarks.peer_ab path/to/model.onnx --shape batch=1 --shape seq=64
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models")
# the shapes ../shared/tools/peer_bench.py feeds (SHAPES/DIMS there)
SHAPES = {
    "silero_vad_op15": ["input:1x512", "state:2x1x128"],
    "ppocr_det_v4": ["x:1x3x320x320"],
    "ppocr_cls_v2": ["x:1x3x48x192"],
    "bert_tiny": ["batch=1", "seq=64"],
    "gpt2_tiny": ["batch=1", "seq=64"],
    "vit_tiny": ["batch=1"],
    "resnet_mini": ["batch=1"],
}


def peers(src: str, tmp: str) -> dict[str, str]:
    warnings.filterwarnings("ignore")
    out: dict[str, str] = {}
    base = os.path.splitext(os.path.basename(src))[0]
    try:
        import onnxslim

        out["onnxslim"] = os.path.join(tmp, base + ".slim.onnx")
        onnxslim.slim(src, out["onnxslim"])
    except Exception as e:  # a peer failing is a result, not a crash
        print(f"{base}: onnxslim failed: {e!r:.120}")
        out.pop("onnxslim", None)
    try:
        import onnx_ir as ir
        from onnxscript.rewriter import ort_fusions

        model = ir.load(src)
        ort_fusions.optimize_for_ort(model)
        out["onnxscript"] = os.path.join(tmp, base + ".onnxscript.onnx")
        ir.save(model, out["onnxscript"])
    except Exception as e:
        print(f"{base}: onnxscript failed: {e!r:.120}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="default: every model in ../shared/models")
    ap.add_argument("--shape", action="append", default=[], help="for explicitly given models")
    a = ap.parse_args()
    models = a.models or sorted(os.path.join(SHARED, f) for f in os.listdir(SHARED) if f.endswith(".onnx"))
    with tempfile.TemporaryDirectory() as tmp:
        for src in models:
            base = os.path.splitext(os.path.basename(src))[0]
            shapes = [x for s in (a.shape if a.models else SHAPES.get(base, [])) for x in ("--shape", s)]
            ours = os.path.join(tmp, base + ".onnxfuse.onnx")
            done = subprocess.run(["onnxfuse", "optimize", src, ours], capture_output=True, text=True)
            if done.returncode:
                print(f"{base}: onnxfuse failed: {done.stderr.strip()[-200:]}")
                continue
            for peer, path in peers(src, tmp).items():
                res = subprocess.run(["onnxfuse", "bench", path, ours, *shapes], capture_output=True, text=True)
                line = next((ln for ln in res.stdout.splitlines() if ln.startswith("B vs A")), res.stderr[-200:])
                print(f"{base:16s} onnxfuse vs {peer:10s} {line.removeprefix('B vs A: ')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
