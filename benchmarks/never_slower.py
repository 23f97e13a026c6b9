#!/usr/bin/env python3
"""Is onnxfuse's default output ever slower than its input? For each model: ``onnxfuse.optimize(IN, OUT)`` with
the default options (validated, measured selection at 1 thread) into a fresh decision cache, then
``onnxfuse.bench([IN, OUT])`` (interleaved in one process, with an A/A control, 1 thread, ORT_ENABLE_ALL) as an
independent check of what measured selection decided.

Usage::

    python -m corpora.forms /tmp/forms
    python -m benchmarks.never_slower /tmp/forms/*.onnx [--budget 2] [--json /tmp/never_slower.json]

One markdown row per model: what was kept (rules), optimize's own whole-model confirmation, the bench ratio
(output over input latency, 95% CI), its A/A control and verdict. Then a count of verdicts; exit 1 if any output
is slower beyond its control. Heavy: run it alone on the machine (about 5-10 s per small model).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import onnxfuse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--budget", type=float, default=2.0, help="bench seconds per model")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, counts = [], collections.Counter()
    print("| model | kept | optimize's confirmation | bench out/in [95% CI] | A/A | verdict |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ONNXFUSE_CACHE_DIR"] = os.path.join(tmp, "cache")  # decisions made here, now
        for path in a.models:
            name = os.path.basename(path).removesuffix(".onnx")
            out = os.path.join(tmp, name + ".opt.onnx")
            try:
                r = onnxfuse.optimize(path, out, onnxfuse.OptimizeOptions())
            except onnxfuse.OnnxfuseError as e:
                print(f"| {name} | error: {e} | | | | |")
                counts["error"] += 1
                continue
            kept = ", ".join(f"{k} {v}" for k, v in sorted(r.fired.items())) or "-"
            m = r.measure
            conf = "-" if m is None or m.final is None else f"{m.final.median:.3f} ({m.confirmed})"
            if not os.path.exists(out) or not r.fired:
                verdict = "unchanged (nothing kept)"
                print(f"| {name} | {kept} | {conf} | - | - | {verdict} |")
                counts[verdict] += 1
                rows.append({"model": name, "kept": r.fired, "verdict": verdict})
                continue
            b = onnxfuse.bench([path, out], budget_s=a.budget)
            ratio, ctl = b.ratio, b.control
            print(f"| {name} | {kept} | {conf} | {ratio.median:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] | "
                  f"{ctl.median:.3f} | {b.verdict} |")
            counts[b.verdict] += 1
            rows.append({"model": name, "kept": r.fired, "ratio": [ratio.median, ratio.low, ratio.high],
                         "control": [ctl.median, ctl.low, ctl.high], "verdict": b.verdict,
                         "confirmation": None if m is None or m.final is None else m.final.median})
            sys.stdout.flush()
    print()
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if counts["slower"] else 0


if __name__ == "__main__":
    sys.exit(main())
