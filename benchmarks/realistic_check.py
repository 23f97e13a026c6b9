#!/usr/bin/env python3
"""Run onnxfuse's input discovery and optimize over the realistic corpus and print one markdown table.

Usage::

    python -m corpora.realistic [CORPUS]          # first: export the models
    python -m benchmarks.realistic_check [CORPUS] [--only bert_base_ts17,...] [--results DIR] [--no-measured]
                                          [--measure-timeout 900] [--reuse]

CORPUS defaults to ~/.cache/onnxfuse-corpus. For every ``*.onnx`` in it (``*.opt.onnx`` etc. excluded), each in
its own process under ``/usr/bin/time -v`` (wall time and peak RSS = "Maximum resident set size"):

1. ``onnxfuse inputs MODEL --json``: shapes chosen, role / value / why per dynamic dim, tries that failed;
2. ``onnxfuse optimize MODEL OUT --no-measure --json``: validation status, fused ops (ops_after - ops_before);
3. ``onnxfuse optimize MODEL OUT --json`` (measured selection, default options; ``--measure-timeout`` s):
   final ratio (kept / original latency, 95% CI), measure seconds, validation;
4. the model's own inference peak: feeds at the shapes of step 1 are written to an .npz (by a separate
   process), then a minimal process creates one onnxruntime CPU session at ORT_ENABLE_ALL and runs it once;
   the "x inf" columns are onnxfuse's peak RSS over that one (the target: within ~3x);
5. onnxruntime's transformers optimizer (``optimize_model``, model_type per family, default opt_level) and
   ``onnxslim IN OUT``: wall time, peak RSS, nodes after (and ORT's fused-op statistics).

Raw results go to RESULTS/<model>.json (default: CORPUS/results); with ``--reuse`` a model whose result
file exists is not run again (the table is rebuilt from the files). The table goes to stdout, followed by
per-model details (every dim's why, failed tries, errors).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_CORPUS = Path.home() / ".cache" / "onnxfuse-corpus"
TIME = "/usr/bin/time"

# onnxruntime.transformers.optimizer model_type per corpus family (no llama/whisper/crnn types exist:
# decoders use gpt2, everything else bert, which then mostly runs onnxruntime's own graph optimizations).
ORT_TYPE = {"bert_base": "bert", "distilbert": "bert", "bert_pos64": "bert", "vit_b16": "vit", "t5_enc": "t5",
            "gpt2_kv": "gpt2", "llama_kv": "gpt2", "phi3_kv": "gpt2", "whisper_enc": "bert",
            "whisper_enc_dynT": "bert"}

INFER = r"""
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = 1; so.log_severity_level = 3
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
s.run(None, feeds)
"""

FEEDS = r"""
import sys, json, numpy as np
from onnxfuse import find_inputs
shapes = json.loads(sys.argv[2])
plan = find_inputs(sys.argv[1], [f"{k}:{'x'.join(map(str, v)) or '1'}" for k, v in shapes.items() if v], probe=False)
np.savez(sys.argv[3], **plan.feeds)
print(json.dumps({k: list(v.shape) for k, v in plan.feeds.items()}))
"""

ORT_OPT = r"""
import sys, json, onnx
from onnxruntime.transformers.optimizer import optimize_model
m = optimize_model(sys.argv[1], model_type=sys.argv[3], num_heads=0, hidden_size=0)
m.save_model_to_file(sys.argv[2])
stats = {k: v for k, v in m.get_fused_operator_statistics().items() if v}
print(json.dumps({"nodes": len(m.model.graph.node), "fused": stats}))
"""


def timed(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run `cmd` under /usr/bin/time -v; wall seconds, peak RSS bytes, rc, stdout, the stderr tail."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = [TIME, "-v", "-o", tf.name, *cmd]
        t0 = time.perf_counter()
        # own session: on timeout the whole group goes (time's child too, not only /usr/bin/time)
        p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc, err = "timeout", f"timed out after {timeout:.0f} s"
        wall = time.perf_counter() - t0
        tv = Path(tf.name).read_text()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv)
    return {"cmd": shlex.join(cmd), "rc": rc, "wall_s": round(wall, 1),
            "peak_rss": int(m.group(1)) * 1024 if m else None, "stdout": out, "stderr_tail": err[-1500:]}


def _json(res: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return json.loads(res["stdout"])
    except (json.JSONDecodeError, TypeError):
        return None


def check_model(path: Path, work: Path, measured: bool, measure_timeout: float) -> dict[str, Any]:
    name = path.stem
    family = re.sub(r"_(ts17|dynamo18)$", "", name)
    py = sys.executable
    onnxfuse = [py, "-m", "onnxfuse.cli"] if not _has_entry() else ["onnxfuse"]
    r: dict[str, Any] = {"model": name, "family": family, "size_mb": round(path.stat().st_size / 2**20, 1)}
    print(f"[{name}] inputs", file=sys.stderr, flush=True)
    r["inputs"] = timed([*onnxfuse, "inputs", str(path), "--json"], 900)
    r["inputs"]["json"] = _json(r["inputs"])
    print(f"[{name}] optimize --no-measure", file=sys.stderr, flush=True)
    out_nm = work / f"{name}.nomeasure.onnx"
    r["opt_nm"] = timed([*onnxfuse, "optimize", str(path), str(out_nm), "--no-measure", "--json"], 1800)
    r["opt_nm"]["json"] = _json(r["opt_nm"])
    if measured:
        print(f"[{name}] optimize (measured)", file=sys.stderr, flush=True)
        out_m = work / f"{name}.measured.onnx"
        r["opt_m"] = timed([*onnxfuse, "optimize", str(path), str(out_m), "--json"], measure_timeout)
        r["opt_m"]["json"] = _json(r["opt_m"])
    # the model's own inference peak at the chosen shapes
    shapes = ((r["inputs"]["json"] or {}).get("shapes")) or {}
    if shapes:
        npz = work / f"{name}.feeds.npz"
        f = subprocess.run([py, "-c", FEEDS, str(path), json.dumps(shapes), str(npz)], capture_output=True,
                           text=True)
        if f.returncode == 0:
            print(f"[{name}] inference peak", file=sys.stderr, flush=True)
            r["infer"] = timed([py, "-c", INFER, str(path), str(npz)], 900)
        else:
            r["infer"] = {"rc": f.returncode, "stderr_tail": f.stderr[-1500:], "cmd": "feeds"}
        npz.unlink(missing_ok=True)
    print(f"[{name}] ort transformers optimizer / onnxslim", file=sys.stderr, flush=True)
    ort_type = ORT_TYPE.get(family, "bert")
    r["ort_opt"] = timed([py, "-c", ORT_OPT, str(path), str(work / f"{name}.ortopt.onnx"), ort_type], 1800)
    r["ort_opt"]["type"] = ort_type
    r["ort_opt"]["json"] = _json({"stdout": (r["ort_opt"]["stdout"] or "").strip().splitlines()[-1:] and
                                  r["ort_opt"]["stdout"].strip().splitlines()[-1]})
    slim = [str(Path(py).parent / "onnxslim")] if (Path(py).parent / "onnxslim").exists() else ["onnxslim"]
    r["slim"] = timed([*slim, str(path), str(work / f"{name}.slim.onnx")], 1800)
    for f in work.glob(f"{name}.*.onnx*"):
        f.unlink()
    for k in ("inputs", "opt_nm", "opt_m"):
        if k in r and r[k].get("json"):
            r[k]["stdout"] = ""  # parsed; keep the result file small
    return r


def _has_entry() -> bool:
    from shutil import which
    return which("onnxfuse") is not None


# --------------------------------------------------------------------------- #
# Table
# --------------------------------------------------------------------------- #
def mb(n: int | None) -> str:
    return "-" if n is None else (f"{n / 2**20:.0f}" if n >= 10 * 2**20 else f"{n / 2**20:.2f}")


def fused(j: dict[str, Any] | None) -> str:
    if not j:
        return "-"
    before, after = j.get("ops_before", {}), j.get("ops_after", {})
    grown = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    s = ", ".join(f"{k.replace('com.microsoft.', '')}x{v}" for k, v in sorted(grown.items()))
    return f"{j.get('nodes_before')}→{j.get('nodes_after')}" + (f": {s}" if s else "")


def status(res: dict[str, Any] | None) -> str:
    if not res:
        return "-"
    j = res.get("json")
    if res.get("rc") not in (0,) or not j:
        tail = [ln for ln in (res.get("stderr_tail") or "").splitlines() if ln.strip()]
        return f"FAIL rc={res.get('rc')}: {tail[-1][:120] if tail else ''}"
    return (j.get("validation") or {}).get("status", "?")


def ratio(j: dict[str, Any] | None) -> str:
    m = (j or {}).get("measure")
    if not m:
        return "-"
    fr = m.get("final_ratio")
    if not fr:
        return m.get("note") or "-"
    return f"{fr['median']:.3f} [{fr['low']:.3f},{fr['high']:.3f}]"


def row(r: dict[str, Any]) -> str:
    ij = r["inputs"].get("json") or {}
    shapes = "; ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in (ij.get("shapes") or {}).items()
                       if not k.startswith("past_key_values.") or k.endswith(".0.key"))
    if not ij:
        shapes = status(r["inputs"])
    dims = "; ".join(f"{d['dim']}={d['value']} ({d['role']})" for d in ij.get("dims", []))
    tried = len(ij.get("tried", []))
    inf = (r.get("infer") or {}).get("peak_rss") if (r.get("infer") or {}).get("rc") == 0 else None
    nm, m = r["opt_nm"], r.get("opt_m") or {}

    def x(peak: int | None) -> str:
        return f"{peak / inf:.1f}" if peak and inf else "-"

    mj = m.get("json") or {}
    meas_s = (mj.get("measure") or {}).get("seconds")
    phase_s = (mj.get("timings_s") or {}).get("measure")
    oo, sl = r["ort_opt"], r["slim"]
    oo_fused = ", ".join(f"{k}x{v}" for k, v in ((oo.get("json") or {}).get("fused") or {}).items())
    cells = [
        r["model"], f"{r['size_mb']}", shapes, dims, str(tried),
        f"{r['inputs']['wall_s']} / {mb(r['inputs']['peak_rss'])}",
        f"{nm['wall_s']} / {mb(nm['peak_rss'])}", status(nm), fused(nm.get("json")),
        f"{m.get('wall_s', '-')} / {mb(m.get('peak_rss'))}" if m else "-", status(m) if m else "-",
        ratio(mj), (f"{meas_s:.0f} ({phase_s:.0f})" if isinstance(meas_s, (int, float)) and isinstance(phase_s, (int, float))
         else "-"),
        fused(mj) if mj else "-",
        mb(inf) if inf else ("FAIL" if r.get("infer") else "-"),
        f"{x(r['inputs']['peak_rss'])} / {x(nm['peak_rss'])} / {x(m.get('peak_rss'))}",
        f"{oo['wall_s']} / {mb(oo['peak_rss'])}" + ("" if oo["rc"] == 0 else f" FAIL rc={oo['rc']}")
        + (f" ({oo['type']}: {oo_fused})" if oo_fused else f" ({oo['type']})"),
        f"{sl['wall_s']} / {mb(sl['peak_rss'])}" + ("" if sl["rc"] == 0 else f" FAIL rc={sl['rc']}"),
    ]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


HEADER = ["model", "MB", "inputs chosen", "dims (role)", "failed tries", "inputs s / MB",
          "opt --no-measure s / MB", "validation (no-measure)", "nodes, fused ops (no-measure)",
          "opt measured s / MB", "validation (measured)", "final ratio [95% CI]", "measure.seconds (timings_s.measure)",
          "nodes, ops kept (measured)", "inference peak MB", "x inf (inputs/no-measure/measured)",
          "ORT transformers opt s / MB", "onnxslim s / MB"]


def details(r: dict[str, Any]) -> list[str]:
    out = [f"### {r['model']}"]
    ij = r["inputs"].get("json") or {}
    for d in ij.get("dims", []):
        out.append(f"- `{d['dim']}` = {d['value']} ({d['role']}): {d['why']}")
    for t in ij.get("tried", []):
        out.append(f"- tried, failed: {t}")
    if ij:
        out.append(f"- estimate {mb(ij.get('estimate_bytes'))} MB, budget {mb(ij.get('budget_bytes'))} MB")
    for k in ("inputs", "opt_nm", "opt_m", "infer", "ort_opt", "slim"):
        res = r.get(k)
        if res and (res.get("rc") != 0 or (k.startswith("opt") and not res.get("json"))):
            tail = "\n".join((res.get("stderr_tail") or "").strip().splitlines()[-6:])
            out.append(f"- **{k} failed** (rc {res.get('rc')}): `{res.get('cmd')}`\n```\n{tail}\n```")
    for k in ("opt_nm", "opt_m"):
        j = (r.get(k) or {}).get("json") or {}
        for rb in j.get("rolled_back", []):
            out.append(f"- {k} rolled back {rb.get('rule')} at {rb.get('root')}: {rb.get('reason')}")
        meas = j.get("measure") or {}
        if meas:
            groups = ", ".join(f"{g['group']}({'kept' if g['kept'] else 'dropped'}, gain {g.get('gain')})"
                               if isinstance(g.get("gain"), (int, float, type(None))) else g["group"]
                               for g in meas.get("groups", []))
            out.append(f"- {k} measure: verdict {meas.get('final_verdict')}, rounds {meas.get('rounds')}, "
                       f"noise floor {meas.get('noise_floor')}, groups: {groups}; note: {meas.get('note')}")
        if j.get("timings_s"):
            out.append(f"- {k} timings_s: {j['timings_s']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", default=str(DEFAULT_CORPUS))
    ap.add_argument("--only", default="", help="comma-separated model file stems (e.g. bert_base_ts17)")
    ap.add_argument("--results", default="", help="where per-model JSON goes (default CORPUS/results)")
    ap.add_argument("--no-measured", action="store_true", help="skip the measured optimize run")
    ap.add_argument("--measure-timeout", type=float, default=900)
    ap.add_argument("--reuse", action="store_true", help="do not rerun models that have a result file")
    a = ap.parse_args(argv)
    corpus = Path(a.corpus).expanduser()
    results = Path(a.results).expanduser() if a.results else corpus / "results"
    results.mkdir(parents=True, exist_ok=True)
    models = sorted(p for p in corpus.glob("*.onnx") if p.stem.count(".") == 0)
    if a.only:
        wanted = set(a.only.split(","))
        models = [p for p in models if p.stem in wanted]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-realistic-") as tmp:
        for p in models:
            rf = results / f"{p.stem}.json"
            if a.reuse and rf.exists():
                rows.append(json.loads(rf.read_text()))
                continue
            r = check_model(p, Path(tmp), not a.no_measured, a.measure_timeout)
            rf.write_text(json.dumps(r, indent=1) + "\n")
            rows.append(r)
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for r in rows:
        print(row(r))
    print("\nWall seconds / peak RSS MB per step (`/usr/bin/time -v`). 'x inf': onnxfuse's peak over the model's "
          "own one-run inference peak at the chosen shapes (ORT_ENABLE_ALL, 1 thread).\n")
    for r in rows:
        print("\n".join(details(r)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
