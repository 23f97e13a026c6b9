#!/usr/bin/env python3
"""Measured selection on models of realistic size, quiet and under load: does the default run keep the same
rewrites whether or not other onnxruntime work shares the machine, never fall back to keeping nothing, and stay
within the budget it prints?

    python -m benchmarks.selection_stability MODEL[:DIM=V,DIM=V] ...  [--load N] [--unlimited S] [--no-measure]
    python -m benchmarks.selection_stability --manifest /path/manifest.json ../shared/models/bert_tiny.onnx

For each model, each in its own `onnxfuse optimize --no-cache --json` process (fresh, no decision cache):
  1. quiet: the default run; kept op counts, the confirmation's effect (output / input), the measuring
     phase's budget and what it spent (budget clock) and its wall time, peak RSS;
  2. loaded: the same while N (default: one per core) other processes run onnxruntime sessions of other models in
     a loop (started before, stopped after, by this script; each stops by itself after --load-seconds too);
  3. with --unlimited S: the default against `--measure-budget S` (quiet);
  4. with --no-measure: every validated rewrite kept, then `onnxfuse bench input output` for its effect.
Prints one markdown table, then each model's report lines that say what measuring did ("measure:" lines).
A manifest (a JSON list of {"file", "shape_flags"}: "DIM=V" each, or as CLI flags) adds its models.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("ONNXFUSE_SHARED_MODELS", os.path.join(ROOT, "..", "shared", "models"))  # the load's models
# one load process: an onnxruntime session of a model run in a loop until its deadline or its parent is gone
LOAD = """
import os, sys, time
import numpy as np, onnxruntime as ort
end, parent = time.monotonic() + float(sys.argv[2]), os.getppid()
so = ort.SessionOptions(); so.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
feeds = {}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else (128 if "seq" in str(d) else 1) for d in i.shape]
    dt = np.int64 if "int64" in i.type else np.float32
    feeds[i.name] = np.ones(shape, dt) if dt is np.int64 else np.random.default_rng(0).standard_normal(shape).astype(dt)
while time.monotonic() < end and os.getppid() == parent:
    s.run(None, feeds)
