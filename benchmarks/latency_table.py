#!/usr/bin/env python3
"""Latency of onnxfuse's output against its peers', per shape profile (prefill and decode for a decoder with a
KV cache) and per thread count, all variants interleaved in one process.

Usage::

    python -m benchmarks.latency_table /tmp/corpus/llama_kv_ts17.onnx /tmp/corpus/bert_base_ts17.onnx \\
        --threads 1,2 --budget 6 --json /tmp/latency.json
    python -m benchmarks.latency_table X.onnx --onnxfuse-args "--threads 2"   # onnxfuse measured at 2 threads

For each model it builds, in a temporary folder:

* ``onnxfuse``: ``onnxfuse optimize IN OUT`` (the default: measured selection; ``--onnxfuse-args`` adds flags);
* ``ortx``: onnxruntime's transformers optimizer (``optimize_model``, model type from the file name, see
  ``benchmarks/family_table.py``);
* ``onnxscript``: ``onnxscript.rewriter.ort_fusions.optimize_for_ort``.

The inputs are onnxfuse's own profiles at batch 1 (what measured selection times): for a decoder with a KV cache
``prefill`` (the discovered sequence, empty cache) and ``decode`` (one token after a cache one short of it); one
``default`` profile for other models (``--batch`` changes the batch). For each profile and each ``--threads``
value every variant and the original get a session (ORT_ENABLE_ALL, CPU), are warmed up, then timed in rotating
rounds for ``--budget`` seconds (at least ``--runs`` rounds). Cells are the median of per-round ratios to the
original with a bootstrap 95% interval; ``behind`` lists the peers onnxfuse is slower than beyond the noise
floor (an A/A control session of the original, as ``onnxfuse bench`` does). A variant that fails to build or
run is ``error``/``FAIL``; outputs are also checked against the original (max abs difference).

Heavy: run it alone on the machine (timing), one model at a time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.family_table import count_fused, count_present, max_abs, run_ortx
from benchmarks.transformer_fusions import one_line, onnxfuse_exe, run_onnxscript
from onnxfuse.inputs import at_batch, discover_profiles  # noqa: E402
from onnxfuse.inputs.shapes import ShapeSpec  # noqa: E402
from onnxfuse.measure.stats import SIGNIFICANT, paired_ratio  # noqa: E402
from onnxfuse.measure.timing import interleave, warm_up  # noqa: E402
from onnxfuse.validate.runtime import make_session, run  # noqa: E402

PEERS = ("ortx", "onnxscript")


@dataclass
class Cell:
    ratio: float
    low: float
    high: float


@dataclass
class ProfileTiming:
    profile: str
    threads: int
    shapes: dict[str, list[int]]
    original_ms: float
    floor: float  # the A/A control's distance from 1 plus its half-width
    cells: dict[str, Cell] = field(default_factory=dict)  # tool -> ratio to the original
    behind: list[str] = field(default_factory=list)  # peers onnxfuse is slower than, beyond the floor


@dataclass
class Row:
    file: str
    present: str = ""
    fused: dict[str, str] = field(default_factory=dict)  # tool -> "attention/norms, ops"
    build_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    max_abs: dict[str, float] = field(default_factory=dict)
    timings: list[ProfileTiming] = field(default_factory=list)


def build(tool: str, src: Path, dst: Path, onnxfuse_args: list[str]) -> None:
    if tool == "onnxfuse":
        cmd = [onnxfuse_exe(), "optimize", str(src), str(dst), *onnxfuse_args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not dst.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuntimeError(f"rc={proc.returncode}: " + (tail[-1] if tail else "no output"))
    elif tool == "ortx":
        run_ortx(src, dst)
    else:
        run_onnxscript(src, dst)


def session(path: str, threads: int, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def profiles(src: Path, batch: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    proto = onnx.load(str(src), load_external_data=False)
    probe = make_session(str(src), "disable", "cpu")
    out = []
    for prof, plan, _ in discover_profiles(proto, lambda f: run(probe, f), ShapeSpec(), None, None):
        feeds = at_batch(proto, plan, batch)
        out.append((prof.name, feeds if feeds is not None else plan.feeds))
    return out


def time_profile(name: str, feeds: dict, paths: dict[str, str], src: str, threads: int, runs: int,
                 budget: float) -> ProfileTiming:
    sessions = {"original": session(src, threads), **{k: session(p, threads) for k, p in paths.items()},
                "A/A": session(src, threads)}
    for s in sessions.values():
        warm_up(s, feeds, max_runs=20)
    times = interleave(sessions, [(1.0, feeds)], estimator="wall", min_runs=runs, floor_runs=runs,
                       min_seconds=budget, max_runs=20 * runs)
    base = times["original"]
    control = paired_ratio(times["A/A"], base)
    floor = abs(control.median - 1) + (control.high - control.low) / 2
    pt = ProfileTiming(name, threads, {k: list(v.shape) for k, v in feeds.items()},
                       float(np.median(base)) * 1e3, floor)
    for k in paths:
        r = paired_ratio(times[k], base)
        pt.cells[k] = Cell(r.median, r.low, r.high)
    if "onnxfuse" in paths:
        for peer in PEERS:
            if peer in paths:
                r = paired_ratio(times["onnxfuse"], times[peer])
                if r.low > 1 + SIGNIFICANT + floor:
                    pt.behind.append(f"{peer} {r.median:.3f}")
    return pt


def measure_model(src: Path, tools: list[str], threads: list[int], runs: int, budget: float, batch: int,
                  onnxfuse_args: list[str], work: Path) -> Row:
    row = Row(src.name)
    pres = count_present(onnx.load(str(src), load_external_data=False))
    row.present = f"{pres.attention}/{pres.norms}"
    paths: dict[str, str] = {}
    for tool in tools:
        dst = work / f"{src.stem}.{tool}.onnx"
        t0 = time.perf_counter()
        try:
            build(tool, src, dst, onnxfuse_args)
            c = count_fused(onnx.load(str(dst), load_external_data=False))
            row.fused[tool] = f"{c.attention}/{c.norms} " + ",".join(f"{k}:{v}" for k, v in c.ops.items())
            paths[tool] = str(dst)
        except Exception as exc:  # noqa: BLE001 - record and go on
            row.errors[tool] = one_line(exc)
        row.build_s[tool] = round(time.perf_counter() - t0, 1)
    profs = profiles(src, batch)
    # numerics on the first profile: each variant at ORT_ENABLE_ALL against the original at ORT_DISABLE_ALL
    ref_sess = session(str(src), 1, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    names = [o.name for o in ref_sess.get_outputs()]
    for pname, feeds in profs:
        ref = ref_sess.run(names, feeds)
        for tool, p in list(paths.items()):
            try:
                got = session(p, 1).run(names, feeds)
                row.max_abs[tool] = max(row.max_abs.get(tool, 0.0), max_abs(ref, got))
            except Exception as exc:  # noqa: BLE001 - does not run: not timed
                row.errors[tool] = f"FAIL on {pname}: {one_line(exc)}"
                del paths[tool]
    del ref_sess
    for pname, feeds in profs:
        for t in threads:
            row.timings.append(time_profile(pname, feeds, paths, str(src), t, runs, budget))
            pt = row.timings[-1]
            print(f"  {src.name} {pname} t{t}: " + ", ".join(f"{k} {c.ratio:.3f}" for k, c in pt.cells.items())
                  + (f"  BEHIND {pt.behind}" if pt.behind else ""), file=sys.stderr, flush=True)
    return row


def markdown(rows: list[Row], tools: list[str], threads: list[int]) -> str:
    head = ["model", "profile", "attention/norms present", *[f"{t} fused" for t in tools]]
    for th in threads:
        head += [f"{t} t{th}" for t in tools]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        by_prof: dict[str, dict[int, ProfileTiming]] = {}
        for pt in r.timings:
            by_prof.setdefault(pt.profile, {})[pt.threads] = pt
        for pname, per in by_prof.items():
            cells = [r.file, pname, r.present]
            cells += [r.errors[t] if t in r.errors else r.fused.get(t, "-") for t in tools]
            for th in threads:
                pt = per.get(th)
                for t in tools:
                    c = pt.cells.get(t) if pt else None
                    mark = " **behind**" if (t == "onnxfuse" and pt and pt.behind) else ""
                    cells.append("-" if c is None else f"{c.ratio:.3f}{mark}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Latency cells: median per-round ratio to the original (ORT_ENABLE_ALL, CPU, batch as given); "
              "< 1 is faster. **behind**: onnxfuse slower than a peer beyond the A/A noise floor."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tools", default="onnxfuse,ortx,onnxscript")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=30, help="minimum interleaved rounds per profile and threads")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timing per profile and threads")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--onnxfuse-args", default="", help="extra flags for onnxfuse optimize")
    ap.add_argument("--json", help="write the rows here (after each model)")
    a = ap.parse_args(argv)
    tools = [t for t in a.tools.split(",") if t]
    threads = [int(t) for t in a.threads.split(",") if t]
    ort.set_default_logger_severity(3)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="latency_table_") as tmp:
        for m in a.models:
            rows.append(measure_model(Path(m), tools, threads, a.runs, a.budget, a.batch,
                                      shlex.split(a.onnxfuse_args), Path(tmp)))
            for f in Path(tmp).iterdir():
                f.unlink()
            if a.json:
                Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    print(markdown(rows, tools, threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
