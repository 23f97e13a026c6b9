#!/usr/bin/env python3
"""The inputs onnxfuse chooses, and what `optimize --no-measure` costs against the model's own inference (issue 15).

Usage::

    python -m benchmarks.inputs_table MODEL.onnx [MODEL.onnx ...] [--out DIR] [--timeout 600]

For every model, one process at a time (each under ``/usr/bin/time``: wall seconds and peak RSS):

1. ``onnxfuse optimize MODEL OUT --no-measure --json``: the shapes chosen (every profile's), each dynamic
   dim's value and why, the tries that failed, wall time and peak RSS (or the one-line error);
2. the model's own inference peak at those shapes: a separate process writes the feeds of every profile to an
   .npz (``find_inputs`` with the chosen shapes, no probing), then a minimal process creates one onnxruntime CPU
   session at ORT_ENABLE_ALL and runs each profile once; its peak RSS is the reference ("x inf" = onnxfuse's
   peak over it; the target is about 3x).

Prints a markdown table, then each model's dims with their why. Outputs go to DIR (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TIME = "/usr/bin/time"

FEEDS = r"""
import sys, json, numpy as np
from onnxfuse import find_inputs
for i, shapes in enumerate(json.loads(sys.argv[2])):
    spec = [f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items() if v]
    plan = find_inputs(sys.argv[1], spec, probe=False)
    np.savez(f"{sys.argv[3]}.{i}.npz", **plan.feeds)
"""

INFER = r"""
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = 1; so.log_severity_level = 3
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
for path in sys.argv[2:]:
    s.run(None, dict(np.load(path)))
"""


def timed(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run under /usr/bin/time: rc, wall seconds, peak RSS (bytes), stdout, last stderr line."""
    fmt = "@@TIME %e %M"
    try:
        p = subprocess.run([TIME, "-f", fmt, *cmd], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "wall_s": timeout, "peak": 0, "stdout": "", "err": f"timed out after {timeout:.0f} s"}
    lines = p.stderr.strip().splitlines()
    stat = next((ln for ln in reversed(lines) if ln.startswith("@@TIME")), "@@TIME 0 0").split()
    err = [ln for ln in lines if not ln.startswith("@@TIME") and ln.strip()]
    return {"rc": p.returncode, "wall_s": float(stat[1]), "peak": int(stat[2]) * 1024, "stdout": p.stdout,
            "err": err[-1] if err else ""}


def measure(model: str, out_dir: str, timeout: float) -> dict[str, Any]:
    name = Path(model).stem
    out = os.path.join(out_dir, f"{name}.opt.onnx")
    opt = timed([os.path.join(os.path.dirname(sys.executable), "onnxfuse"), "optimize", model, out, "--no-measure", "--json", "--force"],
                timeout)
    row: dict[str, Any] = {"model": name, "size_mb": os.path.getsize(model) / 2**20, "opt": opt}
    if opt["rc"] != 0:
        return row
    data = json.loads(opt["stdout"])
    profiles = data.get("profiles") or [{"name": "default", "inputs": data["inputs"]}]
    row["profiles"] = [(p["name"], p["inputs"]) for p in profiles]
    row["peak_rss_bytes"] = data.get("peak_rss_bytes", 0)
    feeds = os.path.join(out_dir, f"{name}.feeds")
    shapes = json.dumps([p["inputs"]["shapes"] for p in profiles])
    made = timed([sys.executable, "-c", FEEDS, model, shapes, feeds], timeout)
    if made["rc"] != 0:
        row["infer"] = {"rc": made["rc"], "err": made["err"], "peak": 0}
        return row
    row["infer"] = timed([sys.executable, "-c", INFER, model,
                          *[f"{feeds}.{i}.npz" for i in range(len(profiles))]], timeout)
    return row


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB" if n else "-"


def _shapes(inputs: dict) -> str:
    return ", ".join(f"{k}[{'x'.join(map(str, v))}]" for k, v in inputs["shapes"].items())


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| model | MB | shapes chosen | optimize --no-measure | peak RSS | inference peak | x inf |",
           "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        opt = r["opt"]
        if opt["rc"] != 0:
            out.append(f"| {r['model']} | {r['size_mb']:.0f} | FAILED: {opt['err'][:160]} | {opt['wall_s']:.1f} s | "
                       f"{_mb(opt['peak'])} | - | - |")
            continue
        shapes = "<br>".join((f"{n}: " if len(r["profiles"]) > 1 else "") + _shapes(p) for n, p in r["profiles"])
        inf = r.get("infer", {}).get("peak", 0) if r.get("infer", {}).get("rc") == 0 else 0
        ratio = f"{opt['peak'] / inf:.1f}" if inf else "-"
        out.append(f"| {r['model']} | {r['size_mb']:.0f} | {shapes} | {opt['wall_s']:.1f} s | {_mb(opt['peak'])} | "
                   f"{_mb(inf)} | {ratio} |")
    return "\n".join(out)


def details(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        if r["opt"]["rc"] != 0:
            out.append(f"- **{r['model']}**: {r['opt']['err']}")
            continue
        for name, inputs in r["profiles"]:
            dims = "; ".join(f"{d['dim']}={d['value']} ({d['role']}: {d['why']})" for d in inputs["dims"])
            tried = f" — did not run: {' | '.join(inputs['tried'])}" if inputs["tried"] else ""
            out.append(f"- **{r['model']}** [{name}]: {dims or 'all dims fixed'}{tried}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", default=None, help="folder for the optimized models and feeds")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="onnxfuse-inputs-table-")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for m in args.models:
        rows.append(measure(m, out_dir, args.timeout))
        print(f"... {rows[-1]['model']}: rc={rows[-1]['opt']['rc']} {rows[-1]['opt']['wall_s']:.1f} s", file=sys.stderr)
    print(table(rows))
    print()
    print(details(rows))


if __name__ == "__main__":
    main()
