"""The provenance axis of the concept corpus (benchmarks/concept_corpus.py, names ``prov_*``): the same concepts with
operands that arrive at run time instead of constants and in-graph projections.

* attention on heads (``prov_sdpa_*``): q, k and v from graph inputs, from a producer the matcher cannot see
  through (``computed``: a Tanh of an input), or k and v from a KV cache (``cache``: Concat(past, new) on the
  time axis); in heads [b, n, s, d] (``bhsd``) or [b, s, n, d] transposed inside (``bshd``); the key transposed
  in the graph or arriving transposed (``kt``); the scale 1/sqrt(d) by Div, a custom factor, d^-1/4 on q and k
  each, or none; masks none, a bool input by Where(m, s, -inf), an additive float input, a constant causal
  buffer by Where(-inf), and GPT-2's Where(causal, s, -10000); with or without the NaN guard; the output merged
  to [b, s, n*d], left in heads, or transposed to [b, s, n, d]. Every one is expressible as MultiHeadAttention.
* run-time operands of other fused ops (``prov_bias_*``): a Gelu's bias, SkipLayerNormalization's bias and
  MultiHeadAttention's q/k/v biases as initializers, graph inputs, or computed (base + delta: a LoRA-style sum).
* negative controls (expect None): Where(m, s, -10000) with a bool mask input (a padded row may be masked
  whole: the fill is not -inf there), a causal buffer with a row masked whole, Softmax over another axis, and
  scores scaled by a run-time tensor that is not one number.

Imported by corpora/concepts.py, which writes the graphs (`python -m corpora.concepts OUT --only prov_`);
benchmarks/concept_corpus.py measures them (`python -m benchmarks.concept_corpus --only prov_`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx

from corpora.forms import BOOL, F, G

N, H = 4, 16  # heads, head size
D = N * H
PROVENANCE = ("input", "computed", "cache")
LAYOUTS = ("bhsd", "bshd")
SCALES = ("div", "custom", "qk", "none")
MASKS = ("none", "bool", "add", "causal", "gpt2")
OUTS = ("merge", "heads", "bshd")


def _heads(g: G, name: str, prov: str, layout: str, time: str) -> str:
    """One operand in heads [b, n, t, d]: a graph input (in heads, or [b, t, n, d] transposed here), a Tanh of
    one, or a cache: Concat(past, new) on the time axis."""
    shape = ["batch", N, time, H] if layout == "bhsd" else ["batch", time, N, H]
    if prov == "cache":
        past = g.inp(f"past_{name}", F, ["batch", N, "past", H])
        new = g.inp(name, F, ["batch", N, "seq", H])
        return g.op("Concat", [past, new], axis=2)
    x = g.inp(name if prov == "input" else f"{name}_src", F, shape)
    if prov == "computed":
        x = g.op("Tanh", [x])
    return x if layout == "bhsd" else g.op("Transpose", [x], perm=[0, 2, 1, 3])


def _mask(g: G, s: str, mask: str, rows: int | str, keys: int | str) -> str:
    if mask == "bool":
        return g.op("Where", [g.inp("mask", BOOL, ["batch", 1, rows, keys]), s, g.const(-np.inf)])
    if mask == "add":
        return g.op("Add", [s, g.inp("mask", F, ["batch", 1, rows, keys])])
    if mask in ("causal", "gpt2"):
        tril = np.tril(np.ones((1, 1, rows, keys)), int(keys) - int(rows)).astype(bool)
        return g.op("Where", [g.const(tril, bool), s, g.const(-np.inf if mask == "causal" else -10000.0)])
    return s


def sdpa(name: str, prov: str, layout: str, key: str, scale: str, mask: str, guard: bool, out: str,
         opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    time = "kv" if prov != "cache" else None
    q = _heads(g, "query", "input" if prov == "cache" else prov, layout, "seq")
    if key == "kt":  # the key arrives transposed: [b, n, d, t]
        kt = g.inp("key_t" if prov == "input" else "key_t_src", F, ["batch", N, H, "kv"])
        kt = kt if prov == "input" else g.op("Tanh", [kt])
    else:
        kt = g.op("Transpose", [_heads(g, "key", prov, layout, time or "seq")], perm=[0, 1, 3, 2])
    v = _heads(g, "value", prov, layout, time or "seq")
    if scale == "qk":
        c = g.const(H ** -0.25)
        q, kt = g.op("Mul", [q, c]), g.op("Mul", [kt, c])
    s = g.op("MatMul", [q, kt])
    if scale == "div":
        s = g.op("Div", [s, g.const(math.sqrt(H))])
    elif scale == "custom":
        s = g.op("Mul", [s, g.const(0.11)])
    rows, keys = (8, 8) if mask in ("causal", "gpt2") else ("seq", "kv" if prov != "cache" else "past + seq")
    if mask in ("causal", "gpt2"):  # a constant buffer: static sizes
        g.inputs = [_static(vi) for vi in g.inputs]
    s = _mask(g, s, mask, rows, keys)
    p = g.op("Softmax", [s], axis=-1)
    if guard:
        p = g.op("Where", [g.op("IsNaN", [p]), g.const(0.0), p])
    o = g.op("MatMul", [p, v])
    if out == "merge":
        o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), g.i64(0, 0, D)])
        g.out(o, "output", F, ["batch", "seq", D])
    elif out == "bshd":
        g.out(g.op("Transpose", [o], perm=[0, 2, 1, 3]), "output", F, ["batch", "seq", N, H])
    else:
        g.out(o, "output", F, ["batch", N, "seq", H])
    return g.model()


def _static(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """`vi` with its seq, kv and past dims fixed (8, 8, 0): a constant causal buffer has static sizes."""
    fixed = {"seq": 8, "kv": 8, "past": 0}
    for d in vi.type.tensor_type.shape.dim:
        if d.dim_param in fixed:
            d.dim_value = fixed[d.dim_param]
    return vi


def _operand(g: G, name: str, prov: str, shape: list) -> str:
    """A bias-like operand: an initializer, a graph input, or base + delta (both inputs: a LoRA-style sum)."""
    if prov == "constant":
        return g.const(0.1 * g.rng.standard_normal(shape).astype(np.float32))
    if prov == "input":
        return g.inp(name, F, shape)
    return g.op("Add", [g.inp(f"{name}_base", F, shape), g.inp(f"{name}_delta", F, shape)])


def bias_gelu(name: str, prov: str, form: str, opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    x = g.inp("hidden_states", F, ["batch", "seq", D])
    a = g.op("Add", [g.op("MatMul", [x, g.w(D, D)]), _operand(g, "bias", prov, [D])])
    if form == "gelu20":
        y = g.op("Gelu", [a])
    elif form == "contrib":
        y = g.op("Gelu", [a], domain="com.microsoft")
    else:  # erf, decomposed
        e = g.op("Erf", [g.op("Div", [a, g.const(math.sqrt(2.0))])])
        y = g.op("Mul", [g.op("Mul", [a, g.op("Add", [e, g.const(1.0)])]), g.const(0.5)])
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


def bias_skip_ln(name: str, prov: str, form: str, opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    x = g.inp("hidden_states", F, ["batch", "seq", D])
    r = g.inp("residual", F, ["batch", "seq", D])
    s = g.op("Add", [g.op("Add", [g.op("MatMul", [x, g.w(D, D)]), _operand(g, "bias", prov, [D])]), r])
    gamma, beta = g.const(1 + 0.1 * g.rng.standard_normal(D)), g.const(0.1 * g.rng.standard_normal(D))
    if form == "op":
        y = g.op("LayerNormalization", [s, gamma, beta], axis=-1, epsilon=1e-5)
    else:
        mean = g.reduce_mean(s, [-1])
        sub = g.op("Sub", [s, mean])
        var = g.reduce_mean(g.op("Mul", [sub, sub]), [-1])
        n = g.op("Div", [sub, g.op("Sqrt", [g.op("Add", [var, g.const(1e-5)])])])
        y = g.op("Add", [g.op("Mul", [n, gamma]), beta])
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


def mha_bias(name: str, prov: str, scale: str, opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    q, k, v = (g.op("Add", [g.inp(n, F, ["batch", "seq", D]), _operand(g, f"b{n[0]}", prov, [D])])
               for n in ("query", "key", "value"))
    if scale == "mul":
        q = g.op("Mul", [q, g.const(0.7)])
    y = g.op("MultiHeadAttention", [q, k, v], domain="com.microsoft", num_heads=N)
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


def negative(name: str, kind: str, opset: int) -> onnx.ModelProto:
    """Attention-shaped graphs no attention op may replace (see the module's docstring)."""
    g = G(name, opset)
    q, k, v = (g.inp(n, F, ["batch", N, 8, H]) for n in ("query", "key", "value"))
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    axis = -1
    if kind == "padding_10000":
        s = g.op("Where", [g.inp("mask", BOOL, ["batch", 1, 1, 8]), s, g.const(-10000.0)])
    elif kind == "shut_row":
        keep = np.tril(np.ones((1, 1, 8, 8)), -1).astype(bool)  # row 0 keeps nothing
        s = g.op("Where", [g.const(keep, bool), s, g.const(-10000.0)])
    elif kind == "softmax_axis":
        axis = 2
    elif kind == "tensor_scale":
        s = g.op("Mul", [s, g.inp("temperature", F, ["batch", N, 8, 8])])
    o = g.op("MatMul", [g.op("Softmax", [s], axis=axis), v])
    g.out(g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), g.i64(0, 0, D)]), "output", F,
          ["batch", 8, D])
    return g.model()