"""
LOAD_MODELS = ("vit_tiny.onnx", "bert_tiny.onnx", "resnet_mini.onnx", "gpt2_tiny.onnx")


def start_load(n: int, seconds: float) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        path = os.path.join(SHARED, LOAD_MODELS[i % len(LOAD_MODELS)])
        procs.append(subprocess.Popen([sys.executable, "-c", LOAD, path, str(seconds)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(3.0)  # sessions made, loops running
    dead = [p.args[3] for p in procs if p.poll() is not None]
    if dead:
        raise SystemExit(f"load processes ended at once: {', '.join(dead)}")
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def optimize(model: str, shapes: list[str], out: str, extra: list[str]) -> dict:
    """One `onnxfuse optimize --no-cache --json` in its own process: the result, wall seconds, peak RSS."""
    args = [sys.executable, "-m", "onnxfuse.cli", "optimize", model, out, "--no-cache", "--json", *extra]
    for s in shapes:
        args += ["--shape", s]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:], "wall": wall}
    res = json.loads(p.stdout)
    res["_wall"], res["_rss_mb"] = wall, (rss if rss > before else 0) / 1024
    return res


def bench(a: str, b: str, shapes: list[str]) -> float | None:
    args = [sys.executable, "-m", "onnxfuse.cli", "bench", a, b, "--json"]
    for s in shapes:
        args += ["--shape", s]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    data = json.loads(p.stdout)
    ratio = data.get("speedup_ratio") or data.get("ratio") or (data.get("comparison") or {}).get("ratio")
    return ratio["median"] if isinstance(ratio, dict) else ratio


def summary(res: dict) -> dict:
    if "error" in res:
        return {"ops": None, "effect": None, "note": "error: " + " ".join(res["error"]), "wall": res["wall"]}
    m = res.get("measure") or {}
    final = m.get("final_ratio")
    before, after = res.get("ops_before", {}), res.get("ops_after", {})
    changed = {k: after.get(k, 0) for k in sorted(set(before) | set(after)) if before.get(k, 0) != after.get(k, 0)}
    return {"ops": changed, "effect": final["median"] if final else None, "note": m.get("note", ""),
            "budget": m.get("budget_s"), "spent": m.get("spent_s"), "measure_wall": m.get("seconds"),
            "wall": res["_wall"], "rss": res["_rss_mb"], "nodes": res.get("nodes_before"),
            "confirmed": m.get("confirmed", ""), "undecided": m.get("undecided", 0)}


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="MODEL[:DIM=V,DIM=V]")
    ap.add_argument("--manifest", help="a JSON list of {file, shape_flags}")
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2, help="load processes (default: one per core)")
    ap.add_argument("--load-seconds", type=float, default=1800.0, help="each load process stops by itself after this")
    ap.add_argument("--unlimited", type=float, default=0.0, help="also run with --measure-budget S (quiet)")
    ap.add_argument("--no-measure", action="store_true", help="also run --no-measure and bench its output")
    ap.add_argument("--json", help="write every result here")
    a = ap.parse_args(argv)
    models: list[tuple[str, list[str]]] = []
    for spec in a.models:
        path, _, dims = spec.partition(":")
        models.append((path, [d for d in dims.split(",") if d]))
    if a.manifest:
        # shape_flags: "DIM=V" each, or written as CLI flags ("--shape", "DIM=V", ...)
        models += [(m["file"], [f for f in m.get("shape_flags", []) if f != "--shape"])
                   for m in json.load(open(a.manifest))]
    rows, out_all = [], {}
    tmp = tempfile.mkdtemp(prefix="selstab-")
    for path, shapes in models:
        name = os.path.basename(path)[:-5]
        r: dict = {"mb": os.path.getsize(path) / 2**20}
        r["quiet"] = summary(optimize(path, shapes, os.path.join(tmp, f"{name}.q.onnx"), []))
        procs = start_load(a.load, a.load_seconds)
        try:
            load_avg = os.getloadavg()[0]
            r["loaded"] = summary(optimize(path, shapes, os.path.join(tmp, f"{name}.l.onnx"), []))
            r["loaded"]["load"] = max(load_avg, os.getloadavg()[0])
        finally:
            stop_load(procs)
        if a.unlimited:
            r["unlimited"] = summary(optimize(path, shapes, os.path.join(tmp, f"{name}.u.onnx"),
                                              ["--measure-budget", str(a.unlimited)]))
        if a.no_measure:
            nm = os.path.join(tmp, f"{name}.n.onnx")
            r["no_measure"] = summary(optimize(path, shapes, nm, ["--no-measure"]))
            r["no_measure"]["effect"] = bench(path, nm, shapes) if os.path.exists(nm) else None
        out_all[name] = r
        q, lo = r["quiet"], r["loaded"]
        same = q["ops"] is not None and q["ops"] == lo["ops"]
        rows.append((name, r, same))
        print(f"{name}: quiet {fmt(q['effect'])} {q['ops']}  loaded {fmt(lo['effect'])} {lo['ops']}  same={same}",
              file=sys.stderr, flush=True)
    print("| model | MB | nodes | quiet: effect, changed ops, spent/budget (wall) | loaded (load avg): effect, "
          "spent/budget (wall) | same ops | Δ effect | unlimited | --no-measure |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r, same in rows:
        q, lo = r["quiet"], r["loaded"]
        u, n = r.get("unlimited", {}), r.get("no_measure", {})
        d = abs(q["effect"] - lo["effect"]) if q["effect"] is not None and lo["effect"] is not None else None
        print(f"| {name} | {r['mb']:.0f} | {q.get('nodes', '-')} | {fmt(q['effect'])}, {_ops(q['ops'])}, "
              f"{fmt(q.get('spent'), '.0f')}/{fmt(q.get('budget'), '.0f')} s ({q['wall']:.0f} s) | "
              f"{fmt(lo['effect'])} ({fmt(lo.get('load'), '.1f')}), {fmt(lo.get('spent'), '.0f')}/"
              f"{fmt(lo.get('budget'), '.0f')} s ({lo['wall']:.0f} s) | {'yes' if same else 'NO'} | {fmt(d)} | "
              f"{fmt(u.get('effect'))} | {fmt(n.get('effect'))} |")
    for name, r, _ in rows:
        for k in ("quiet", "loaded", "unlimited", "no_measure"):
            if k in r and r[k].get("note"):
                print(f"- {name} {k}: {r[k]['note']}")
            if k in r and k != "no_measure" and r[k].get("ops") is not None:
                print(f"- {name} {k}: ops {r[k]['ops']}; undecided {r[k].get('undecided')}; "
                      f"confirmed {r[k].get('confirmed')}; peak RSS {fmt(r[k].get('rss'), '.0f')} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out_all, f, indent=1)
    return 0


def _ops(ops: dict | None) -> str:
    if ops is None:
        return "error"
    fused = {k.split(".")[-1]: v for k, v in ops.items() if k.startswith("com.microsoft") and v}
    return ", ".join(f"{k} {v}" for k, v in fused.items()) or f"{len(ops)} op types changed"


if __name__ == "__main__":
    sys.exit(main())
