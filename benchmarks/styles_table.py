#!/usr/bin/env python3
"""Run onnxfuse's default pipeline on every model of the style corpus (models/make_style_models.py) and print
a markdown table: style, nodes before -> after, contrib ops added, validation status, latency ratio of the kept
candidate vs the original (measured selection), wall seconds; or the error class and its one-line message.
An `onnxfuse.OnnxfuseError` is a user-facing refusal ("refused"); any other exception is an internal error
("INTERNAL", with the innermost onnxfuse frame). Then (unless --no-cli) the CLI `onnxfuse optimize IN OUT` once
per model, to check its exit code (0 ok, 1 user error, 70 internal error); it runs after the API call, so
measured selection usually comes from the decision cache that call wrote.

    python -m benchmarks.styles_table [PATH_OR_DIR ...] [--no-measure] [--no-cache] [--no-cli]
        (default: models/styles/ and models/styles_tf/)
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
import traceback

import onnxfuse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXIT_MEANING = {0: "ok", 1: "user error", 2: "usage", 70: "internal error", 130: "interrupted"}


def _paths(args: list[str]) -> list[str]:
    args = args or [os.path.join(ROOT, "models", "styles"), os.path.join(ROOT, "models", "styles_tf")]
    out: list[str] = []
    for a in args:
        out += sorted(glob.glob(os.path.join(a, "*.onnx"))) if os.path.isdir(a) else [a]
    return out


def _where(e: BaseException) -> str:
    """The innermost frame of the traceback inside the onnxfuse package, as file:function."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f"{os.sep}onnxfuse{os.sep}" in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.relpath(f.filename, os.path.dirname(os.path.dirname(f.filename)))}:{f.name}:{f.lineno}"


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def fused_ops(r: onnxfuse.Result) -> str:
    added = {op: n - r.ops_before.get(op, 0) for op, n in r.ops_after.items()
             if "." in op and n > r.ops_before.get(op, 0)}
    return ", ".join(f"{op.replace('com.microsoft.', '')} {n}" for op, n in sorted(added.items())) or "-"


def run_api(path: str, out: str, options: onnxfuse.OptimizeOptions) -> tuple[str, str]:
    """(status, the table cells after the style name)."""
    t0 = time.perf_counter()
    try:
        r = onnxfuse.optimize(path, out, options)
    except onnxfuse.OnnxfuseError as e:
        return "refused", f"refused | {type(e).__name__}: {_one_line(e)} | | | | {time.perf_counter() - t0:.1f}"
    except Exception as e:  # an internal error: a bug in onnxfuse
        return "internal", (f"INTERNAL | {type(e).__name__}: {_one_line(e)} @ {_where(e)} | | | | "
                            f"{time.perf_counter() - t0:.1f}")
    wall = time.perf_counter() - t0
    m = r.measure
    if m is None:
        ratio = "not measured"
    elif m.final is not None and m.dropped_everything:
        ratio = f"1 (all dropped: the candidate measured {m.final} {m.final.verdict_beyond(m.floor)})"
    elif m.final is not None:
        ratio = f"{m.final} {m.final.verdict_beyond(m.floor)}"
    else:
        ratio = "-"
    note = "" if m is None else _one_line(m.note or m.confirmed or ("dropped everything" if m.dropped_everything else ""), 60)
    if note.startswith("the selection of an earlier run"):
        note = "decision cache"
    return "ok", (f"{r.nodes_before} -> {r.nodes_after} | {fused_ops(r)} | {_one_line(r.validation, 160)} | {ratio} | "
                  f"{note} | {wall:.1f}")


def run_cli(path: str, out: str, extra: list[str]) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "onnxfuse")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "onnxfuse.cli"]
    p = subprocess.run([*cmd, "optimize", *extra, path, out], capture_output=True, text=True)
    last = [ln for ln in p.stderr.strip().splitlines() if "error" in ln.lower()]
    msg = f" ({_one_line(last[-1], 100)})" if p.returncode and last else ""
    return f"{p.returncode} {EXIT_MEANING.get(p.returncode, '?')}{msg}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="model files or folders (default: models/styles/, models/styles_tf/)")
    ap.add_argument("--no-measure", action="store_true", help="OptimizeOptions(measure=False), CLI --no-measure")
    ap.add_argument("--no-cache", action="store_true", help="OptimizeOptions(cache=False), CLI --no-cache")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI exit-code column")
    args = ap.parse_args(argv)
    options = onnxfuse.OptimizeOptions(measure=not args.no_measure, cache=not args.no_cache)
    extra = (["--no-measure"] if args.no_measure else []) + (["--no-cache"] if args.no_cache else [])
    print("| style | nodes before -> after | fused ops added | validation | latency ratio (final) | measure note | "
          "wall s | CLI exit |")
    print("|---|---|---|---|---|---|---|---|")
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in _paths(args.paths):
            name = os.path.basename(path)[: -len(".onnx")]
            status, cells = run_api(path, os.path.join(tmp, "api.onnx"), options)
            counts[status] = counts.get(status, 0) + 1
            cli = "-" if args.no_cli else run_cli(path, os.path.join(tmp, "cli.onnx"), extra)
            print(f"| {name} | {cells} | {cli} |", flush=True)
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
