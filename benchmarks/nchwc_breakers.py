#!/usr/bin/env python3
"""Which ops break onnxruntime's NCHWc chains, per model: a guide for layout rewrites.

Usage::

    python -m benchmarks.nchwc_breakers /tmp/membound_x/*.onnx /work/shared/models/ppocr_det_v4.onnx [--json F]

For each model, an onnxruntime CPU session at ORT_ENABLE_ALL (1 thread) writes its optimized graph
(``optimized_model_filepath``): the graph after onnxruntime's own fusions and its NchwcTransformer, which
rewrites Conv / pooling / some elementwise ops into the blocked layout (com.microsoft.nchwc) and puts a
``ReorderInput`` (NCHW -> NCHWc) before and a ``ReorderOutput`` (NCHWc -> NCHW) after each chain. One markdown
row per model:

* nchwc: nodes in the com.microsoft.nchwc domain (of which Conv), and convs whose output channels onnxruntime
  pads up to the block (input-model convs with ``Cout % block != 0`` less those left in NCHW: wasted compute
  and bytes);
* RI / RO: the number of ReorderInput / ReorderOutput nodes (each one a full copy of a tensor);
* RO -> consumers: the op types that consume a ReorderOutput's output (what onnxruntime could not keep in
  NCHWc: the chain breakers; ``<output>`` when it is a graph output), nodes counted once;
* -> RI producers: the op types that produce a ReorderInput's input (where a chain restarts; ``<input>`` for a
  graph input). Both from ``onnxfuse.inspect.remaining.layout_boundaries``, which ``onnxfuse profile`` uses for
  its notes on ReorderInput / ReorderOutput;
* NCHW convs: Conv/FusedConv nodes left in NCHW, with the reason read off their weights. The rules were
  measured on onnxruntime 1.32 with AVX-512 (block 16): a group-1 Conv needs ``Cin % 4 == 0`` when Cin >= 16
  (below 16 it reads NCHW directly); a depthwise Conv needs ``C % 4 == 0``; a grouped (not depthwise) Conv
  needs both per-group channel counts multiples of the block; output channels are padded up to the block.
  Reasons: ``Cin%4``, ``dw C%4``, ``grouped``, ``W not const`` (weight not an initializer), ``not 2-D``,
  ``other`` (none of those: e.g. a shape onnxruntime could not infer);
* ConvT / Transpose / Resize: ConvTranspose, Transpose and Resize/Upsample nodes left (none has an NCHWc kernel,
  except Resize/Upsample with integer scales, which shows under nchwc).

Light (one session per model, no timing).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import onnx

from onnxfuse.inspect.remaining import NCHWC, label, layout_boundaries, ort_optimized


def block_size() -> int:
    """The NCHWc block: 16 floats with AVX-512, 8 with AVX2 (read from /proc/cpuinfo; 8 elsewhere)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 8
    return 16 if " avx512f" in flags else 8


