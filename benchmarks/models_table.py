"""Per model: what onnxfuse fused (by op type), nodes before/after, rewrite time, max error against the
original, and what measured selection kept. Latency ratios next to the peers come from
../shared/tools/peer_bench.py (run it with --onnxfuse 'onnxfuse optimize {in} {out}').

    python benchmarks/models_table.py [MODEL ...]      (default: ../shared/models/*.onnx)
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

from onnxfuse import OptimizeOptions, optimize

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    paths = sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "..", "..", "shared", "models", "*.onnx")))
    print("| model | nodes before -> after | fused ops (count) | rewrite ms | validate ms | max abs err | "
          "measured: dropped groups |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            r = optimize(p, os.path.join(tmp, "o.onnx"), OptimizeOptions())
            fused = {op: n - r.ops_before.get(op, 0) for op, n in r.ops_after.items()
                     if n > r.ops_before.get(op, 0)}
            ops = ", ".join(f"{op.replace('com.microsoft.', '')} {n}" for op, n in sorted(fused.items())) or "-"
            err = max((c.max_abs for c in r.checks), default=0.0)
            dropped = ", ".join(g.group.replace("com.microsoft.", "") for g in (r.measure.groups if r.measure else [])
                                if not g.kept) or "-"
            print(f"| {os.path.basename(p)} | {r.nodes_before} -> {r.nodes_after} | {ops} | "
                  f"{r.timings['rewrite'] * 1e3:.0f} | {r.timings.get('validate', 0) * 1e3:.0f} | {err:.1e} | "
                  f"{dropped} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
