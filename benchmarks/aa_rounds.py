"""Where a whole-model comparison's per-round A/A spread comes from (issue 31): the confirmation's four sessions
(two of each model, made in two generations, measure/timing.in_generations) timed as optimize times them, with
every run kept, then the same runs read several ways: a session's time in a round as the plain median of its
runs, their minimum, the median after dividing each run by its pass's geometric mean over the four sessions (a
pass's common slow or fast moment removed: what onnxfuse does, timing.round_times), and that with rounds twice and
four times as long (adjacent rounds merged). Prints, per set, the per-run coefficient of variation and the A/A
contrast's p10-p90 each way.

    python benchmarks/aa_rounds.py A.onnx B.onnx [--load N] [--load-kind spin|memory] [--sets 5] [--rounds 16]

Inputs: the ones optimize times on (its discovered plan at batch 1). `--load N` starts N busy processes (killed on
exit): busy loops, or with `--load-kind memory` processes that stream copies through twice the last-level cache
(another program's memory traffic). About 7 s a set for a 10 ms model."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from busy_measure import KINDS, busy  # noqa: E402  (this folder: the same busy processes, killed on exit)

import onnxfuse.measure.timing as timing  # noqa: E402
from onnxfuse.inputs import timing_feeds  # noqa: E402
from onnxfuse.inputs.discover import discover  # noqa: E402
from onnxfuse.measure.clock import CPU  # noqa: E402
from onnxfuse.measure.sessions import timing_sessions  # noqa: E402
from onnxfuse.measure.verdicts import aa_contrast  # noqa: E402

LABELS = ("c", "o", "c2", "o2")  # timing_sessions' labels (control twins last)


def feeds_for(path: str) -> dict:
    """The inputs optimize times on: its own discovered plan, at batch 1 (inputs.timing_feeds)."""
    model = onnx.load(path, load_external_data=False)
    plan, _ = discover(model, None)
    return timing_feeds(model, plan, user_given=False)


def recorded(a: str, b: str, feeds: dict, rounds: int) -> list[dict[str, list[float]]]:
    """Every round_times call of one comparison: per round and clock, each session's runs (one per pass)."""
    calls: list[dict[str, list[float]]] = []
    normalized = timing.round_times

    def keep(runs):
        calls.append({k: list(v) for k, v in runs.items()})
        return normalized(runs)

    timing.round_times = keep
    try:
        timing.in_generations(lambda reverse: timing_sessions({"c": b, "o": a}, "cpu", 1,
                                                              control=[("c", "c2"), ("o", "o2")], reverse=reverse),
                              [(1.0, feeds)], estimator=CPU, min_runs=rounds, floor_runs=rounds, max_runs=rounds)
    finally:
        timing.round_times = normalized
    assert len(calls) == 4 * rounds, "one generation of sessions (they took over REMAKE_S to make): not read here"
    return calls


def per_session(calls: list[dict[str, list[float]]]) -> tuple[dict, dict]:
    """Each generation's CPU-time runs per session and round (two calls a round: wall time, then CPU time)."""
    n = len(calls) // 4
    return tuple({k: [np.asarray(c[k]) for c in g[1::2]] for k in LABELS} for g in (calls[:2 * n], calls[2 * n:]))


def spread(g1: dict, g2: dict, f, merge: int = 1, normalized: bool = False) -> tuple[float, float, float]:
    """The A/A contrast's p10-p90 and the median ratio, a session's time in a (merged) round being `f` of its runs,
    or, `normalized`, what onnxfuse reads (timing.round_times: each run divided by its pass's mean first)."""
    n = len(g1["c"]) // merge

    def read(g: dict, i: int) -> dict[str, float]:
        runs = {k: np.concatenate(g[k][merge * i: merge * i + merge]) for k in LABELS}
        return timing.round_times(runs) if normalized else {k: f(v) for k, v in runs.items()}

    both = [(read(g1, i), read(g2, i)) for i in range(n)]
    v = {k: np.array([np.sqrt(x[k] * y[k]) for x, y in both]) for k in LABELS}
    aa = aa_contrast(v)
    ratio = float(np.median(np.sqrt(v["c"] * v["c2"] / (v["o"] * v["o2"]))))
    return float(np.percentile(aa, 10)), float(np.percentile(aa, 90)), ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--load", type=int, default=0)
    ap.add_argument("--load-kind", choices=KINDS, default="spin")
    ap.add_argument("--sets", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=16)
    a = ap.parse_args()
    feeds = feeds_for(a.a)
    ways = {"plain median": (np.median, 1, False), "min": (np.min, 1, False),
            "pass-norm median (onnxfuse)": (np.median, 1, True), "pass-norm, rounds x2": (np.median, 2, True),
            "pass-norm, rounds x4": (np.median, 4, True)}
    worst = {w: 0.0 for w in ways}
    with busy(a.load, a.load_kind):
        for s in range(a.sets):
            g1, g2 = per_session(recorded(a.a, a.b, feeds, a.rounds))
            runs = np.concatenate(g1["c"])
            cells = []
            for w, (f, merge, norm) in ways.items():
                lo, hi, r = spread(g1, g2, f, merge, norm)
                worst[w] = max(worst[w], 1 - lo, hi - 1)
                cells.append(f"{w} {lo:.3f}-{hi:.3f} ({r:.3f})")
            print(f"set {s}: run {np.median(runs) * 1e3:.2f} ms cv {np.std(runs) / np.median(runs):.3f}, "
                  f"{len(runs) // len(g1['c'])}/round |", " | ".join(cells), flush=True)
    print(f"load {a.load} {a.load_kind}, {a.sets} sets of {a.rounds} rounds; worst A/A half-width:",
          ", ".join(f"{w} {v:.3f}" for w, v in worst.items()))


if __name__ == "__main__":
    main()
