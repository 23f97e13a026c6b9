#!/usr/bin/env python3
"""How much of the "time between the GEMMs" onnxfuse removes, per model: the headroom table.

Usage::

    python -m corpora.membound /tmp/membound
    python -m benchmarks.headroom_table /tmp/membound/*.onnx /work/shared/models/ppocr_det_v4.onnx \\
        --json /tmp/headroom.json

For each model: ``onnxfuse.optimize(path, out, OptimizeOptions())`` (the default: validated, measured
selection at 1 thread), then ``onnxfuse.profile`` of the input and of the output (1 thread, ORT_ENABLE_ALL, CPU). Their latency
is measured first by the tool's comparison protocol (onnxfuse.measure.compare, ~4-12 s) and handed to
``profile(latency_ms=...)``: two sequential profiles on a shared machine differed by 20% on the same graph.
One markdown row per model:

* input ms / output ms: the profiles' measured latency (without the profiler), and their ratio;
* GEMM-bound ms: ``ProfileResult.gemm_bound_ms`` of the input (Conv/MatMul/Gemm/ConvTranspose/attention FLOPs at
  the GEMM peak measured in the same run). Depthwise convolutions count as Conv: their FLOPs are in the limit
  (tiny), their time is not in "remaining" (the ``dw Conv`` column shows it);
* captured: ``captured_share(input, output)`` = (input - output) / (input - limit);
* remaining: the top 3 ``remaining_costs()`` of the output: op, ms per run, share of kernel time, calls per run;
* dw Conv: time of the output's depthwise (group > 1) Conv nodes, ms and calls: the grouped Convs of
  onnxruntime's own optimized graph, whose node names the profiler uses (``depthwise_names``); part of the
  headroom although Conv is in the GEMM class;
* fired: ``Result.fired`` (rules kept by measured selection).

Then a mean captured-share line; a second table splits each output's headroom by what could remove it
(``ProfileResult.headroom_split``: ops outside the GEMM class, what fusion and layout remove; the FLOP ops' data
at the copy peak beyond their FLOPs at the GEMM peak, their roofline; their kernel time above that roofline; the
latency between kernels), with the input's and output's time outside GEMM work; and (``--json``) every number
plus both profiles' ``to_json()``.
Heavy: run it alone on the machine (timing), it takes about a minute per model.

Two corpora: ``corpora/membound.py`` builds six nets with onnx.helper in their cleanest form;
``corpora/membound_exports.py`` writes thirteen exported by real exporters (tf2onnx from Keras applications
EfficientNetB0 / MobileNetV3 and a Keras UNet, torch.onnx TorchScript and dynamo from torchvision
MobileNetV3 / EfficientNet / LRASPP / SSDLite, a plain-torch CRNN and YOLOv8n, paddle2onnx PP-OCR-rec-like and
MobileNetV3-small), in the forms users get (Keras NHWC transposes, BN as Mul/Add, Swish as x*Sigmoid,
ReduceMean squeezes, decomposed HardSwish, Identity leftovers), each exporter in its own venv::

    python -m corpora.membound_exports /tmp/membound_x --python-tf /tmp/tfvenv/bin/python \\
        --python-torch /tmp/tvv/bin/python --python-paddle /tmp/pdv/bin/python
    python -m benchmarks.headroom_table /tmp/membound_x/*.onnx --json /tmp/headroom_x.json
    python -m benchmarks.nchwc_breakers /tmp/membound_x/*.onnx      # what breaks onnxruntime's NCHWc chains
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

import onnxfuse
from onnxfuse.inspect.latency import probed_inputs
from onnxfuse.inspect.op_profile import ProfileResult, captured_share
from onnxfuse.inspect.remaining import ort_optimized
from onnxfuse.measure.compare import compare


def depthwise_names(path: str) -> set[str]:
    """The names of the grouped (group > 1: depthwise) convolutions in onnxruntime's own optimized graph of this
    file (ORT_ENABLE_ALL, CPU, as the profile runs it): the profiler names its nodes by that graph, whatever
    names the exporter gave (tf2onnx's and TorchScript's did not survive onnxruntime's fusions)."""
    g = ort_optimized(path).graph
    return {n.name for n in g.node if "Conv" in n.op_type and any(a.name == "group" and a.i > 1 for a in n.attribute)}


def depthwise_time(p: ProfileResult, names: set[str]) -> tuple[float, float]:
    """(ms per run, calls per run) of the profiled Conv nodes that are depthwise convs (by name, above)."""
    ms = calls = 0.0
    for s in p.by_node:
        if "Conv" in s.op and s.name in names:
            ms += s.total_us / 1e3
            calls += s.calls_per_run
    return ms, calls


def interleaved_ms(a: str, b: str, threads: int, seconds: float = 4.0) -> tuple[float, float]:
    """Median latency (ms) of a and b on the same feeds (onnxfuse's probed inputs of a), compared by the tool's
    own protocol (onnxfuse.measure.compare: A/A pairs, interleaved, sessions made twice), so that load from
    other processes hits both alike; about `seconds` of runs."""
    feeds = probed_inputs(a, onnx.load(a, load_external_data=False), None, None, "cpu")
    c = compare(a, b, feeds, threads=threads, seconds=seconds)
    return c.base_s * 1e3, c.variant_s * 1e3


def best_profiles(a: str, b: str, threads: int) -> tuple[ProfileResult, ProfileResult]:
    """Profiles of a and b whose latency is the interleaved measurement (sequential profiles of a busy machine
    can differ by 20% on the same graph); the kernel tables are each profile's own."""
    la, lb = interleaved_ms(a, b, threads)
    return (onnxfuse.profile(a, threads=threads, latency_ms=la),
            onnxfuse.profile(b, threads=threads, latency_ms=lb))


def one(path: str, tmp: str, threads: int) -> dict:
    out = str(Path(tmp) / Path(path).name)
    t0 = time.perf_counter()
    res = onnxfuse.optimize(path, out, onnxfuse.OptimizeOptions(measure_threads=threads))
    opt_s = time.perf_counter() - t0
    if not Path(out).exists():  # not written (e.g. failed validation): the output is the input
        out = path
    before, after = best_profiles(path, out, threads)
    dw_in, dw_out = depthwise_names(path), depthwise_names(out)
    return {
        "model": Path(path).stem, "path": path, "optimize_s": opt_s, "validation": res.validation,
        "nodes_before": res.nodes_before, "nodes_after": res.nodes_after, "fired": res.fired,
        "input_ms": before.latency_ms, "output_ms": after.latency_ms,
        "ratio": after.latency_ms / before.latency_ms if before.latency_ms else None,
        "gemm_bound_ms": before.gemm_bound_ms, "gemm_bound_out_ms": after.gemm_bound_ms,
        "headroom_in_ms": before.headroom_ms, "headroom_out_ms": after.headroom_ms,
        "captured": captured_share(before, after),
        "remaining": [{"op": s.op, "ms": s.total_us / 1e3, "share": s.share, "calls": s.calls_per_run}
                      for s in after.remaining_costs(5)],
        "remaining_in": [{"op": s.op, "ms": s.total_us / 1e3, "share": s.share, "calls": s.calls_per_run}
                         for s in before.remaining_costs(5)],
        "dw_conv_in": depthwise_time(before, dw_in), "dw_conv_out": depthwise_time(after, dw_out),
        "kernel_ms_out": after.kernel_ms,
        "split_in": before.headroom_split().__dict__, "split_out": after.headroom_split().__dict__,
        "profile_in": before.to_json(), "profile_out": after.to_json(),
    }


def fmt_remaining(rem: list[dict], k: int = 3) -> str:
    return "; ".join(f"{r['op']} {r['ms']:.2f} ({r['share']:.0%}, {r['calls']:.0f}x)" for r in rem[:k])


def table(rows: list[dict]) -> str:
    lines = ["| model | input ms | output ms | out/in | GEMM-bound ms | captured | top 3 remaining (output): "
             "op ms (share, calls) | dw Conv ms (calls) | fired |",
             "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} | | | | | | | |")
            continue
        cap = "n/a" if r["captured"] is None else f"{r['captured']:.0%}"
        fired = ", ".join(f"{k} {v}" for k, v in sorted(r["fired"].items())) or "-"
        dw_ms, dw_calls = r["dw_conv_out"]
        lines.append(f"| {r['model']} | {r['input_ms']:.2f} | {r['output_ms']:.2f} | {r['ratio']:.3f} | "
                     f"{r['gemm_bound_ms']:.2f} | {cap} | {fmt_remaining(r['remaining'])} | "
                     f"{dw_ms:.2f} ({dw_calls:.0f}) | {fired} |")
    caps = [r["captured"] for r in rows if r.get("captured") is not None]
    if caps:
        lines.append("")
        lines.append(f"mean captured share: {statistics.mean(caps):.1%} over {len(caps)} models "
                     f"(median {statistics.median(caps):.1%})")
    return "\n".join(lines)


def split_table(rows: list[dict]) -> str:
    """The output's headroom by what could remove it (ProfileResult.headroom_split), ms and share of its sum."""
    parts = (("other_ms", "outside GEMM (fusion, layout)"), ("flop_memory_ms", "FLOP ops' data (roofline)"),
             ("flop_kernel_ms", "FLOP kernels above roofline"), ("between_ms", "between kernels"))
    lines = ["| model | " + " | ".join(f"{label} ms" for _, label in parts) + " | outside GEMM: input ms -> output ms |",
             "|---|" + "---:|" * (len(parts) + 1)]
    shares: dict[str, list[float]] = {k: [] for k, _ in parts}
    for r in rows:
        if "split_out" not in r:
            continue
        out, inp = r["split_out"], r["split_in"]
        total = sum(max(0.0, out[k]) for k, _ in parts) or 1.0
        for k, _ in parts:
            shares[k].append(max(0.0, out[k]) / total)
        lines.append(f"| {r['model']} | " + " | ".join(f"{out[k]:.2f} ({max(0.0, out[k]) / total:.0%})"
                                                     for k, _ in parts)
                     + f" | {inp['other_ms']:.2f} -> {out['other_ms']:.2f} |")
    if shares["other_ms"]:
        lines.append("")
        lines.append("mean share of the output's headroom: " + ", ".join(
            f"{label} {statistics.mean(shares[k]):.0%}" for k, label in parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write every number here (rewritten after each model)")
    a = ap.parse_args(argv)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="headroom-") as tmp:
        for path in a.models:
            print(f"... {path}", file=sys.stderr, flush=True)
            try:
                rows.append(one(path, tmp, a.threads))
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row
                rows.append({"model": Path(path).stem, "path": path,
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
            if a.json:
                Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    print()
    print(split_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
