"""Measurement on a busy machine (issue 31): the same models optimized with --no-cache on the machine as it is
and again while this script keeps every core busy with other processes (bounded busy loops, killed on exit).
Prints, per model, the kept selection (the output's op counts) and the reported effect both ways, the A/A
spread optimize reports (p10-p90 of the confirmation's two candidate sessions, per round), and whether
`profile A B`, `bench A B` and optimize's confirmation agree on faster / slower / unchanged for the same pair.

    python -m benchmarks.busy_measure [--models a.onnx ...] [--load N] [--load-kind spin|memory] [--no-agreement]
                                      [--keep DIR]

Defaults: the shared development models and the small bundled ones; N = one busy process per core. About 1-2
minutes per model with the agreement checks (optimize, bench and profile, quiet and loaded)."""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "models")
DEFAULT = [os.path.join(SHARED, m) for m in ("bert_tiny.onnx", "gpt2_tiny.onnx", "ppocr_cls_v2.onnx",
                                              "ppocr_det_v4.onnx", "resnet_mini.onnx", "silero_vad_op15.onnx",
                                              "vit_tiny.onnx")] + \
          [os.path.join(ROOT, "models", m) for m in ("cnn_small.onnx", "transformer_small.onnx",
                                                     "transformer_op18.onnx")]


WORK = [tempfile.gettempdir()]  # this run's folder: outputs and a fresh decision cache per command
KEEP = [""]  # --keep DIR: where optimize's JSON reports are kept


def _spin(deadline: float) -> None:
    while time.time() < deadline:
        pass


def _stream(deadline: float) -> None:
    """Copies between two buffers of 32 MB each, over and over: a core busy with memory traffic that evicts the
    last-level cache (another program at work, not a loop that stays in its registers)."""
    import numpy as np
    a = np.ones(4 * 2**20)
    b = np.empty_like(a)
    while time.time() < deadline:
        np.copyto(b, a)
        a, b = b, a


KINDS = {"spin": _spin, "memory": _stream}


