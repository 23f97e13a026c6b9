#!/usr/bin/env python3
"""What onnxruntime's transformers optimizer, onnxscript's rewriter and onnxfuse fuse on the forms corpus.

Usage::

    python -m corpora.forms /tmp/forms          # once
    python -m benchmarks.forms_table [/tmp/forms] [--json out.json] [--only bert_,gpt2_] [--jobs 2]

Per model (listed in ``forms.json``, written by ``corpora/forms.py``):

* ORT-opt: ``onnxruntime.transformers.optimizer.optimize_model(path, model_type, num_heads, hidden_size,
  opt_level=0)`` on CPU, with the model type ``forms.json`` gives (``bert`` if that type fails);
* onnxscript: ``onnxscript.rewriter.ort_fusions.optimize_for_ort`` on an ``onnx_ir`` model;
* onnxfuse: ``onnxfuse optimize IN... OUTDIR --no-measure --json`` (one batch call), its validation status.

"Fused ops" are the ops an output has that its input did not (multiset difference), counting every
``com.microsoft`` op and the default-domain LayerNormalization / Gelu / RMSNormalization: a LayerNormalization
replaced by a SkipLayerNormalization shows as SkipLayerNormalization only, and in the comparison a norm op that
does more stands in for one that does less (``STANDS_IN``). Every ORT-opt and onnxscript output
is also run once in onnxruntime CPU (``runs``: yes / the error) and its first output compared with the
untouched model's (ORT_DISABLE_ALL, same feeds): a max abs difference over 1e-4 is flagged in the table.

Where ORT-opt fuses more of a kind than onnxfuse (kinds: attention = Attention + MultiHeadAttention (+ GQA,
counted together), norm = LayerNormalization / SkipLayerNormalization / EmbedLayerNormalization (per op type),
gelu = Gelu / FastGelu / BiasGelu (per op type)), ``onnxfuse explain IN --json`` is run and the near miss with
the most progress among that kind's rules is reported as ``rule: at: reason``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.transformer_fusions import quiet, run_onnxscript
from corpora.forms import feeds_for

KINDS = {
    "attention": {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                  "PackedMultiHeadAttention"},
    "norm": {"LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization",
             "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization"},
    "gelu": {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"},
}
MERGED = {"attention"}  # kinds compared by their total, not per op type
# A norm op that does more stands in for one that does less (a LayerNormalization written as a
# SkipLayerNormalization with a zero skip, checker-valid below opset 17; an embedding + LayerNorm as one
# EmbedLayerNormalization; a Gelu with its bias Add as one BiasGelu): per family, op types ordered from the most
# to the least fused. Op type T counts as missed where ORT-opt made more of T and the types above it together
# than onnxfuse did.
STANDS_IN = (("EmbedLayerNormalization", "SkipLayerNormalization", "LayerNormalization"),
             ("SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"), ("BiasGelu", "Gelu"))
DEFAULT_DOMAIN_FUSED = {"LayerNormalization", "Gelu", "RMSNormalization", "SimplifiedLayerNormalization"}
DIFF_FLAG = 1e-4  # a tool's output whose first output is further than this from the original is flagged
RULE_KIND = (("rotary", None), ("attention", "attention"), ("layernorm", "norm"), ("skip-", "norm"), ("embed", "norm"),
             ("gelu", "gelu"))


def one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if "failed:" in msg and "Load model from" in msg:  # drop onnxruntime's path prefix
        msg = msg.split("failed:", 1)[1].strip()
    return f"{type(exc).__name__}: {msg}"[:160]


def op_counter(ops: dict[str, int] | onnx.ModelProto) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    if isinstance(ops, onnx.ModelProto):
        for n in ops.graph.node:
            if n.domain == "com.microsoft" or (n.domain in ("", "ai.onnx") and n.op_type in DEFAULT_DOMAIN_FUSED):
                c[n.op_type] += 1
        return c
    for k, v in ops.items():
        if k.startswith("com.microsoft."):
            c[k.removeprefix("com.microsoft.")] += v
        elif k in DEFAULT_DOMAIN_FUSED:
            c[k] += v
    return c


def _centred(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether a SimplifiedLayerNormalization reads Sub(x, ReduceMean(x)): the RMS of the centred value, a
    LayerNorm written as two ops (onnxruntime's optimizer writes Pow-form LayerNorms so)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    sub = producer.get(node.input[0])
    if sub is None or sub.op_type != "Sub":
        return False
    mean = producer.get(sub.input[1])
    return mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == sub.input[0]


def op_counter_of(model: onnx.ModelProto) -> collections.Counter:
    """op_counter, with a SimplifiedLayerNormalization of a centred value counted as the LayerNormalization it is
    (so that one LayerNormalization op for the same graph is not counted as a miss of it)."""
    c = op_counter(model)
    for n in model.graph.node:
        if n.op_type == "SimplifiedLayerNormalization" and n.domain in ("", "ai.onnx") and _centred(model, n):
            c["SimplifiedLayerNormalization"] -= 1
            c["LayerNormalization"] += 1
    return +c


def session_run(path: Path, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def runs(path: Path, feeds, ref: list) -> tuple[str, float | None]:
    """("yes", max abs difference of the first output to the untouched model) or (the error, None)."""
    try:
        out = session_run(path, feeds)
        return "yes", float(np.abs(out[0].astype(np.float64) - ref[0]).max())
    except Exception as exc:  # noqa: BLE001 - reported
        return one_line(exc), None


def ort_opt(src: Path, dst: Path, info: dict) -> str:
    from onnxruntime.transformers import optimizer

    errors = []
    for mtype in dict.fromkeys([info["model_type"], "bert"]):
        try:
            with quiet():
                m = optimizer.optimize_model(str(src), model_type=mtype, num_heads=info["num_heads"],
                                             hidden_size=info["hidden_size"], opt_level=0, use_gpu=False)
                m.save_model_to_file(str(dst), use_external_data_format=False)
            return mtype
        except Exception as exc:  # noqa: BLE001 - try bert next
            errors.append(f"{mtype}: {one_line(exc)}")
    raise RuntimeError("; ".join(errors))


def onnxfuse_exe() -> str:
    exe = Path(sys.executable).with_name("onnxfuse")
    return str(exe) if exe.exists() else "onnxfuse"


def onnxfuse_batch(paths: list[Path], out_dir: Path, jobs: int) -> dict[str, dict]:
    cmd = [onnxfuse_exe(), "optimize", *map(str, paths), str(out_dir), "--no-measure", "--json", "--jobs",
           str(jobs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        results = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"onnxfuse optimize failed: {proc.stderr.strip()[-500:]}")
    if isinstance(results, dict):
        results = [results]
    return {Path(r["input"]).stem: r for r in results}


# the rules whose near misses explain a missing op type (attention: every attention rule)
OP_RULES = {
    "LayerNormalization": ("layernorm-decomposed", "layernorm-batchnorm-form"),
    "SkipLayerNormalization": ("skip-layernorm", "skip-layernorm-bias", "layernorm-decomposed"),
    "EmbedLayerNormalization": ("embed-layernorm",),
    "FastGelu": ("tanh-gelu", "bias-fastgelu"),
    "BiasGelu": ("bias-gelu", "erf-gelu"),
    "Gelu": ("erf-gelu",),
}


def explain(path: Path, missed: list[str]) -> str:
    """One line per missed op type (or "attention"): the near miss with the most progress among the rules
    that make it; where none of them has one, what fired of them and the kind's nearest miss instead."""
    proc = subprocess.run([onnxfuse_exe(), "explain", str(path), "--json"], capture_output=True, text=True,
                          check=False)
    try:
        d = json.loads(proc.stdout)
        misses, fired = d["near_misses"], d.get("fired", {})
    except (json.JSONDecodeError, KeyError):
        return f"explain failed: {proc.stderr.strip()[-200:]}"
    out = []
    for what in missed:
        kind = "attention" if what == "attention" else next(k for k, ops in KINDS.items() if what in ops)
        rules = OP_RULES.get(what)
        cands = [m for m in misses if (m["rule"] in rules if rules else rule_kind(m["rule"]) == kind)]
        prefix = ""
        if not cands:
            fired_here = {r: n for r, n in fired.items() if rule_kind(r) == kind}
            prefix = f"{what}: no near miss of {'/'.join(rules) if rules else 'the attention rules'}"
            prefix += f" (fired: {fired_here})" if fired_here else ""
            cands = [m for m in misses if rule_kind(m["rule"]) == kind]
            if not cands:
                out.append(prefix)
                continue
            prefix += "; nearest: "
        m = max(cands, key=lambda m: (m["progress"], m["graph"] == "rewritten"))
        where = " (before the fusions ran)" if m["graph"] != "rewritten" else ""
        out.append(f"{prefix}{m['rule']}: {m['at']}: {m['reason']}{where}")
    return " / ".join(dict.fromkeys(out))


