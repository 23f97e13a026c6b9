#!/usr/bin/env python3
"""A concept-variation corpus: attention, norms and GELU built as the cross product of concept axes, and what
onnxruntime's transformers optimizer and onnxfuse fuse on each graph, tabulated by axis.

Usage::

    python -m benchmarks.concept_corpus [--dir /tmp/concepts] [--only attn_,ln_] [--jobs 2] [--json out.json]
    python -m benchmarks.concept_corpus --list          # the graphs and their axes, nothing built
    python -m benchmarks.concept_corpus --build-only    # write the graphs and concepts.json, nothing measured

The forms corpus (corpora/forms.py) holds one graph per exporter's spelling; this one varies one concept at
a time so that a miss is attributed to the axis that causes it. Axes:

* attention (``attn_*``): layout (``4d`` Reshape to [b, s, N, D] with a constant target, ``4d_shape`` the target
  computed from Shape, ``3d`` heads folded into the batch [b*N, s, D] for 3-D MatMuls, ``tr_first`` a Transpose
  before the Reshape); K transposed in the head-split perm (``perm``) or by a Transpose of its own
  (``separate``); Q/K/V separate, packed (one MatMul + Split) or already split into heads (``heads``: [b, N, s,
  D] graph inputs); scale (``div`` / ``mul`` on the scores, ``q`` on the query, ``qk`` sqrt(scale) on both,
  ``rt`` 1/Sqrt(Cast(Shape(q)[-1])) computed at run time on the scores, ``rt_qk`` its square root on both,
  ``none``); mask (``none``, ``bert`` (1 - m) * -10000 from an int [b, s] mask, ``add2`` / ``add4`` an additive
  float [s, s] / [b, 1, s, s] input, ``where`` Where(bool [b, 1, 1, s], x, finfo.min), ``causal`` a tril buffer
  sliced by Shape); projection bias (with/without); opset (13/17/18/20, cycled).
* norms (``ln_*``, ``rms_*``): square by Pow or Mul, the division by Div, Reciprocal-Mul or Div(1, ·), epsilon
  order, beta or not, a residual Add (+ bias) before (Skip forms), ONNX LayerNormalization-17 as the start,
  RMSNorm scale constant or a graph input, fp32/fp16; eps outside the Sqrt is not a LayerNorm (no tool may
  fuse it).
* GELU (``gelu_*``): erf in three operand orders, Div by sqrt(2) or Mul by 1/sqrt(2), the tanh approximation
  (Pow or products for the cube, constants multiplied out or not), ONNX Gelu-20 (none / tanh), with or
  without a bias Add before.
* attention, further concepts: value heads of another size than the query's and key's (``attn_dv_*``: 4-D or
  3-D heads, self- or cross-attention, masks on self-attention); grouped KV heads with a KV cache
  (``attn_gqa_*``: causal masks spelled by positions compared, a sliced constant triangle, Trilu or an added
  term, with the attention mask's padding, times the scale spellings, repeat_kv with a Shape-read or dynamo's
  Where(-1) target, K^T by one Transpose or through 3-D, the cache concatenated on axis 2 or -2;
  GroupQueryAttention must appear exactly on the causal ones: a mask of padding alone or one the caller feeds
  gets MultiHeadAttention, as does a mask that reads the concatenated cache's length, which
  GroupQueryAttention re-creates).
* MatMul with transposed operands (``mm_*``): either operand read through the last two axes swapped, the first
  axis moved before the last, or both (ranks 3 and 4), and the product transposed (ranks 2-4): FusedMatMul's
  views; a swap of two middle axes is a negative control.
* the provenance of operands (``prov_*``, corpora/provenance.py): attention on q, k, v from graph
  inputs, opaque producers and KV caches, in heads or not, the key arriving transposed, SDPA's output left in
  heads; biases of Gelu, SkipLayerNormalization and MultiHeadAttention computed at run time; negative controls.
* concept spellings (``ln_c_*``, ``rms_c_*``, ``gelu_c_*``), the ones no rule names op by op: the mean by
  ReduceSum / D, ReduceSum * (1/D) or ReduceSumSquare / D, the last axis as a positive index, the reciprocal
  square root as Pow(-0.5) or Reciprocal(Sqrt), the variance as E[x^2] - E[x]^2, float16 hidden states
  normalized in float32 between Casts (Llama's forward), GELU distributed over the sum (0.5x + 0.5x erf),
  with the halves inside, through erf(-x) and 1 - erf, the tanh form distributed, x * sigmoid(1.702 x); negative
  controls: a mean over the sequence axis, erf(x / 1.3).

Per graph: ORT-opt = ``onnxruntime.transformers.optimizer.optimize_model(model_type=bert|gpt2, num_heads,
hidden_size, opt_level=0)``; onnxfuse = ``onnxfuse optimize ... --no-measure --json`` (one batch), its
validation status, and its output run once in onnxruntime and compared with the untouched model (max abs
difference). ``expect`` is the kind a fused op can express (every variation except the negative controls).
The table counts per axis value: graphs, ORT-opt fused the kind, onnxfuse fused it, onnxfuse >= ORT-opt,
validated; then every graph onnxfuse misses with explain's reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.forms_table import (
    KINDS,
    missed_ops,
    one_line,
    onnxfuse_batch,
    onnxfuse_exe,
    op_counter,
    op_counter_of,
    ort_opt,
    runs,
    session_run,
)
from corpora.concepts import build, corpus, feeds

KINDS = {**KINDS, "matmul": {"FusedMatMul"}}  # the kinds this corpus counts (FusedMatMul's views besides)

# An output further than this (max abs) from the untouched model's is flagged and not counted as fused: float32
# rounding of these one-block graphs stays near 1e-6, and replacing Gelu's tanh form by erf is 4.6e-4 off.
FAR, FAR16 = 1e-4, 1e-2


def _far(axes: dict) -> float:
    return FAR if axes.get("dtype") == "fp32" else FAR16


def measure(src_dir: Path, manifest: dict[str, dict], work: Path, jobs: int) -> list[dict]:
    (work / "ortopt").mkdir(parents=True, exist_ok=True)
    fuse = onnxfuse_batch([src_dir / v["file"] for v in manifest.values()], work / "onnxfuse", jobs)
    rows = []
    for name, info in manifest.items():
        src = src_dir / info["file"]
        model = onnx.load(str(src))
        before = op_counter(model)
        fd = feeds(model)
        ref = session_run(src, fd, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        row = {"model": name, "axes": info["axes"], "expect": info["expect"]}
        dst = work / "ortopt" / info["file"]
        try:
            ort_opt(src, dst, info)
            row["ortopt"] = dict(op_counter_of(onnx.load(str(dst))) - before)
            row["ortopt_runs"], row["ortopt_max_abs"] = runs(dst, fd, ref)
        except Exception as exc:  # noqa: BLE001 - reported
            row["ortopt"], row["ortopt_error"] = {}, one_line(exc)
        r = fuse.get(name)
        if r is None or r.get("error"):
            row["onnxfuse"], row["validated"] = {}, "error: " + str((r or {}).get("error") or "no result")[:80]
        else:
            row["onnxfuse"] = dict(op_counter(r["ops_after"]) - op_counter(r["ops_before"]))
            row["validated"] = r["validation"]["status"]
            row["fired"] = r["fired"]
            if r.get("output") and Path(r["output"]).exists():
                row["onnxfuse_runs"], row["onnxfuse_max_abs"] = runs(Path(r["output"]), fd, ref)
        if (row.get("ortopt_max_abs") or 0) > _far(info["axes"]):  # a fusion that changes the numbers is not one to match
            row["ortopt_wrong"], row["ortopt"] = row["ortopt"], {}
        row["missed"] = missed_ops(collections.Counter(row["ortopt"]), collections.Counter(row["onnxfuse"]))
        kind = info["expect"]
        # a kind's op in the output, made by the tool or already there (Gelu-20, LayerNormalization-17: the
        # starting points count as fused where the tool kept or refined them)
        row["ort_has"] = kind is not None and any((row["ortopt"].get(o) or before.get(o)) for o in KINDS[kind])
        row["fuse_has"] = kind is not None and any(
            (row["onnxfuse"].get(o) or before.get(o)) for o in KINDS[kind]) and not row["missed"]
        if name.startswith("prov_bias_mha") and r and not r.get("error"):  # a refinement: the three bias Adds go
            row["fuse_has"] = row["fuse_has"] and (r["ops_before"].get("Add", 0) - r["ops_after"].get("Add", 0) >= 3)
        if kind is None:  # a negative control: nothing of any kind may appear (the provenance controls are
            # attention-shaped: only attention; their scores' FusedMatMul is right)
            kinds = [KINDS["attention"]] if name.startswith("prov_neg") else KINDS.values()
            row["fuse_wrong"] = any(row["onnxfuse"].get(o) for ops in kinds for o in ops)
        row["reason"] = explain(src, kind) if kind and not row["fuse_has"] else ""
        rows.append(row)
    return rows


def explain(path: Path, kind: str) -> str:
    """`onnxfuse explain`'s near miss with the most progress among the rules of `kind` (rules whose file is
    attention.yaml / norm.yaml / gelu.yaml), as `rule: at: reason`."""
    proc = subprocess.run([onnxfuse_exe(), "explain", str(path), "--json"], capture_output=True, text=True,
                          check=False)
    try:
        d = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return f"explain failed: {proc.stderr.strip()[-200:]}"
    files = {"attention": "attention", "norm": "norm", "gelu": "gelu"}[kind]
    cands = [m for m in d["near_misses"] if files in str(m.get("file", m["rule"])) or _rule_kind(m["rule"]) == kind]
    if not cands:
        return "no near miss"
    m = max(cands, key=lambda m: (m["progress"], m["graph"] == "rewritten"))
    return f"{m['rule']}: {m['at']}: {m['reason']}" + (" (before the fusions ran)" if m["graph"] != "rewritten"
                                                        else "")


def _rule_kind(rule: str) -> str | None:
    for key, kind in (("rotary", None), ("attention", "attention"), ("norm", "norm"), ("skip-", "norm"),
                      ("gelu", "gelu")):
        if key in rule:
            return kind
    return None


def ok(row: dict) -> bool:
    return str(row.get("validated", "")).startswith(("passed", "not needed"))


def report(rows: list[dict]) -> None:
    for family, prefix in (("attention", "attn_"), ("norm", ("ln_", "rms_")), ("gelu", "gelu_"), ("matmul", "mm_"),
                           ("provenance", "prov_")):
        fam = [r for r in rows if r["model"].startswith(prefix)]
        if not fam:
            continue
        print(f"\n## {family}: {len(fam)} graphs\n")
        print("| axis | value | graphs | ORT-opt fuses | onnxfuse fuses | onnxfuse >= ORT-opt | validated |")
        print("|---|---|---|---|---|---|---|")
        axes = list(dict.fromkeys(a for r in fam for a in r["axes"]))
        for axis in axes:
            values = dict.fromkeys(str(r["axes"].get(axis, "-")) for r in fam)
            for value in values:
                sel = [r for r in fam if str(r["axes"].get(axis, "-")) == value]
                kind_sel = [r for r in sel if r["expect"]]
                print(f"| {axis} | {value} | {len(sel)} | {sum(r['ort_has'] for r in kind_sel)} | "
                      f"{sum(r['fuse_has'] for r in kind_sel)}/{len(kind_sel)} | "
                      f"{sum(not r['missed'] for r in sel)} | {sum(ok(r) for r in sel)} |")
        exp = [r for r in fam if r["expect"]]
        print(f"\n- {family}: onnxfuse fuses {sum(r['fuse_has'] for r in exp)}/{len(exp)} expressible variations, "
              f"ORT-opt {sum(r['ort_has'] for r in exp)}/{len(exp)}; onnxfuse >= ORT-opt on "
              f"{sum(not r['missed'] for r in fam)}/{len(fam)}; validated {sum(ok(r) for r in fam)}/{len(fam)}")
        wrong = [r["model"] for r in fam if r.get("fuse_wrong")]
        if any(not r["expect"] for r in fam):
            print(f"- negative controls fused by onnxfuse (must be none): {wrong}")
        far = [r["model"] for r in fam if (r.get("onnxfuse_max_abs") or 0) > _far(r["axes"])]
        print(f"- onnxfuse outputs further than {FAR:g} (fp16 and upcast: {FAR16:g}) from the original: {far}")
        ort_far = {r["model"]: r["ortopt_wrong"] for r in fam if r.get("ortopt_wrong")}
        print(f"- ORT-opt outputs further than {FAR:g} (fp16: {FAR16:g}) from the original (not counted as fused): {ort_far}")
        grouped = [r for r in fam if r["axes"].get("heads") == "grouped"]
        if grouped:  # GroupQueryAttention exactly where the mask is causal (the others: MultiHeadAttention)
            causal = [r for r in grouped if r["axes"]["mask"] not in ("padding", "input")]
            gqa = [r["model"] for r in causal if r["onnxfuse"].get("GroupQueryAttention")]
            wrong = [r["model"] for r in grouped if r not in causal and r["onnxfuse"].get("GroupQueryAttention")]
            print(f"- grouped KV heads with a cache: GroupQueryAttention on {len(gqa)}/{len(causal)} causal graphs; "
                  f"on the {len(grouped) - len(causal)} whose mask is not causal (must be none): {wrong}")
    misses = [r for r in rows if r["reason"]]
    print(f"\n## onnxfuse misses ({len(misses)}), explain's reason\n")
    causes: dict[str, list[str]] = collections.defaultdict(list)
    for r in misses:
        causes[r["reason"].split(": ", 2)[-1][:110]].append(r["model"])
    for cause, models in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"- {len(models)}: {cause}  [{', '.join(models[:3])}{', ...' if len(models) > 3 else ''}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="", help="where the graphs are written (default: a temporary folder)")
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the per-graph results here")
    ap.add_argument("--list", action="store_true", help="list the graphs and their axes")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    names = [n for n in corpus() if not args.only or any(n.startswith(p) for p in args.only.split(","))]
    if args.list:
        for n in names:
            print(n, json.dumps(corpus()[n][2], default=str))
        print(f"{len(names)} graphs")
        return 0
    tmp = None if args.dir else tempfile.mkdtemp(prefix="concepts_")
    src = Path(args.dir or tmp)
    try:
        manifest = build(src / "models", names)
        print(f"# {len(manifest)} graphs in {src / 'models'}", file=sys.stderr)
        if args.build_only:
            return 0
        rows = measure(src / "models", manifest, src / "out", args.jobs)
        report(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