def why_nchw(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto], block: int) -> str:
    if len(n.input) < 2 or n.input[1] not in inits:
        return "W not const"
    w = inits[n.input[1]]
    if len(w.dims) != 4:
        return "not 2-D"
    group = next((a.i for a in n.attribute if a.name == "group"), 1)
    cout, cin_g = w.dims[0], w.dims[1]
    cin = cin_g * group
    if group > 1:
        if cin_g == 1 and cout == group:
            return "dw C%4" if cout % 4 else "other"
        return "grouped" if (cin_g % block or (cout // group) % block) else "other"
    if cin >= block and cin % 4:
        return "Cin%4"
    return "other"


def unaligned_convs(path: str, block: int) -> int:
    """Convs of the input model with a constant 4-D weight (initializer or Constant) whose output channels are not a multiple of block."""
    m = onnx.load(path, load_external_data=False)
    inits = {t.name: t for t in m.graph.initializer}
    for n in m.graph.node:  # weights written as Constant nodes (paddle2onnx, some torch exports)
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            inits[n.output[0]] = n.attribute[0].t
    return sum(1 for n in m.graph.node if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits
               and len(inits[n.input[1]].dims) == 4 and inits[n.input[1]].dims[0] % block)


def analyse(path: str, block: int) -> dict:
    g = ort_optimized(path).graph
    inits = {t.name: t for t in g.initializer}
    bounds = layout_boundaries(g)
    ro_cons = {op: len(names) for op, names in bounds.ends.items()}
    ri_prod = {op: len(names) for op, names in bounds.starts.items()}
    nchw: collections.Counter[str] = collections.Counter()
    nchwc_conv = 0
    for n in g.node:
        if n.op_type in ("Conv", "FusedConv") and n.domain != NCHWC:
            nchw[why_nchw(n, inits, block)] += 1
        elif n.op_type == "Conv" and n.domain == NCHWC:
            nchwc_conv += 1
    # onnxruntime pads a reordered weight's output channels up to the block, so the padded convs are counted
    # on the input model: its convs with Cout % block != 0, less those left in NCHW
    left_unaligned = sum(1 for n in g.node if n.op_type in ("Conv", "FusedConv") and n.domain != NCHWC
                         and n.input[1] in inits and inits[n.input[1]].dims[0] % block)
    padded = max(0, unaligned_convs(path, block) - left_unaligned)
    hist = collections.Counter(label(n) for n in g.node)
    return {
        "model": Path(path).stem, "nodes_opt": len(g.node), "nchwc_nodes": sum(v for k, v in hist.items()
                                                                            if k.startswith("nchwc.")),
        "nchwc_conv": nchwc_conv, "nchwc_conv_padded": padded,
        "reorder_input": hist.get("nchwc.ReorderInput", 0), "reorder_output": hist.get("nchwc.ReorderOutput", 0),
        "ro_consumers": ro_cons, "ri_producers": ri_prod,
        "nchw_conv": dict(nchw.most_common()), "conv_transpose": hist.get("ConvTranspose", 0),
        "transpose": hist.get("Transpose", 0),
        "resize": hist.get("Resize", 0) + hist.get("Upsample", 0),
        "hist": dict(hist.most_common()),
    }


def fmt(c: dict, k: int = 4) -> str:
    return ", ".join(f"{op} {v}" for op, v in list(c.items())[:k]) or "-"


def table(rows: list[dict], block: int) -> str:
    lines = [f"NCHWc block {block}; counts are nodes of onnxruntime's optimized graph (ORT_ENABLE_ALL, CPU).", "",
             "| model | nodes | nchwc (Conv, padded) | RI | RO | RO -> consumers | -> RI producers | "
             "NCHW convs (why) | ConvT / Transpose / Resize |",
             "|---|---:|---|---:|---:|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} | | | | | | | |")
            continue
        n_nchw = sum(r["nchw_conv"].values())
        nchw = f"{n_nchw}" + (f" ({fmt(r['nchw_conv'])})" if n_nchw else "")
        lines.append(f"| {r['model']} | {r['nodes_opt']} | {r['nchwc_nodes']} ({r['nchwc_conv']}, "
                     f"{r['nchwc_conv_padded']}) | {r['reorder_input']} | {r['reorder_output']} | "
                     f"{fmt(r['ro_consumers'])} | {fmt(r['ri_producers'])} | {nchw} | "
                     f"{r['conv_transpose']} / {r['transpose']} / {r['resize']} |")
    total_ro: collections.Counter[str] = collections.Counter()
    total_ri: collections.Counter[str] = collections.Counter()
    for r in rows:
        total_ro.update(r.get("ro_consumers", {}))
        total_ri.update(r.get("ri_producers", {}))
    lines += ["", f"all models, RO -> consumers: {fmt(dict(total_ro.most_common()), 8)}",
              f"all models, -> RI producers: {fmt(dict(total_ri.most_common()), 8)}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--json", help="write every count here")
    a = ap.parse_args(argv)
    block = block_size()
    rows: list[dict] = []
    for path in a.models:
        try:
            rows.append(analyse(path, block))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row
            rows.append({"model": Path(path).stem, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows, block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