def rule_kind(rule: str) -> str | None:
    for key, kind in RULE_KIND:
        if key in rule:
            return kind
    return None


def missed_ops(ortc: collections.Counter, fusec: collections.Counter) -> list[str]:
    """"attention" and the norm / gelu op types ORT-opt made more of than onnxfuse."""
    missed = []
    for kind, ops in KINDS.items():
        if kind in MERGED:
            if sum(ortc[o] for o in ops) > sum(fusec[o] for o in ops):
                missed.append(kind)
        else:
            ladder = {o: chain[:chain.index(o) + 1] for chain in STANDS_IN for o in chain}
            missed += [o for o in sorted(ops) if sum(ortc[t] for t in ladder.get(o, (o,))) >
                       sum(fusec[t] for t in ladder.get(o, (o,)))]
    return missed


def missed_kinds(missed: list[str]) -> set[str]:
    return {"attention" if m == "attention" else next(k for k, ops in KINDS.items() if m in ops) for m in missed}


def fmt(c: collections.Counter | None, err: str | None = None) -> str:
    if err:
        return f"error: {err[:60]}"
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) if c else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default="/tmp/forms")
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--json", help="write the per-model results here")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="write the tools' outputs here instead of a temporary folder")
    args = ap.parse_args(argv)
    src_dir = Path(args.dir)
    models = json.loads((src_dir / "forms.json").read_text())["models"]
    if args.only:
        models = {k: v for k, v in models.items() if any(k.startswith(p) for p in args.only.split(","))}
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="forms_table_"))
    for sub in ("ortopt", "onnxscript", "onnxfuse"):
        (work / sub).mkdir(parents=True, exist_ok=True)

    fuse = onnxfuse_batch([src_dir / v["file"] for v in models.values()], work / "onnxfuse", args.jobs)
    rows = []
    for name, info in models.items():
        src = src_dir / info["file"]
        model = onnx.load(str(src))
        before = op_counter(model)
        feeds = feeds_for(model)
        ref = session_run(src, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        row = {"model": name, "form": info["form"], "family": info["family"]}
        for tool, fn in (("ortopt", lambda s, d, i=info: ort_opt(s, d, i)), ("onnxscript", run_onnxscript)):
            dst = work / tool / info["file"]
            try:
                detail = fn(src, dst)
                row[tool] = dict(op_counter_of(onnx.load(str(dst))) - before)
                row[f"{tool}_runs"], row[f"{tool}_max_abs"] = runs(dst, feeds, ref)
                row[f"{tool}_detail"] = detail
            except Exception as exc:  # noqa: BLE001 - reported
                row[tool], row[f"{tool}_error"] = {}, one_line(exc)
        r = fuse.get(name)
        if r is None or r.get("error"):
            row["onnxfuse"], row["onnxfuse_error"] = {}, (r or {}).get("error") or "no result"
            row["onnxfuse_validated"] = "error"
        else:
            row["onnxfuse"] = dict(op_counter(r["ops_after"]) - op_counter(r["ops_before"]))
            row["onnxfuse_validated"] = r["validation"]["status"]
            row["onnxfuse_fired"] = r["fired"]
        # a fusion that changes the numbers (ORT-opt's BiasGelu for a tanh Gelu) is not one to match
        row["ortopt_wrong"] = (row.get("ortopt_max_abs") or 0) > DIFF_FLAG
        ortc = collections.Counter() if row["ortopt_wrong"] else collections.Counter(row["ortopt"])
        fusec = collections.Counter(row["onnxfuse"])
        row["missed"] = missed_ops(ortc, fusec)
        row["reason"] = explain(src, row["missed"]) if row["missed"] else ""
        rows.append(row)
        print(f"# {name}: done", file=sys.stderr)

    print("| model | form | ORT-opt fused | onnxscript fused | onnxfuse fused | onnxfuse validated | onnxfuse miss "
          "reason (explain) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        ortcell = fmt(collections.Counter(row["ortopt"]), row.get("ortopt_error"))
        if row.get("ortopt_runs", "yes") != "yes":
            ortcell += f" (does not run: {row['ortopt_runs'][-90:]})"
        if (row.get("ortopt_max_abs") or 0) > DIFF_FLAG:
            ortcell += f" (differs: max abs {row['ortopt_max_abs']:.1e})"
        oscell = fmt(collections.Counter(row["onnxscript"]), row.get("onnxscript_error"))
        if row.get("onnxscript_runs", "yes") != "yes":
            oscell += f" (does not run: {row['onnxscript_runs'][-90:]})"
        if (row.get("onnxscript_max_abs") or 0) > DIFF_FLAG:
            oscell += f" (differs: max abs {row['onnxscript_max_abs']:.1e})"
        print(f"| {row['model']} | {row['form']} | {ortcell} | {oscell} | "
              f"{fmt(collections.Counter(row['onnxfuse']), row.get('onnxfuse_error'))} | "
              f"{row['onnxfuse_validated']} | {row['reason'].replace('|', '/')} |")

    print("\nonnxfuse fuses at least what ORT-opt fuses (graphs where ORT-opt fuses something of the kind, and its "
          f"output is within {DIFF_FLAG:g} of the original's):")
    for kind, ops in KINDS.items():
        relevant = [r for r in rows if any(r["ortopt"].get(o) for o in ops) and not r["ortopt_wrong"]]
        ok = [r for r in relevant if kind not in missed_kinds(r["missed"])]
        more = [r for r in rows if not any(r["ortopt"].get(o) for o in ops) and any(r["onnxfuse"].get(o)
                                                                                     for o in ops)]
        print(f"- {kind}: {len(ok)}/{len(relevant)} graphs; onnxfuse alone fuses this kind on {len(more)} more")
    every = [r for r in rows if not r["missed"]]
    print(f"- all kinds: {len(every)}/{len(rows)} graphs")
    for tool in ("ortopt", "onnxscript"):
        bad = [r["model"] for r in rows if r.get(f"{tool}_runs", "yes") != "yes" or r.get(f"{tool}_error")]
        print(f"- {tool} output fails or does not run: {len(bad)} {bad}")
    notpass = [r["model"] for r in rows if not str(r["onnxfuse_validated"]).startswith(("passed", "not needed"))]
    print(f"- onnxfuse validation not passed: {len(notpass)} {notpass}")
    print("\nonnxfuse misses by explain's reason (node names and opsets blurred), one example each:")
    causes: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for r in rows:
        for part in filter(None, r["reason"].split(" / ")):
            key = re.sub(r"/model/[\w./-]+", "*", part.split("; nearest: ")[0])
            key = re.sub(r"'?\b[A-Za-z]+_\d+(_o\d*)?\b'?(/[\w/-]+)?", "*", key)
            key = re.sub(r"opset \d+", "opset N", key)
            causes[key].append((r["model"], part))
    for key, hits in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"- {len(hits)} graphs: {key}  [e.g. {hits[0][0]}: {hits[0][1]}]")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
