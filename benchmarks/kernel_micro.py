#!/usr/bin/env python3
"""Fused kernel against the ops it replaces, alone, on onnxruntime CPU: the facts behind measured selection's
decisions on norms and behind leaving GroupQueryAttention out.

Usage::

    python -m benchmarks.kernel_micro                 # 1 thread
    python -m benchmarks.kernel_micro --threads 2 --seconds 4

Cases (each pair is checked equal first, then compared by the tool's protocol, onnxfuse.measure.compare: A/A
pairs, sessions made twice, interleaved; the ratio is fused / unfused with its interval; about 2-6 s each):

* ``SkipLayerNormalization`` against ``Add`` + ``LayerNormalization`` (what a TorchScript / dynamo export at
  opset 17+ runs), hidden 256 and 768, 1 / 16 / 128 tokens;
* ``SkipSimplifiedLayerNormalization`` against ``Add`` + a decomposed RMSNorm (Pow, ReduceMean, Add, Sqrt, Div,
  Mul: onnxruntime fuses it into its own SimplifiedLayerNormalization at ORT_ENABLE_ALL), hidden 512 and 1024;
* ``GroupQueryAttention`` against what onnxfuse emits for a grouped-KV decoder layer (Concat of the cache, the
  KV heads repeated by Expand + Reshape, ``MultiHeadAttention`` with a causal mask), 8/2 and 16/4 heads of 64,
  prefill (128 tokens, empty cache) and decode (1 token after 127).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as oh

from onnxfuse.measure.compare import compare

OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)]


def model(nodes, inputs, outputs, inits) -> bytes:
    return oh.make_model(oh.make_graph(nodes, "m", inputs, outputs, inits), opset_imports=OPSETS).SerializeToString()


def vi(name: str, shape, elem=TP.FLOAT):
    return oh.make_tensor_value_info(name, elem, shape)


def timed(a: bytes, b: bytes, feeds: dict, threads: int, seconds: float) -> tuple[float, str]:
    """(max abs difference of the first outputs, the comparison's line: b against a), on `feeds` (each model
    reads the inputs it declares)."""
    sa, sb = (ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in (a, b))
    outs = [s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})[0] for s in (sa, sb)]
    del sa, sb
    c = compare(a, b, feeds, threads=threads, seconds=seconds, subset_inputs=True)
    return float(np.abs(outs[0] - outs[1]).max()), c.line()


def norms(threads: int, seconds: float) -> None:
    rng = np.random.default_rng(0)
    for kind, widths in (("layernorm", (256, 768)), ("rmsnorm", (512, 1024))):
        for e in widths:
            g = oh.make_tensor("g", TP.FLOAT, [e], rng.uniform(0.5, 1.5, e).astype(np.float32).tolist())
            b = oh.make_tensor("b", TP.FLOAT, [e], rng.standard_normal(e).astype(np.float32).tolist())
            ins = [vi("x", ["n", "t", e]), vi("s", ["n", "t", e])]
            outs = [vi("y", None), vi("sum", None)]
            if kind == "layernorm":
                plain = [oh.make_node("Add", ["x", "s"], ["sum"]),
                         oh.make_node("LayerNormalization", ["sum", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
                fused = [oh.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y", "", "", "sum"],
                                      domain="com.microsoft", epsilon=1e-5)]
                inits, name = [g, b], "SkipLayerNormalization vs Add + LayerNormalization"
            else:
                consts = [oh.make_tensor("two", TP.FLOAT, [], [2.0]), oh.make_tensor("ax", TP.INT64, [1], [-1]),
                          oh.make_tensor("eps", TP.FLOAT, [], [1e-5]), oh.make_tensor("one", TP.FLOAT, [], [1.0])]
                plain = [oh.make_node("Add", ["x", "s"], ["sum"]), oh.make_node("Pow", ["sum", "two"], ["p"]),
                         oh.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
                         oh.make_node("Add", ["m", "eps"], ["me"]), oh.make_node("Sqrt", ["me"], ["r"]),
                         oh.make_node("Div", ["one", "r"], ["ir"]), oh.make_node("Mul", ["sum", "ir"], ["n"]),
                         oh.make_node("Mul", ["g", "n"], ["y"])]
                fused = [oh.make_node("SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["y", "", "", "sum"],
                                      domain="com.microsoft", epsilon=1e-5)]
                inits, name = [g, *consts], "SkipSimplifiedLayerNormalization vs Add + RMSNorm (decomposed)"
            a = model(plain, ins, outs, inits)
            f = model(fused, ins, outs, [g] if kind == "rmsnorm" else [g, b])
            for t in (1, 16, 128):
                feeds = {"x": rng.standard_normal((1, t, e), np.float32),
                         "s": rng.standard_normal((1, t, e), np.float32)}
                diff, line = timed(a, f, feeds, threads, seconds)
                print(f"{name}, hidden {e}, {t:3d} tokens: {line} (max diff {diff:.1e})", flush=True)


def attention(threads: int, seconds: float) -> None:
    rng = np.random.default_rng(0)
    h = 64
    for n, nkv in ((8, 2), (16, 4)):
        ins = [vi("q", ["b", "s", n * h]), vi("k", ["b", "s", nkv * h]), vi("v", ["b", "s", nkv * h]),
               vi("pk", ["b", nkv, "p", h]), vi("pv", ["b", nkv, "p", h])]
        outs = [vi("y", None), vi("present_k", None), vi("present_v", None)]
        inits = [oh.make_tensor("s4", TP.INT64, [4], [0, 0, nkv, h]), oh.make_tensor("ax2", TP.INT64, [1], [2]),
                 oh.make_tensor("e5", TP.INT64, [5], [1, 1, n // nkv, 1, 1]),
                 oh.make_tensor("s4r", TP.INT64, [4], [0, n, -1, h])]
        nodes = []
        for x in ("k", "v"):
            nodes += [oh.make_node("Reshape", [x, "s4"], [f"{x}4"]),
                      oh.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3]),
                      oh.make_node("Concat", [f"p{x}", f"{x}h"], [f"present_{x}"], axis=2),
                      oh.make_node("Unsqueeze", [f"present_{x}", "ax2"], [f"{x}5"]),
                      oh.make_node("Expand", [f"{x}5", "e5"], [f"{x}5e"]),
                      oh.make_node("Reshape", [f"{x}5e", "s4r"], [f"{x}r"])]
        nodes.append(oh.make_node("MultiHeadAttention", ["q", "kr", "vr", "", "", "mask"], ["y"],
                                  domain="com.microsoft", num_heads=n))
        mha = model(nodes, [*ins, vi("mask", ["b", 1, "s", "t"])], outs, inits)
        gqa = model([oh.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                                    ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=n,
                                    kv_num_heads=nkv)],
                    [*ins, vi("seqlens", ["b"], TP.INT32), vi("total", [], TP.INT32)], outs, [])
        for s, p, label in ((128, 0, "prefill 128"), (1, 127, "decode 1 after 127")):
            t = p + s
            common = {"q": rng.standard_normal((1, s, n * h), np.float32),
                      "k": rng.standard_normal((1, s, nkv * h), np.float32),
                      "v": rng.standard_normal((1, s, nkv * h), np.float32),
                      "pk": rng.standard_normal((1, nkv, p, h), np.float32),
                      "pv": rng.standard_normal((1, nkv, p, h), np.float32)}
            mask = np.triu(np.full((s, t), -np.inf, np.float32), k=1 + p)[None, None]
            diff, line = timed(mha, gqa, {**common, "mask": mask, "seqlens": np.full((1,), t - 1, np.int32),
                                          "total": np.array(t, np.int32)}, threads, seconds)
            print(f"GroupQueryAttention vs Concat + repeat KV + MultiHeadAttention, {n}/{nkv} heads, {label}: "
                  f"{line} (max diff {diff:.1e})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of runs per comparison (at least)")
    a = ap.parse_args()
    print(f"onnxruntime {ort.__version__}, CPU, {a.threads} thread(s), onnx {onnx.__version__}")
    norms(a.threads, a.seconds)
    attention(a.threads, a.seconds)


if __name__ == "__main__":
    main()