def corpus() -> dict[str, tuple]:
    """{name: (builder, kwargs, axes, expected kind, model type)}, as concept_corpus.corpus()."""
    out: dict[str, tuple] = {}
    opsets = itertools.cycle((17, 18, 20))
    cycle = itertools.count()
    for prov, layout, key, scale, mask in itertools.product(PROVENANCE, LAYOUTS, ("k", "kt"), SCALES, MASKS):
        if (prov == "cache" and layout != "bhsd") or (key == "kt" and (layout != "bhsd" or prov == "cache")):
            continue
        i = next(cycle)
        guard, o, opset = bool(i % 2), OUTS[i % 3], next(opsets)
        axes = {"provenance": prov, "layout": layout, "key": key, "scale": scale, "mask": mask, "guard": guard,
                "out": o, "opset": opset, "dtype": "fp32"}
        out[f"prov_sdpa_{prov}_{layout}_{key}_{scale}_{mask}"] = (
            sdpa, dict(prov=prov, layout=layout, key=key, scale=scale, mask=mask, guard=guard, out=o, opset=opset),
            axes, "attention", "bert")
    for prov in ("constant", "input", "computed"):
        for form in ("gelu20", "contrib", "erf"):
            opset = 20 if form == "gelu20" else 17
            out[f"prov_bias_gelu_{form}_{prov}"] = (bias_gelu, dict(prov=prov, form=form, opset=opset),
                                                    {"provenance": prov, "form": form, "opset": opset,
                                                     "dtype": "fp32"}, "gelu", "bert")
        for form in ("op", "decomposed"):
            out[f"prov_bias_skipln_{form}_{prov}"] = (bias_skip_ln, dict(prov=prov, form=form, opset=17),
                                                      {"provenance": prov, "form": form, "opset": 17,
                                                       "dtype": "fp32"}, "norm", "bert")
        for scale in ("none", "mul"):
            out[f"prov_bias_mha_{scale}_{prov}"] = (mha_bias, dict(prov=prov, scale=scale, opset=17),
                                                    {"provenance": prov, "form": f"mha-{scale}", "opset": 17,
                                                     "dtype": "fp32"}, "attention", "bert")
    for kind in ("padding_10000", "shut_row", "softmax_axis", "tensor_scale"):
        out[f"prov_neg_{kind}"] = (negative, dict(kind=kind, opset=17),
                                   {"provenance": "input", "control": kind, "opset": 17, "dtype": "fp32"}, None,
                                   "bert")
    return out
