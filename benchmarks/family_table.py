#!/usr/bin/env python3
"""Audit table: attention blocks and norms present in transformer exports vs fused by onnxfuse and its peers.

Usage::

    python -m benchmarks.family_table /tmp/corpus/*.onnx /tmp/h12/*.onnx --json /tmp/audit.json
    python -m benchmarks.family_table X.onnx --tools onnxfuse --reuse /tmp/audit.json   # peers from a run before
    python -m benchmarks.family_table X.onnx --no-check                                # counts only

For each model:

* **present**: attention-like subgraphs, counted by their Softmax nodes (one per attention block in every
  export family here), and norms: LayerNormalization nodes plus decomposed LayerNorm / RMSNorm (a Sqrt of
  ``Add(ReduceMean(...), eps)``, as torch writes both ``(x - mean) / sqrt(var + eps)`` and ``x * rsqrt(mean(x^2) +
  eps)``) and any fused norm op already in the file;
* **fused**, per tool: Attention / MultiHeadAttention / GroupQueryAttention (/ PackedAttention) nodes, and norm
  ops (LayerNormalization, SkipLayerNormalization, SkipSimplifiedLayerNormalization,
  SimplifiedLayerNormalization, RMSNormalization, EmbedLayerNormalization) in the tool's output:

  - ``onnxfuse``: ``onnxfuse optimize IN OUT --no-measure``;
  - ``ortx``: ``onnxruntime.transformers.optimizer.optimize_model(IN, model_type=..., num_heads=0,
    hidden_size=0)`` (model type from the file name, see ``ORT_TYPES``; the next type is tried when one fails);
  - ``onnxscript``: ``onnxscript.rewriter.ort_fusions.optimize_for_ort`` on an ``onnx_ir`` model;

* **check** (default on): every output of every tool's model against the original, on the inputs
  ``onnxfuse.find_inputs`` discovers (the ones ``onnxfuse optimize`` validates on): the original at
  ORT_DISABLE_ALL, each variant at ORT_ENABLE_ALL, CPU; the largest absolute difference over all outputs, and
  ``FAIL`` where a variant does not load or run.
* ``--time S``: each variant against the original by the tool's own protocol (``onnxfuse.measure.compare``:
  A/A pairs, sessions made twice, interleaved; 1 intra-op thread, ORT_ENABLE_ALL), at least S seconds of runs
  each: the median ratio to the original's latency.

Cells read ``fused/present`` (attention, norms). Heavy: run one at a time on a shared machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.transformer_fusions import (
    all_nodes,
    one_line,
    onnxfuse_exe,
    run_onnxscript,
    run_ort_transformers,
)
from benchmarks.transformer_fusions import (
    model_types as _model_types,
)
from onnxfuse.measure.compare import compare

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                 "PackedMultiHeadAttention")
NORM_OPS = ("LayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
            "SimplifiedLayerNormalization", "RMSNormalization", "EmbedLayerNormalization")
# file-name keyword -> optimize_model model types to try, in order (first keyword found wins)
ORT_TYPES: dict[str, tuple[str, ...]] = {
    "distilbert": ("bert",), "bert": ("bert",), "vit": ("vit", "bert"), "clip": ("clip", "bert"),
    "swin": ("swin", "bert"), "segformer": ("bert",), "whisper": ("bart", "bert"), "bart": ("bart", "bert"),
    "t5": ("t5", "bert"), "gpt2": ("gpt2",), "llama": ("gpt2",), "gqa": ("gpt2",), "phi3": ("gpt2",),
}
TOOLS = ("onnxfuse", "ortx", "onnxscript")


@dataclass
class Counts:
    attention: int = 0
    norms: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # the fused ops by type


@dataclass
class ToolRow:
    tool: str
    counts: Counts | None = None
    error: str | None = None
    detail: str = ""
    seconds: float | None = None
    max_abs: float | None = None
    check_error: str | None = None
    ratio: float | None = None  # median latency / original's


@dataclass
class ModelRow:
    file: str
    present: Counts
    tools: dict[str, ToolRow] = field(default_factory=dict)
    feeds: str = ""


# --------------------------------------------------------------------------- #
# Counting
# --------------------------------------------------------------------------- #
def decomposed_norms(graph: onnx.GraphProto) -> int:
    """Sqrt(Add(ReduceMean(...), eps)): one per decomposed LayerNorm or RMSNorm (GlobalAveragePool in place of
    ReduceMean: a Keras LayerNormalization converted by tf2onnx)."""
    producer = {o: n for n in all_nodes(graph) for o in n.output}
    count = 0
    for n in all_nodes(graph):
        if n.op_type != "Sqrt" or not n.input:
            continue
        add = producer.get(n.input[0])
        if add is None or add.op_type != "Add":
            continue
        if any(producer.get(i) is not None and producer[i].op_type in ("ReduceMean", "GlobalAveragePool")
               for i in add.input):  # GlobalAveragePool: tf2onnx's Keras LayerNormalization
            count += 1
    return count


def count_fused(model: onnx.ModelProto) -> Counts:
    ops = collections.Counter(n.op_type for n in all_nodes(model.graph)
                              if n.op_type in ATTENTION_OPS + NORM_OPS + ("RotaryEmbedding",))
    return Counts(attention=sum(ops[o] for o in ATTENTION_OPS), norms=sum(ops[o] for o in NORM_OPS),
                  ops=dict(sorted(ops.items())))


def count_present(model: onnx.ModelProto) -> Counts:
    softmax = sum(n.op_type == "Softmax" for n in all_nodes(model.graph))
    fused = count_fused(model)
    return Counts(attention=softmax + fused.attention, norms=decomposed_norms(model.graph) + fused.norms,
                  ops=fused.ops)


# --------------------------------------------------------------------------- #
# Tools
# --------------------------------------------------------------------------- #
def model_types(path: Path) -> tuple[str, ...]:
    return _model_types(path, ORT_TYPES)


def _torch_version_stub() -> None:
    """optimize_model (opt_level > 0) imports ``torch.version`` only to read ``torch.version.hip`` (ROCm
    providers); where torch is not installed, a stub module says "not ROCm"."""
    try:
        import torch  # noqa: F401
    except ImportError:
        import types

        stub, version = types.ModuleType("torch"), types.ModuleType("torch.version")
        version.hip = None  # type: ignore[attr-defined]
        stub.version = version  # type: ignore[attr-defined]
        sys.modules.setdefault("torch", stub)
        sys.modules.setdefault("torch.version", version)


def run_ortx(src: Path, dst: Path) -> str:
    _torch_version_stub()
    return run_ort_transformers(src, dst, None, model_types(src))


def run_onnxfuse(src: Path, dst: Path) -> str:
    cmd = [onnxfuse_exe(), "optimize", str(src), str(dst), "--no-measure", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 or not dst.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"rc={proc.returncode}: " + (tail[-1] if tail else "no output"))
    try:
        res = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return ""
    rolled = [r.get("rule", "?") if isinstance(r, dict) else str(r) for r in res.get("rolled_back") or []]
    status = (res.get("validation") or {}).get("status", "?")
    return f"validation {status}" + (f"; rolled back {', '.join(rolled)}" if rolled else "")


RUNNERS = {"onnxfuse": run_onnxfuse, "ortx": run_ortx, "onnxscript": run_onnxscript}


# --------------------------------------------------------------------------- #
# Checks
# --------------------------------------------------------------------------- #
def session(path: str, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def max_abs(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    worst = 0.0
    for r, g in zip(ref, got, strict=True):
        if r.shape != g.shape:
            return float("inf")
        if r.size == 0:
            continue
        if np.issubdtype(r.dtype, np.floating):
            rr, gg = r.astype(np.float64), g.astype(np.float64)
            both_nan = np.isnan(rr) & np.isnan(gg)
            d = np.where(both_nan, 0.0, np.abs(rr - gg))
            worst = max(worst, float(np.nanmax(np.where(np.isnan(d), np.inf, d))))
        else:
            worst = max(worst, float(np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)))))
    return worst


def check(row: ModelRow, src: Path, paths: dict[str, Path], seconds: float) -> None:
    import onnxfuse

    try:
        plan = onnxfuse.find_inputs(str(src))
        feeds = plan.feeds
        row.feeds = ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())
        base = session(str(src), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        names = [o.name for o in base.get_outputs()]
        ref = base.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - no reference: nothing to check
        for t in row.tools.values():
            t.check_error = f"reference: {one_line(exc)}"
        return
    sessions: dict[str, ort.InferenceSession] = {}
    for tool, path in paths.items():
        t = row.tools[tool]
        try:
            sess = session(str(path), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
            t.max_abs = max_abs(ref, sess.run(names, feeds))
            sessions[tool] = sess
        except Exception as exc:  # noqa: BLE001 - record
            t.check_error = one_line(exc)
    if seconds <= 0 or not sessions:
        return
    del sessions  # each variant against the original by the tool's own protocol (onnxfuse.measure.compare)
    for tool, path in paths.items():
        if row.tools[tool].check_error is None:
            row.tools[tool].ratio = compare(str(src), str(path), feeds, seconds=seconds).verdict.ratio.median


# --------------------------------------------------------------------------- #
# Table
# --------------------------------------------------------------------------- #
def cell(t: ToolRow | None, present: Counts) -> str:
    if t is None:
        return "-"
    if t.error:
        return "error"
    assert t.counts is not None
    text = f"{t.counts.attention}/{present.attention}, {t.counts.norms}/{present.norms}"
    if t.check_error:
        text += " FAIL"
    elif t.max_abs is not None:
        text += f" ({t.max_abs:.0e})"
    if t.ratio is not None:
        text += f" x{t.ratio:.2f}"
    return text


def markdown(rows: list[ModelRow], tools: list[str]) -> str:
    lines = ["| model | attention (Softmax) | norms | " + " | ".join(tools) + " |",
             "|---|---|---|" + "---|" * len(tools)]
    for r in rows:
        cells = [cell(r.tools.get(t), r.present) for t in tools]
        lines.append(f"| {r.file} | {r.present.attention} | {r.present.norms} | " + " | ".join(cells) + " |")
    tot = ["**total**", str(sum(r.present.attention for r in rows)), str(sum(r.present.norms for r in rows))]
    for t in tools:
        rs = [r for r in rows if r.tools.get(t) and r.tools[t].counts]
        att = sum(min(r.tools[t].counts.attention, r.present.attention) for r in rs)  # type: ignore[union-attr]
        nrm = sum(min(r.tools[t].counts.norms, r.present.norms) for r in rs)  # type: ignore[union-attr]
        pa = sum(r.present.attention for r in rows) or 1
        pn = sum(r.present.norms for r in rows) or 1
        tot.append(f"{att / pa:.0%} attention, {nrm / pn:.0%} norms")
    lines.append("| " + " | ".join(tot) + " |")
    lines.append("")
    lines.append("Cells: fused attention / present, fused norms / present, (max abs diff to the original over "
                 "all outputs), xN = median latency / original's; FAIL = does not load or run.")
    problems = [f"- {r.file} {k}: {t.error or t.check_error}" for r in rows for k, t in r.tools.items()
                if t.error or t.check_error]
    if problems:
        lines += ["", "Errors:", *problems]
    return "\n".join(lines)


def to_row(d: dict[str, Any]) -> ModelRow:
    tools = {}
    for k, t in d["tools"].items():
        counts = Counts(**t["counts"]) if t.get("counts") else None
        tools[k] = ToolRow(**{**t, "counts": counts})
    return ModelRow(d["file"], Counts(**d["present"]), tools, d.get("feeds", ""))


def audit(src: Path, tools: list[str], work: Path, do_check: bool, seconds: float,
          reused: ModelRow | None) -> ModelRow:
    model = onnx.load(str(src), load_external_data=False)
    row = ModelRow(src.name, count_present(model))
    del model
    paths: dict[str, Path] = {}
    for tool in TOOLS:
        if tool not in tools:
            if reused is not None and tool in reused.tools:
                row.tools[tool] = reused.tools[tool]
            continue
        dst = work / f"{src.stem}.{tool}.onnx"
        t = ToolRow(tool)
        t0 = time.perf_counter()
        try:
            t.detail = RUNNERS[tool](src, dst)
            t.counts = count_fused(onnx.load(str(dst), load_external_data=False))
            paths[tool] = dst
        except Exception as exc:  # noqa: BLE001 - record and go on
            t.error = one_line(exc)
        t.seconds = time.perf_counter() - t0
        row.tools[tool] = t
    if do_check:
        check(row, src, paths, seconds)
    for p in paths.values():
        p.unlink(missing_ok=True)
        Path(str(p) + ".data").unlink(missing_ok=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="ONNX files")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated: " + ", ".join(TOOLS))
    ap.add_argument("--no-check", action="store_true", help="counts only; do not run the models")
    ap.add_argument("--time", type=float, default=0, metavar="SECONDS",
                    help="also compare each variant with the original (at least SECONDS of runs each)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--reuse", help="a --json file of an earlier run: tools not run now keep its results")
    a = ap.parse_args(argv)
    tools = [t for t in a.tools.split(",") if t]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        ap.error(f"unknown tool(s): {', '.join(sorted(unknown))}")
    reused = {}
    if a.reuse and Path(a.reuse).exists():
        reused = {d["file"]: to_row(d) for d in json.loads(Path(a.reuse).read_text())}
    ort.set_default_logger_severity(3)
    rows: list[ModelRow] = []
    with tempfile.TemporaryDirectory(prefix="family_table_") as tmp:
        for m in a.models:
            src = Path(m)
            row = audit(src, tools, Path(tmp), not a.no_check, a.time, reused.get(src.name))
            rows.append(row)
            print(f"{src.name}: " + "; ".join(f"{k} {cell(t, row.present)}" for k, t in row.tools.items()),
                  file=sys.stderr, flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    shown = [t for t in TOOLS if any(t in r.tools for r in rows)]
    print(markdown(rows, shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
