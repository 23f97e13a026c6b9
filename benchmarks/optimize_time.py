#!/usr/bin/env python3
"""What optimizing costs, per model: `onnxfuse optimize` wall time and peak memory by default (measured
selection, an empty decision cache), run again (decisions cached: must write the same bytes), and with
`--no-measure`, next to onnxslim and onnxruntime's transformers optimizer on the same model; with
`--latency`, each output's latency against the input's (`onnxfuse bench`, interleaved, 1 thread).

Usage::

    python -m benchmarks.optimize_time MODEL.onnx... [--latency] [--budget S] [--json OUT.json]
                                       [--peer-python PY]

Each command runs in its own process under /usr/bin/time -v (see realistic_check.timed). The decision cache
is a fresh temporary folder per model (ONNXFUSE_CACHE_DIR), so "default" is a first run and "cached" the
second. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.realistic_check import ORT_OPT, ORT_TYPE, timed


def _onnxfuse() -> list[str]:
    exe = Path(sys.executable).parent / "onnxfuse"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "onnxfuse.cli"]


def _json(res: dict[str, Any]) -> Any:
    try:
        return json.loads(res["stdout"])
    except (json.JSONDecodeError, TypeError):
        return None


def _bench(a: str, b: str) -> str:
    r = timed([*_onnxfuse(), "bench", a, b, "--json", "--budget", "8", "--runs", "40"], 900)
    j = _json(r)
    return f"{j['ratio']['median']:.3f}" if j and j.get("ratio") else "?"


def check(model: Path, work: Path, budget: float | None, latency: bool, peer_py: str) -> dict[str, Any]:
    name = model.stem
    family = re.sub(r"_(ts17|dynamo18)$", "", name)
    cache = tempfile.mkdtemp(prefix="onnxfuse-cache-", dir=work)
    os.environ["ONNXFUSE_CACHE_DIR"] = cache
    extra = ["--measure-budget", str(budget)] if budget else []
    of = _onnxfuse()
    r: dict[str, Any] = {"model": name, "mb": round(model.stat().st_size / 2**20, 1)}
    outs = {k: work / f"{name}.{k}.onnx" for k in ("default", "cached", "nomeasure", "ortopt", "slim")}
    print(f"[{name}] default", file=sys.stderr, flush=True)
    r["default"] = timed([*of, "optimize", str(model), str(outs["default"]), "--json", *extra], 1800)
    print(f"[{name}] cached", file=sys.stderr, flush=True)
    r["cached"] = timed([*of, "optimize", str(model), str(outs["cached"]), "--json", *extra], 1800)
    r["same_bytes"] = (outs["default"].exists() and outs["cached"].exists()
                       and filecmp.cmp(outs["default"], outs["cached"], shallow=False))
    print(f"[{name}] --no-measure", file=sys.stderr, flush=True)
    r["nomeasure"] = timed([*of, "optimize", str(model), str(outs["nomeasure"]), "--no-measure", "--json"], 1800)
    print(f"[{name}] peers", file=sys.stderr, flush=True)
    r["ortopt"] = timed([peer_py, "-c", ORT_OPT, str(model), str(outs["ortopt"]),
                         ORT_TYPE.get(family, "bert")], 1800)
    slim = Path(peer_py).parent / "onnxslim"
    r["slim"] = timed([str(slim) if slim.exists() else "onnxslim", str(model), str(outs["slim"])], 1800)
    for k in ("default", "cached", "nomeasure"):
        r[k]["json"] = _json(r[k])
        r[k]["stdout"] = ""
    if latency:
        print(f"[{name}] latency", file=sys.stderr, flush=True)
        r["latency"] = {k: _bench(str(model), str(outs[k])) if outs[k].exists() else "-"
                        for k in ("default", "ortopt", "slim")}
    for f in work.glob(f"{name}.*.onnx*"):
        f.unlink()
    return r


def _s(res: dict[str, Any]) -> str:
    return f"{res['wall_s']:.1f}" if res.get("rc") == 0 else f"fail ({res.get('rc')})"


def _mb(res: dict[str, Any]) -> str:
    return f"{res['peak_rss'] / 2**20:.0f}" if res.get("peak_rss") else "?"


def row(r: dict[str, Any]) -> str:
    m = ((r["default"].get("json") or {}).get("measure")) or {}
    fr = m.get("final_ratio")
    final = f"{fr['median']:.3f}" if fr else "-"
    kept = sum(g["rewrites"] for g in m.get("groups", []) if g["kept"] and g["source"] != "exact")
    classes = sum(1 for g in m.get("groups", []) if g["source"] in ("timed", "cached", "budget"))
    cells = [r["model"], f"{r['mb']}", _s(r["default"]), f"{m.get('seconds', 0):.1f}/{m.get('budget_s', 0):g}",
             f"{classes} ({m.get('undecided', 0)})", str(kept), final, str(m.get("confirmed", ""))[:24],
             _s(r["cached"]) + (" =" if r["same_bytes"] else " ≠"), _s(r["nomeasure"]), _s(r["ortopt"]),
             _s(r["slim"]), _mb(r["default"]), _mb(r["nomeasure"])]
    if "latency" in r:
        cells += [r["latency"]["default"], r["latency"]["ortopt"], r["latency"]["slim"]]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--latency", action="store_true", help="also bench each output against the input")
    ap.add_argument("--budget", type=float, default=None, help="--measure-budget for onnxfuse (default: its own)")
    ap.add_argument("--json", default=None, help="write the raw results here")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="python with onnxslim and onnxruntime's transformers optimizer (which needs torch)")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="onnxfuse-optime-"))
    results = [check(Path(m), work, a.budget, a.latency, a.peer_python) for m in a.models]
    head = ["model", "MB", "default s", "measure s/budget", "classes (undecided)", "rewrites kept", "final ratio",
            "confirmation", "cached s (= same bytes)", "--no-measure s", "ORT opt s", "onnxslim s",
            "default MB peak", "--no-measure MB peak"]
    if a.latency:
        head += ["latency onnxfuse", "latency ORT opt", "latency onnxslim"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        print(row(r))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