@contextlib.contextmanager
def busy(n: int, kind: str = "spin"):
    """n processes that keep a core busy each (KINDS: a busy loop, or memory traffic), for at most an hour; killed
    on exit."""
    procs = [multiprocessing.Process(target=KINDS[kind], args=(time.time() + 3600,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        time.sleep(1.0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join()


def onnxfuse(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "onnxfuse.cli", *args, "--json"], capture_output=True, text=True,
                         env={**os.environ, "ONNXFUSE_CACHE_DIR": tempfile.mkdtemp(prefix="cache-", dir=WORK[0])})
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout)


def word(v: str | None) -> str:
    """faster / slower / unchanged: the three answers the commands must agree on."""
    return v if v in ("faster", "slower") else "unchanged"


def one(model: str, folder: str, tag: str, agreement: bool) -> dict:
    out = os.path.join(folder, f"{os.path.basename(model)[:-5]}.{tag}.onnx")
    r = onnxfuse("optimize", model, out, "--no-cache")
    if "error" in r:
        return {"error": r["error"]}
    if KEEP[0]:  # optimize's whole JSON, to see which class or group decided differently
        with open(os.path.join(KEEP[0], f"{os.path.basename(model)[:-5]}.{tag}.json"), "w") as f:
            json.dump(r, f, indent=1)
    m = r.get("measure") or {}
    final = m.get("final_ratio")
    row = {"ops": r.get("ops_after", {}), "effect": final["median"] if final else None,
           # a selection undone as slower: the output is the input but for exact rewrites
           "opt": word(m.get("final_verdict")) if final and not m.get("dropped_everything") else "unchanged",
           "aa": m.get("aa_spread"),
           "estimator": m.get("estimator", "")}
    if agreement and os.path.exists(out):
        b = onnxfuse("bench", model, out, "--budget", "3")
        p = onnxfuse("profile", model, out, "--runs", "10")
        row["bench"] = word(b.get("verdict")) if "error" not in b else "error"
        comp = p.get("comparison") if "error" not in p else None
        row["profile"] = word(comp.get("verdict")) if comp else "error"
        # the evidence behind each verdict, printed where they disagree: interval and noise floor
        row["why"] = {"optimize": (final, m.get("noise_floor")), "bench": (b.get("ratio"), b.get("noise_floor")),
                      "profile": ((comp or {}).get("ratio"), (comp or {}).get("noise_floor"))}
    return row


def _interval(r: dict | None) -> str:
    return f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if r else "-"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the busy processes are killed on the way out
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=DEFAULT)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes while loaded (default: "
                    "one per core)")
    ap.add_argument("--load-kind", choices=KINDS, default="spin", help="what the busy processes do: a busy loop, "
                    "or memory traffic through twice the last-level cache")
    ap.add_argument("--no-agreement", action="store_true", help="skip bench and profile")
    ap.add_argument("--keep", default="", help="a folder to keep optimize's JSON report of each run in "
                    "(<model>.quiet.json, <model>.loaded.json)")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        KEEP[0] = a.keep
    models = [m for m in a.models if os.path.exists(m)]
    with tempfile.TemporaryDirectory(prefix="busy-measure-") as folder:
        WORK[0] = folder
        _run(models, folder, a)


def _run(models: list[str], folder: str, a: argparse.Namespace) -> None:
    rows = {}
    t0 = time.time()
    for m in models:
        rows[m] = {"quiet": one(m, folder, "quiet", not a.no_agreement)}
    with busy(a.load, a.load_kind):
        for m in models:
            rows[m]["loaded"] = one(m, folder, "loaded", not a.no_agreement)
    print(f"{len(models)} models, load {a.load} busy processes ({a.load_kind}) on {os.cpu_count()} cores, "
          f"{time.time() - t0:.0f} s; load average before the loaded half: see `uptime`")
    head = (f"{'model':24} {'same sel':>8} {'quiet':>6} {'loaded':>6} {'|d|':>5} {'A/A quiet':>12} "
            f"{'A/A loaded':>12}  agreement quiet / loaded (optimize bench profile)")
    print(head)
    same = close = agree = total_agree = 0
    for m, r in rows.items():
        q, lo = r["quiet"], r["loaded"]
        name = os.path.basename(m)[:24]
        if "error" in q or "error" in lo:
            print(f"{name:24} error: {q.get('error') or lo.get('error')}")
            continue
        sel = q["ops"] == lo["ops"]
        eq, el = q["effect"], lo["effect"]
        d = abs(eq - el) if eq is not None and el is not None else 0.0 if eq == el else None
        same += sel
        close += d is not None and d <= 0.05
        aa = lambda x: f"{x[0]:.3f}-{x[1]:.3f}" if x else "-"  # noqa: E731
        agr = []
        disagreed = []
        for tag, side in (("quiet", q), ("loaded", lo)):
            if "bench" in side:
                trio = (side["opt"], side["bench"], side["profile"])
                agree += len(set(trio)) == 1
                total_agree += 1
                agr.append(" ".join(trio))
                if len(set(trio)) > 1:
                    disagreed.append((tag, side["why"]))
        fmt = lambda e: f"{e:.3f}" if e is not None else "-"  # noqa: E731
        print(f"{name:24} {'yes' if sel else 'NO':>8} {fmt(eq):>6} {fmt(el):>6} "
              f"{(f'{d:.3f}' if d is not None else '-'):>5} {aa(q['aa']):>12} {aa(lo['aa']):>12}  {' / '.join(agr)}")
        for tag, why in disagreed:
            print(f"{'':24}   {tag}: " + "; ".join(f"{cmd} {_interval(r)} floor {f if f is None else f'{f:.1%}'}"
                                                   for cmd, (r, f) in why.items()))
        if not sel:
            diff = {k: (q["ops"].get(k, 0), lo["ops"].get(k, 0)) for k in set(q["ops"]) | set(lo["ops"])
                    if q["ops"].get(k, 0) != lo["ops"].get(k, 0)}
            print(f"{'':24}   ops quiet vs loaded: {diff}")
    print(f"same selection {same}/{len(rows)}, effect within 0.05 {close}/{len(rows)}, "
          f"optimize/bench/profile agree {agree}/{total_agree}")


if __name__ == "__main__":
    main()
