"""The concept-variation corpus: attention, norms, GELU, MatMul views and the operands' provenance, built as the
cross product of concept axes, one concept varied at a time so that a miss is attributed to the axis that causes
it (the axes: benchmarks/concept_corpus.py, which measures what each tool fuses on it).

    python -m corpora.concepts OUT_DIR [--only attn_,ln_]     # write the graphs and concepts.json
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from corpora.forms import BOOL, I64, F, G, feeds_for

N, D = 4, 64  # heads, hidden size
H = D // N  # head size
MAXPOS = 64
FP16 = onnx.TensorProto.FLOAT16
OPSETS = (13, 17, 18, 20)


ATT_LAYOUTS = ("4d", "4d_shape", "3d", "tr_first")
ATT_SCALES = ("div", "mul", "q", "qk", "rt", "rt_qk", "none")
ATT_MASKS = ("none", "bert", "add2", "add4", "where", "causal")


# --------------------------------------------------------------------------- #
# attention
# --------------------------------------------------------------------------- #
def _linear(g: G, x: str, din: int, dout: int, bias: bool) -> str:
    y = g.op("MatMul", [x, g.w(din, dout)])
    return g.op("Add", [y, g.w(dout)]) if bias else y


def _seq(g: G, x: str) -> str:
    """Shape(x)[1] as a 1-D tensor (the sequence length read at run time)."""
    return g.unsqueeze(g.dim(x, 1), [0])


def _split(g: G, x: str, layout: str, kt: bool, kform: str) -> str:
    """[b, s, N*H] -> heads: [b, N, s, H] (4-D layouts) or [b*N, s, H] (3d); K transposed when kt."""
    if layout == "tr_first":  # [b, s, D] -> [b, D, s] -> [b, N, H, s]: K^T straight from the Reshape
        t = g.op("Reshape", [g.op("Transpose", [x], perm=[0, 2, 1]), g.i64(0, N, H, -1)])
        return t if kt else g.op("Transpose", [t], perm=[0, 1, 3, 2])
    target = g.shape_target(x, [N, H]) if layout == "4d_shape" else g.i64(0, 0, N, H)
    r = g.op("Reshape", [x, target])
    if kt and kform == "perm":
        h = g.op("Transpose", [r], perm=[0, 2, 3, 1])
    else:
        h = g.op("Transpose", [r], perm=[0, 2, 1, 3])
    if layout == "3d":
        if kt and kform == "perm":  # [b, N, H, s] -> [b*N, H, s]
            return g.op("Reshape", [h, g.op("Concat", [g.i64(-1, H), _seq(g, x)], axis=0)])
        h = g.op("Reshape", [h, g.op("Concat", [g.i64(-1), _seq(g, x), g.i64(H)], axis=0)])
        return g.op("Transpose", [h], perm=[0, 2, 1]) if kt else h
    return g.op("Transpose", [h], perm=[0, 1, 3, 2]) if kt and kform != "perm" else h


def _runtime_scale(g: G, q: str, rank: int, sqrt: bool) -> str:
    """1 / Sqrt(Cast(Shape(q)[-1])) (torch's `q.size(-1) ** -0.5` traced), or its square root."""
    hd = g.op("Cast", [g.op("Gather", [g.op("Shape", [q]), g.const(rank - 1, np.int64)], axis=0)], to=F)
    s = g.op("Div", [g.const(1.0), g.op("Sqrt", [hd])])
    return g.op("Sqrt", [s]) if sqrt else s


def _scores(g: G, q: str, kt: str, scale: str, head: int, rank: int) -> str:
    """q @ kt with the 1/sqrt(head) scale spelled as `scale` (see ATT_SCALES): on the query (``q``), its root on
    both (``qk``; ``rt_qk`` read at run time), or on the scores (``div``, ``mul``; ``rt`` read at run time)."""
    if scale == "q":
        q = g.op("Mul", [q, g.const(head ** -0.5)])
    elif scale == "qk":
        q, kt = g.op("Mul", [q, g.const(head ** -0.25)]), g.op("Mul", [kt, g.const(head ** -0.25)])
    elif scale == "rt_qk":
        c = _runtime_scale(g, q, rank, sqrt=True)
        q, kt = g.op("Mul", [q, c]), g.op("Mul", [kt, c])
    s = g.op("MatMul", [q, kt])
    if scale == "div":
        s = g.op("Div", [s, g.const(math.sqrt(head))])
    elif scale == "mul":
        s = g.op("Mul", [s, g.const(head ** -0.5)])
    elif scale == "rt":
        s = g.op("Mul", [s, _runtime_scale(g, q, rank, sqrt=False)])
    return s


def _mask_bias(g: G, mask: str, scores4: str, x: str) -> str:
    """Apply the mask to rank-4 scores [b, N, s, s]; returns the masked scores."""
    if mask == "bert":
        m = g.inp("attention_mask", I64, ["batch", "seq"])
        u = g.op("Cast", [g.unsqueeze(g.unsqueeze(m, [1]), [2])], to=F)  # mask[:, None, None, :] as torch traces it
        bias = g.op("Mul", [g.op("Sub", [g.const(1.0), u]), g.const(-10000.0)])
        return g.op("Add", [scores4, bias])
    if mask == "add2":
        return g.op("Add", [scores4, g.inp("attn_bias", F, ["seq", "seq"])])
    if mask == "add4":
        return g.op("Add", [scores4, g.inp("attn_bias", F, ["batch", 1, "seq", "seq"])])
    if mask == "where":
        m = g.inp("attention_mask", BOOL, ["batch", 1, 1, "seq"])
        return g.op("Where", [m, scores4, g.const(np.finfo(np.float32).min)])
    if mask == "causal":
        s = _seq(g, x)
        tril = g.const(np.tril(np.ones((1, 1, MAXPOS, MAXPOS))).astype(bool), bool)
        b = g.slice(g.slice(tril, [0], s, [2], [1]), [0], s, [3], [1])
        return g.op("Where", [b, scores4, g.const(np.finfo(np.float32).min)])
    raise ValueError(mask)


def attention(name: str, layout: str, kform: str, qkv: str, scale: str, mask: str, bias: bool,
              opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    x = g.inp("hidden_states", F, ["batch", "seq", D])
    if qkv == "heads":  # q, k, v already split into heads (SDPA on [b, N, s, H])
        q, k, v = (g.inp(n, F, ["batch", N, "seq", H]) for n in ("query", "key", "value"))
        kt = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    else:
        if qkv == "packed":
            qs, ks, vs = g.split(_linear(g, x, D, 3 * D, bias), [D, D, D], axis=2)
        else:
            qs, ks, vs = (_linear(g, x, D, D, bias) for _ in range(3))
        q, kt, v = _split(g, qs, layout, False, kform), _split(g, ks, layout, True, kform), \
            _split(g, vs, layout, False, kform)
    rank = 3 if layout == "3d" and qkv != "heads" else 4
    s = _scores(g, q, kt, scale, H, rank)
    if mask != "none":
        if rank == 3:  # [b*N, s, s] -> [b, N, s, s], masked, and back
            sq = _seq(g, x)
            s4 = g.op("Reshape", [s, g.op("Concat", [g.i64(-1, N), sq, sq], axis=0)])
            s = g.op("Reshape", [_mask_bias(g, mask, s4, x), g.op("Concat", [g.i64(-1), sq, sq], axis=0)])
        else:
            s = _mask_bias(g, mask, s, x)
    ctx = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
    if rank == 3:
        ctx = g.op("Reshape", [ctx, g.op("Concat", [g.i64(-1, N), _seq(g, x), g.i64(H)], axis=0)])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.i64(0, 0, D)])
    y = _layer_norm(g, g.op("Add", [_linear(g, ctx, D, D, True), x]), D, opset)
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


# --------------------------------------------------------------------------- #
# norms
# --------------------------------------------------------------------------- #
def _layer_norm(g: G, x: str, d: int, opset: int, square: str = "pow", div: str = "div", eps_first=False,
                beta: bool = True, dtype=np.float32, eps_outside: bool = False) -> str:
    gamma = g.const(1 + 0.1 * g.rng.standard_normal(d), dtype)
    b = g.const(0.1 * g.rng.standard_normal(d), dtype) if beta else None
    if div == "op":  # ONNX LayerNormalization-17
        return g.op("LayerNormalization", [x, gamma] + ([b] if b else []), axis=-1, epsilon=1e-5)
    eps = g.const(1e-5, dtype)
    mean = g.reduce_mean(x, [-1])
    sub = g.op("Sub", [x, mean])
    sq = g.op("Pow", [sub, g.const(2.0, dtype)]) if square == "pow" else g.op("Mul", [sub, sub])
    var = g.reduce_mean(sq, [-1])
    if eps_outside:  # sqrt(var) + eps: not a LayerNorm
        std = g.op("Add", [g.op("Sqrt", [var]), eps])
    else:
        std = g.op("Sqrt", [g.op("Add", [eps, var] if eps_first else [var, eps])])
    if div == "div":
        n = g.op("Div", [sub, std])
    elif div == "recip":
        n = g.op("Mul", [sub, g.op("Reciprocal", [std])])
    else:  # Div(1, std)
        n = g.op("Mul", [sub, g.op("Div", [g.const(1.0, dtype), std])])
    y = g.op("Mul", [n, gamma])
    return g.op("Add", [y, b]) if b else y


def _skip(g: G, x: str, skip: str, dtype) -> str:
    if skip == "none":
        return x
    r = g.inp("residual", FP16 if dtype == np.float16 else F, ["batch", "seq", D])
    if skip == "add_bias":
        x = g.op("Add", [x, g.const(0.1 * g.rng.standard_normal(D), dtype)])
    return g.op("Add", [x, r])


def layernorm(name: str, square: str, div: str, eps_first: bool, beta: bool, skip: str, opset: int,
              dtype=np.float32, eps_outside: bool = False) -> onnx.ModelProto:
    g = G(name, opset)
    et = FP16 if dtype == np.float16 else F
    x = g.inp("hidden_states", et, ["batch", "seq", D])
    y = _layer_norm(g, _skip(g, x, skip, dtype), D, opset, square, div, eps_first, beta, dtype, eps_outside)
    g.out(y, "output", et, ["batch", "seq", D])
    return g.model()


def rmsnorm(name: str, square: str, div: str, gamma: str, skip: str, opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    x = _skip(g, g.inp("hidden_states", F, ["batch", "seq", D]), skip, np.float32)
    sq = g.op("Pow", [x, g.const(2.0)]) if square == "pow" else g.op("Mul", [x, x])
    r = g.op("Sqrt", [g.op("Add", [g.reduce_mean(sq, [-1]), g.const(1e-6)])])
    if div == "div":
        n = g.op("Div", [x, r])
    elif div == "recip":
        n = g.op("Mul", [x, g.op("Reciprocal", [r])])
    else:
        n = g.op("Mul", [x, g.op("Div", [g.const(1.0), r])])
    w = g.inp("weight", F, [D]) if gamma == "input" else g.const(1 + 0.1 * g.rng.standard_normal(D))
    g.out(g.op("Mul", [n, w]), "output", F, ["batch", "seq", D])
    return g.model()


def _mean(g: G, x: str, how: str, axis: int, d: int, dtype=np.float32) -> str:
    """The mean over `axis`: ReduceMean, ReduceSum / d, ReduceSum * (1/d) or ReduceSumSquare / d (the mean of
    the square)."""
    if how == "mean":
        return g.reduce_mean(x, [axis])
    op = "ReduceSumSquare" if how == "sumsq_div" else "ReduceSum"
    total = (g.op(op, [x, g.i64(axis)], keepdims=1) if op == "ReduceSum" or g.opset >= 18
             else g.op(op, [x], axes=[axis], keepdims=1))
    return g.op("Mul", [total, g.const(1.0 / d, dtype)]) if how == "sum_mulk" else g.op("Div", [total, g.const(
        float(d), dtype)])


def _rsqrt_mul(g: G, x: str, var_eps: str, rsqrt: str, dtype=np.float32) -> str:
    """x / sqrt(var_eps) as Div(x, Sqrt), x * Pow(·, -0.5) or x * Reciprocal(Sqrt)."""
    if rsqrt == "pow":
        return g.op("Mul", [x, g.op("Pow", [var_eps, g.const(-0.5, dtype)])])
    if rsqrt == "sqrt_recip":
        return g.op("Mul", [g.op("Reciprocal", [g.op("Sqrt", [var_eps])]), x])
    return g.op("Div", [x, g.op("Sqrt", [var_eps])])


def layernorm_concept(name: str, mean: str, axis: str, rsqrt: str, variance: str, upcast: bool, opset: int,
                      wrong_axis: bool = False) -> onnx.ModelProto:
    """A LayerNorm as its concept admits it: the mean by ReduceMean, ReduceSum / D or ReduceSum * (1/D) over
    the last axis as -1 or 2, the reciprocal square root by Div(Sqrt), Pow(-0.5) or Reciprocal(Sqrt), the
    variance centred or as E[x^2] - E[x]^2; `upcast`: a float16 input computed in float32 between Casts (the
    weight applied in float16); `wrong_axis`: the mean over the sequence axis (not a LayerNorm over the last)."""
    g = G(name, opset)
    et = FP16 if upcast else F
    x_in = g.inp("hidden_states", et, ["batch", "seq", D])
    x = g.op("Cast", [x_in], to=F) if upcast else x_in
    ax = 1 if wrong_axis else (-1 if axis == "neg" else 2)
    mu = _mean(g, x, mean, ax, D)
    sub = g.op("Sub", [x, mu])
    if variance == "moments":
        var = g.op("Sub", [_mean(g, g.op("Mul", [x, x]), mean, ax, D), g.op("Mul", [mu, mu])])
    else:
        var = _mean(g, g.op("Mul", [sub, sub]), mean, ax, D)
    n = _rsqrt_mul(g, sub, g.op("Add", [var, g.const(1e-5)]), rsqrt)
    wt = np.float16 if upcast else np.float32
    if upcast:
        n = g.op("Cast", [n], to=FP16)
    y = g.op("Add", [g.op("Mul", [n, g.const(1 + 0.1 * g.rng.standard_normal(D), wt)]),
                     g.const(0.1 * g.rng.standard_normal(D), wt)])
    g.out(y, "output", et, ["batch", "seq", D])
    return g.model()


def rmsnorm_concept(name: str, mean: str, rsqrt: str, upcast: bool, skip: bool, opset: int) -> onnx.ModelProto:
    """An RMSNorm as its concept admits it: the mean square by ReduceMean(x*x), ReduceSum(Pow 2) / D or
    ReduceSumSquare / D, the reciprocal square root by Pow(-0.5), Reciprocal(Sqrt) or Div(Sqrt); `upcast`: a
    float16 hidden state computed in float32 between Casts, the weight applied in float16 (Llama's forward);
    `skip`: a residual Add before."""
    g = G(name, opset)
    et = FP16 if upcast else F
    h = g.inp("hidden_states", et, ["batch", "seq", D])
    if skip:
        h = g.op("Add", [h, g.inp("residual", et, ["batch", "seq", D])])
    x = g.op("Cast", [h], to=F) if upcast else h
    sq = x if mean == "sumsq_div" else (g.op("Pow", [x, g.const(2.0)]) if mean == "sum_div" else g.op("Mul", [x, x]))
    n = _rsqrt_mul(g, x, g.op("Add", [_mean(g, sq, mean, -1, D), g.const(1e-6)]), rsqrt)
    wt = np.float16 if upcast else np.float32
    if upcast:
        n = g.op("Cast", [n], to=FP16)
    g.out(g.op("Mul", [g.const(1 + 0.1 * g.rng.standard_normal(D), wt), n]), "output", et, ["batch", "seq", D])
    return g.model()


def gelu_concept(name: str, form: str, opset: int) -> onnx.ModelProto:
    """A GELU as its concept admits it: ``distributed`` 0.5x + 0.5x * erf(x/sqrt 2), ``half_inside`` x * (0.5 +
    0.5 * erf(x * 1/sqrt 2)), ``neg_erf`` 0.5x * (1 - erf(-x / sqrt 2)), ``tanh_distributed`` 0.5x + 0.5x *
    tanh(c (x + 0.044715 x^3)), ``quick`` x * sigmoid(1.702 x); negative control ``wrong_const`` erf(x / 1.3)."""
    g = G(name, opset)
    x0 = g.inp("hidden_states", F, ["batch", "seq", D])
    x = g.op("Add", [g.op("MatMul", [x0, g.w(D, D)]), g.w(D)])
    r2 = math.sqrt(2.0)
    if form == "distributed":
        hx = g.op("Mul", [x, g.const(0.5)])
        y = g.op("Add", [hx, g.op("Mul", [hx, g.op("Erf", [g.op("Div", [x, g.const(r2)])])])])
    elif form == "half_inside":
        e = g.op("Erf", [g.op("Mul", [x, g.const(1 / r2)])])
        y = g.op("Mul", [x, g.op("Add", [g.const(0.5), g.op("Mul", [e, g.const(0.5)])])])
    elif form == "neg_erf":
        e = g.op("Erf", [g.op("Div", [g.op("Neg", [x]), g.const(r2)])])
        y = g.op("Mul", [g.op("Mul", [g.const(0.5), x]), g.op("Sub", [g.const(1.0), e])])
    elif form == "tanh_distributed":
        c = math.sqrt(2 / math.pi)
        inner = g.op("Mul", [g.const(c), g.op("Add", [x, g.op("Mul", [g.const(0.044715), g.op("Pow", [x, g.const(
            3.0)])])])])
        hx = g.op("Mul", [g.const(0.5), x])
        y = g.op("Add", [g.op("Mul", [g.op("Tanh", [inner]), hx]), hx])
    elif form == "quick":
        y = g.op("Mul", [x, g.op("Sigmoid", [g.op("Mul", [x, g.const(1.702)])])])
    else:  # wrong_const: not a GELU
        e = g.op("Erf", [g.op("Div", [x, g.const(1.3)])])
        y = g.op("Mul", [g.op("Mul", [x, g.const(0.5)]), g.op("Add", [e, g.const(1.0)])])
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


# --------------------------------------------------------------------------- #
# GELU
# --------------------------------------------------------------------------- #
def gelu(name: str, form: str, variant: str, bias: bool, opset: int) -> onnx.ModelProto:
    g = G(name, opset)
    x0 = g.inp("hidden_states", F, ["batch", "seq", D])
    x = g.op("Add", [g.op("MatMul", [x0, g.w(D, D)]), g.w(D)]) if bias else g.op("MatMul", [x0, g.w(D, D)])
    if form != "gelu20":
        half, one = g.const(0.5), g.const(1.0)
    if form == "erf":
        order, arg = variant.split("_")
        s = g.op("Div", [x, g.const(math.sqrt(2.0))]) if arg == "div" else g.op("Mul", [x, g.const(2 ** -0.5)])
        p = g.op("Add", [g.op("Erf", [s]), one])
        if order == "a":
            y = g.op("Mul", [g.op("Mul", [x, half]), p])
        elif order == "b":
            y = g.op("Mul", [g.op("Mul", [x, p]), half])
        else:
            y = g.op("Mul", [x, g.op("Mul", [p, half])])
    elif form == "tanh":
        cube_form, folded = variant.split("_")
        cube = g.op("Pow", [x, g.const(3.0)]) if cube_form == "pow" else g.op("Mul", [x, g.op("Mul", [x, x])])
        c = math.sqrt(2 / math.pi)
        if folded == "folded":
            t = g.op("Add", [g.op("Mul", [x, g.const(c)]), g.op("Mul", [cube, g.const(0.044715 * c)])])
        else:
            t = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715)])]), g.const(c)])
        y = g.op("Mul", [g.op("Mul", [x, half]), g.op("Add", [g.op("Tanh", [t]), one])])
    else:  # ONNX Gelu-20
        y = g.op("Gelu", [x], approximate=variant)
    g.out(y, "output", F, ["batch", "seq", D])
    return g.model()


# --------------------------------------------------------------------------- #
# value heads of another size (pruned or varied-size Q/K/V)
# --------------------------------------------------------------------------- #
HV = 24  # the value heads' size (H is the query's and key's)


def attention_dv(name: str, layout: str, mask: str, cross: bool, opset: int) -> onnx.ModelProto:
    """Q and K heads of H, value heads of HV: x [b, s, D] -> [b, s, N*HV]; ``cross`` reads K and V from an
    encoder's output of another length; 4-D or 3-D heads; a mask as in `attention`."""
    g = G(name, opset)
    x = g.inp("hidden_states", F, ["batch", "seq", D])
    kv = g.inp("encoder_hidden_states", F, ["batch", "enc", D]) if cross else x
    q, k, v = _linear(g, x, D, N * H, True), _linear(g, kv, D, N * H, True), _linear(g, kv, D, N * HV, True)

    def heads(t: str, hs: int, kt: bool) -> str:
        h = g.op("Transpose", [g.op("Reshape", [t, g.i64(0, 0, N, hs)])], perm=[0, 2, 3, 1] if kt else [0, 2, 1, 3])
        if layout == "3d":  # [b*N, s, hs] (K: [b*N, hs, s])
            tail = g.op("Slice", [g.op("Shape", [h]), g.i64(2), g.i64(4)])
            h = g.op("Reshape", [h, g.op("Concat", [g.i64(-1), tail], axis=0)])
        return h
    qh, kt, vh = heads(q, H, False), heads(k, H, True), heads(v, HV, False)
    sc = g.op("Div", [g.op("MatMul", [qh, kt]), g.const(math.sqrt(H))])
    if mask != "none":
        if layout == "3d":  # [b*N, s, t] -> [b, N, s, t], masked, and back (s and t read from the inputs)
            sq, sk = _seq(g, x), _seq(g, kv)
            s4 = g.op("Reshape", [sc, g.op("Concat", [g.i64(-1, N), sq, sk], axis=0)])
            sc = g.op("Reshape", [_mask_bias(g, mask, s4, x), g.op("Concat", [g.i64(-1), sq, sk], axis=0)])
        else:
            sc = _mask_bias(g, mask, sc, x)
    ctx = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), vh])
    if layout == "3d":
        ctx = g.op("Reshape", [ctx, g.op("Concat", [g.i64(-1, N), g.op("Slice", [g.op("Shape", [ctx]), g.i64(1),
                                                                                   g.i64(3)])], axis=0)])
    y = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.i64(0, 0, N * HV)])
    g.out(y, "output", F, ["batch", "seq", N * HV])
    return g.model()


# --------------------------------------------------------------------------- #
# grouped-query attention with a KV cache
# --------------------------------------------------------------------------- #
GN, GG, GH = 4, 2, 16  # query heads, key/value heads, head size
NEG = float(np.finfo(np.float32).min)


def gqa(name: str, mask: str, scale: str, repeat: str, kt: str, axis: int, opset: int,
        length: str = "sum") -> onnx.ModelProto:
    """Heads as a decoder with a KV cache has them after rotary: q [b, GN, s, GH], the new k, v [b, GG, s, GH]
    and the cache [b, GG, past, GH]; the cache concatenated with the new keys and values on the time axis
    (``axis`` 2 or -2), repeat_kv (``repeat``: ``shape`` Unsqueeze + Expand to a target read from Shape, then
    Reshape, as TorchScript traces it; ``where`` the Expand target through Where(Equal(t, -1), 1, t), as dynamo
    writes expand(-1)), K transposed (``kt``: ``t`` one Transpose, ``3d`` through [b*n, t, d]), the scale
    (``div`` / ``mul`` on the scores, ``q`` on the query, ``qk`` its root on both, ``rt`` 1/Sqrt(Cast(Shape(q)[-1]))
    computed at run time). Masks, causal with the attention mask's padding: ``range`` key positions
    compared with the query's (a Range from the past length), ``tril`` a constant lower triangle sliced to
    the query's rows, ``trilu`` Trilu of ones, ``additive`` the causal term added as Where(keep, 0, MIN) with a
    padding term; negative controls: ``padding`` the padding alone (not causal), ``input`` an additive mask the
    caller feeds (whatever it is). The keys' length (``length``): ``sum`` the past's plus the new tokens', read
    from the inputs; ``present`` read from the concatenation itself (which GroupQueryAttention re-creates: a
    mask read from it would make the rewrite read its own output, so MultiHeadAttention takes those)."""
    g = G(name, opset)
    q = g.inp("query", F, ["batch", GN, "seq", GH])
    kn, vn = (g.inp(n, F, ["batch", GG, "seq", GH]) for n in ("key", "value"))
    pk, pv = (g.inp(n, F, ["batch", GG, "past", GH]) for n in ("past_key", "past_value"))
    kc, vc = g.op("Concat", [pk, kn], axis=axis), g.op("Concat", [pv, vn], axis=axis)
    g.out(kc, "present_key", F, ["batch", GG, "past + seq", GH])
    g.out(vc, "present_value", F, ["batch", GG, "past + seq", GH])
    kc, vc = "present_key", "present_value"
    if length == "present":  # the cache's length read from the concatenation
        t1 = g.op("Slice", [g.op("Shape", [kc]), g.i64(2), g.i64(3)])
    else:  # past + new
        t1 = g.op("Add", [g.op("Slice", [g.op("Shape", [pk]), g.i64(2), g.i64(3)]),
                          g.op("Slice", [g.op("Shape", [kn]), g.i64(2), g.i64(3)])])
    b1 = g.op("Slice", [g.op("Shape", [q]), g.i64(0), g.i64(1)])

    def rep(x: str) -> str:
        u = g.unsqueeze(x, [2])
        target = g.op("Concat", [b1, g.i64(GG, GN // GG), t1, g.i64(GH)], axis=0)
        if repeat == "where":  # expand(b, g, r, -1, d) as dynamo writes it
            target = g.op("Concat", [b1, g.i64(GG, GN // GG, -1, GH)], axis=0)
            target = g.op("Where", [g.op("Equal", [target, g.i64(-1)]), g.i64(1), target])
        e = g.op("Expand", [u, target])
        return g.op("Reshape", [e, g.op("Concat", [b1, g.i64(GN), t1, g.i64(GH)], axis=0)])
    kr, vr = rep(kc), rep(vc)
    if kt == "t":
        ktr = g.op("Transpose", [kr], perm=[0, 1, 3, 2])
    else:  # [b*n, t, d] -> [b*n, d, t] -> [b, n, d, t]
        k3 = g.op("Reshape", [kr, g.op("Concat", [g.i64(-1), t1, g.i64(GH)], axis=0)])
        ktr = g.op("Reshape", [g.op("Transpose", [k3], perm=[0, 2, 1]),
                               g.op("Concat", [b1, g.i64(GN, GH), t1], axis=0)])
    sc = _scores(g, q, ktr, scale, GH, 4)
    if mask == "input":
        sc = g.op("Add", [sc, g.inp("attn_bias", F, ["batch", 1, "seq", "past + seq"])])
    else:
        am = g.inp("attention_mask", I64, ["batch", "past + seq"])
        pad = g.op("Cast", [g.unsqueeze(g.unsqueeze(am, [1]), [2])], to=BOOL)  # [b, 1, 1, t]
        s1 = g.op("Slice", [g.op("Shape", [q]), g.i64(2), g.i64(3)])
        p1 = g.op("Sub", [t1, s1])
        keep = pad
        if mask == "range":
            cols = g.op("Range", [g.const(0, np.int64), g.squeeze(t1, [0]), g.const(1, np.int64)])
            rows = g.op("Range", [g.squeeze(p1, [0]), g.squeeze(t1, [0]), g.const(1, np.int64)])
            keep = g.op("And", [g.op("LessOrEqual", [cols, g.unsqueeze(rows, [1])]), pad])
        elif mask == "tril":
            tri = g.const(np.tril(np.ones((1, 1, MAXPOS, MAXPOS))).astype(bool), bool)
            keep = g.op("And", [g.slice(g.slice(tri, p1, t1, [2]), [0], t1, [3]), pad])
        elif mask == "trilu":
            ones = g.op("ConstantOfShape", [g.op("Concat", [t1, t1], axis=0)],
                        value=numpy_helper.from_array(np.array([1], np.int64)))
            tri = g.op("Cast", [g.slice(g.op("Trilu", [ones], upper=0), p1, t1, [0])], to=BOOL)
            keep = g.op("And", [tri, pad])
        if mask == "additive":  # the causal term and the padding term added to the scores
            cols = g.op("Range", [g.const(0, np.int64), g.squeeze(t1, [0]), g.const(1, np.int64)])
            rows = g.op("Range", [g.squeeze(p1, [0]), g.squeeze(t1, [0]), g.const(1, np.int64)])
            causal = g.op("LessOrEqual", [cols, g.unsqueeze(rows, [1])])
            sc = g.op("Add", [g.op("Add", [sc, g.op("Where", [causal, g.const(0.0), g.const(NEG)])]),
                              g.op("Where", [pad, g.const(0.0), g.const(NEG)])])
        else:
            sc = g.op("Where", [keep, sc, g.const(NEG)])
    ctx = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), vr])
    y = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.i64(0, 0, GN * GH)])
    g.out(y, "output", F, ["batch", "seq", GN * GH])
    return g.model()


# --------------------------------------------------------------------------- #
# MatMul with transposed operands or result (FusedMatMul's views)
# --------------------------------------------------------------------------- #
def _view(rank: int, tb: int, t: int) -> list[int]:
    if tb and t:
        return [*range(1, rank), 0]
    if tb:
        return [*range(1, rank - 1), 0, rank - 1]
    return [*range(rank - 2), rank - 1, rank - 2] if t else list(range(rank))


def matmul_view(name: str, side: str, view: str, rank: int, opset: int) -> onnx.ModelProto:
    """A [.., 4, 8] @ B [.., 8, 6] with one operand read through a Transpose (``view``: ``last`` the last two axes
    swapped, ``batch`` the first axis moved before the last, ``both``; ``out`` the product transposed over the
    last two axes), as attention's K^T, a transposed weight or a batch-first layout spell them; ``mid`` swaps
    two middle axes, which no FusedMatMul flags express (a negative control)."""
    g = G(name, opset)
    la, lb = [2, 3, 4, 8][-rank:], [2, 3, 8, 6][-rank:]
    if view == "out":
        a, b = g.inp("a", F, la), g.inp("b", F, lb)
        y = g.op("Transpose", [g.op("MatMul", [a, b])], perm=_view(rank, 0, 1))
        g.out(y, "y", F, la[:-2] + [6, 4])
        return g.model()
    perm = {"last": _view(rank, 0, 1), "batch": _view(rank, 1, 0), "both": _view(rank, 1, 1),
            "mid": [0, 2, 1, 3]}[view]
    logical = la if side == "a" else lb
    physical = [0] * rank
    for i, p_ in enumerate(perm):
        physical[p_] = logical[i]
    x = g.inp(side, F, physical)
    t = g.op("Transpose", [x], perm=perm)
    other = g.inp("b" if side == "a" else "a", F, lb if side == "a" else la)
    y = g.op("MatMul", [t, other] if side == "a" else [other, t])
    g.out(y, "y", F, la[:-1] + lb[-1:])
    return g.model()


# --------------------------------------------------------------------------- #
# the corpus: name -> (builder, kwargs, axes)
# --------------------------------------------------------------------------- #
def corpus() -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    i = 0
    for layout, scale, mask in itertools.product(ATT_LAYOUTS, ATT_SCALES, ATT_MASKS):
        kform = ("perm", "separate")[i % 2] if layout in ("4d", "4d_shape", "3d") else "tr_first"
        qkv = "packed" if layout in ("4d", "4d_shape") and i % 3 == 0 else "separate"
        bias, opset = i % 5 != 4, OPSETS[i % 4]
        i += 1
        name = f"attn_{layout}_{scale}_{mask}"
        axes = {"layout": layout, "k": kform, "qkv": qkv, "scale": scale, "mask": mask, "bias": bias,
                "opset": opset, "dtype": "fp32"}
        out[name] = (attention, dict(layout=layout, kform=kform, qkv=qkv, scale=scale, mask=mask, bias=bias,
                                     opset=opset), axes, "attention", "bert" if mask != "causal" else "gpt2")
    for scale, mask in itertools.product(ATT_SCALES, ATT_MASKS):
        opset = OPSETS[i % 4]
        i += 1
        axes = {"layout": "heads", "k": "separate", "qkv": "heads", "scale": scale, "mask": mask, "bias": False,
                "opset": opset, "dtype": "fp32"}
        out[f"attn_heads_{scale}_{mask}"] = (attention, dict(layout="4d", kform="separate", qkv="heads",
                                                             scale=scale, mask=mask, bias=False, opset=opset),
                                             axes, "attention", "bert")
    j = 0
    for square, div, skip in itertools.product(("pow", "mul"), ("div", "recip", "one_div"),
                                               ("none", "add", "add_bias")):
        for eps_first in (False, True):
            opset = (13, 17, 18)[j % 3]
            beta, dtype = j % 4 != 3, np.float16 if j % 6 == 5 else np.float32
            j += 1
            name = f"ln_{square}_{div}_{skip}_{'epsfirst' if eps_first else 'epslast'}"
            axes = {"norm": "layernorm", "square": square, "div": div, "skip": skip, "eps": "first" if eps_first
                    else "last", "beta": beta, "opset": opset, "dtype": "fp16" if dtype == np.float16 else "fp32"}
            out[name] = (layernorm, dict(square=square, div=div, eps_first=eps_first, beta=beta, skip=skip,
                                         opset=opset, dtype=dtype), axes, "norm", "bert")
    for skip, opset, beta in itertools.product(("none", "add", "add_bias"), (17, 18), (True, False)):
        axes = {"norm": "layernorm-op", "square": "-", "div": "op", "skip": skip, "eps": "-", "beta": beta,
                "opset": opset, "dtype": "fp32"}
        out[f"ln_op{opset}_{skip}_{'beta' if beta else 'nobeta'}"] = (
            layernorm, dict(square="pow", div="op", eps_first=False, beta=beta, skip=skip, opset=opset),
            axes, "norm", "bert")
    for skip in ("none", "add"):
        axes = {"norm": "not-a-norm", "square": "pow", "div": "div", "skip": skip, "eps": "outside",
                "beta": True, "opset": 17, "dtype": "fp32"}
        out[f"ln_epsoutside_{skip}"] = (layernorm, dict(square="pow", div="div", eps_first=False, beta=True,
                                                        skip=skip, opset=17, eps_outside=True), axes, None, "bert")
    for square, div, gamma, skip in itertools.product(("pow", "mul"), ("div", "recip", "one_div"),
                                                      ("const", "input"), ("none", "add")):
        opset = (13, 17, 18, 20)[j % 4]
        j += 1
        axes = {"norm": "rmsnorm", "square": square, "div": div, "skip": skip, "gamma": gamma, "opset": opset,
                "dtype": "fp32"}
        out[f"rms_{square}_{div}_{gamma}_{skip}"] = (rmsnorm, dict(square=square, div=div, gamma=gamma,
                                                                    skip=skip, opset=opset), axes, "norm", "bert")
    k = 0
    forms = [("erf", f"{o}_{a}") for o in "abc" for a in ("div", "mul")] + \
        [("tanh", f"{c}_{f}") for c in ("pow", "mul") for f in ("plain", "folded")] + \
        [("gelu20", v) for v in ("none", "tanh")]
    for (form, variant), bias in itertools.product(forms, (False, True)):
        opset = 20 if form == "gelu20" else (13, 17, 18)[k % 3]
        k += 1
        axes = {"gelu": form, "variant": variant, "bias": bias, "opset": opset, "dtype": "fp32"}
        out[f"gelu_{form}_{variant}_{'bias' if bias else 'nobias'}"] = (
            gelu, dict(form=form, variant=variant, bias=bias, opset=opset), axes, "gelu", "bert")
    c = 0  # the concept variations: spellings no rule names op by op
    for mean, axis, rsqrt in itertools.product(("mean", "sum_div", "sum_mulk"), ("neg", "pos"),
                                               ("div", "pow", "sqrt_recip")):
        variance = "moments" if c % 5 == 4 else "centred"
        opset = (13, 17, 18)[c % 3]
        c += 1
        axes = {"norm": "layernorm", "mean": mean, "axis": axis, "rsqrt": rsqrt, "variance": variance,
                "opset": opset, "dtype": "fp32"}
        out[f"ln_c_{mean}_{axis}_{rsqrt}_{variance}"] = (
            layernorm_concept, dict(mean=mean, axis=axis, rsqrt=rsqrt, variance=variance, upcast=False,
                                    opset=opset), axes, "norm", "bert")
    for rsqrt in ("div", "pow"):
        axes = {"norm": "layernorm", "mean": "mean", "axis": "neg", "rsqrt": rsqrt, "variance": "centred",
                "opset": 17, "dtype": "fp16-upcast"}
        out[f"ln_c_upcast_{rsqrt}"] = (layernorm_concept, dict(mean="mean", axis="neg", rsqrt=rsqrt,
                                                                 variance="centred", upcast=True, opset=17),
                                       axes, "norm", "bert")
    axes = {"norm": "not-a-norm", "mean": "mean", "axis": "seq", "rsqrt": "div", "variance": "centred",
            "opset": 17, "dtype": "fp32"}
    out["ln_c_wrong_axis"] = (layernorm_concept, dict(mean="mean", axis="neg", rsqrt="div", variance="centred",
                                                      upcast=False, opset=17, wrong_axis=True), axes, None, "bert")
    for mean, rsqrt, upcast in itertools.product(("mean", "sum_div", "sumsq_div"), ("pow", "sqrt_recip", "div"),
                                                 (False, True)):
        opset = (13, 17, 18, 20)[c % 4]
        skip = c % 3 == 1
        c += 1
        axes = {"norm": "rmsnorm", "mean": mean, "rsqrt": rsqrt, "skip": skip, "opset": opset,
                "dtype": "fp16-upcast" if upcast else "fp32"}
        out[f"rms_c_{mean}_{rsqrt}_{'upcast' if upcast else 'fp32'}{'_skip' if skip else ''}"] = (
            rmsnorm_concept, dict(mean=mean, rsqrt=rsqrt, upcast=upcast, skip=skip, opset=opset), axes, "norm",
            "bert")
    for form in ("distributed", "half_inside", "neg_erf", "tanh_distributed", "quick", "wrong_const"):
        opset = (13, 17, 18)[c % 3]
        c += 1
        axes = {"gelu": form, "variant": "concept", "bias": True, "opset": opset, "dtype": "fp32"}
        out[f"gelu_c_{form}"] = (gelu_concept, dict(form=form, opset=opset), axes,
                                 None if form == "wrong_const" else "gelu", "bert")
    for layout, mask, cross in itertools.product(("4d", "3d"), ("none", "bert", "where"), (False, True)):
        if cross and mask != "none":
            continue  # (`_mask_bias` masks the query's own tokens: a self-attention mask)
        opset = OPSETS[c % 4]
        c += 1
        axes = {"layout": layout, "mask": mask, "qkv": "cross" if cross else "separate", "heads": "dv",
                "opset": opset, "dtype": "fp32"}
        out[f"attn_dv_{layout}_{mask}_{'cross' if cross else 'self'}"] = (
            attention_dv, dict(layout=layout, mask=mask, cross=cross, opset=opset), axes, "attention", "bert")
    for mask, scale in itertools.product(("range", "tril", "trilu", "additive"), ("div", "mul", "q", "qk", "rt")):
        repeat, kt, axis = ("shape", "where")[c % 2], ("t", "3d")[c % 3 == 2], (2, -2)[c % 4 == 3]
        opset = (14, 17, 18, 20)[c % 4]
        c += 1
        axes = {"mask": mask, "scale": scale, "repeat": repeat, "k": kt, "axis": axis, "heads": "grouped",
                "opset": opset, "dtype": "fp32"}
        out[f"attn_gqa_{mask}_{scale}"] = (gqa, dict(mask=mask, scale=scale, repeat=repeat, kt=kt, axis=axis,
                                                     opset=opset), axes, "attention", "gpt2")
    for mask in ("range", "tril"):  # the keys' length read from the concatenated cache: MultiHeadAttention
        axes = {"mask": mask, "scale": "div", "repeat": "shape", "k": "t", "axis": 2, "heads": "grouped-present",
                "opset": 17, "dtype": "fp32"}
        out[f"attn_gqa_{mask}_present"] = (gqa, dict(mask=mask, scale="div", repeat="shape", kt="t", axis=2,
                                                     opset=17, length="present"), axes, "attention", "gpt2")
    for mask in ("padding", "input"):  # negative controls: no causal mask GroupQueryAttention could take as its own
        axes = {"mask": mask, "scale": "div", "repeat": "shape", "k": "t", "axis": 2, "heads": "grouped",
                "opset": 17, "dtype": "fp32"}
        out[f"attn_gqa_{mask}_div"] = (gqa, dict(mask=mask, scale="div", repeat="shape", kt="t", axis=2, opset=17),
                                       axes, "attention", "gpt2")
    for side, view, rank in itertools.product("ab", ("last", "batch", "both"), (3, 4)):
        opset = (13, 17, 18)[c % 3]
        c += 1
        axes = {"side": side, "view": view, "rank": rank, "opset": opset, "dtype": "fp32"}
        out[f"mm_{side}_{view}_r{rank}"] = (matmul_view, dict(side=side, view=view, rank=rank, opset=opset), axes,
                                            "matmul", "bert")
    for rank in (2, 3, 4):
        axes = {"side": "-", "view": "out", "rank": rank, "opset": 17, "dtype": "fp32"}
        out[f"mm_out_r{rank}"] = (matmul_view, dict(side="a", view="out", rank=rank, opset=17), axes, "matmul", "bert")
    axes = {"side": "a", "view": "mid", "rank": 4, "opset": 17, "dtype": "fp32"}
    out["mm_a_mid_r4"] = (matmul_view, dict(side="a", view="mid", rank=4, opset=17), axes, None, "bert")
    from corpora.provenance import corpus as provenance  # the operands' provenance axis (prov_*)

    out.update(provenance())
    return out


def feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """feeds_for's values; an additive float bias gets values that matter (a causal 0 / -1e4 pattern plus
    noise), q/k/v heads and the RMSNorm weight random."""
    f = feeds_for(model)
    rng = np.random.default_rng(1)
    for k, v in f.items():
        if k == "attn_bias":  # causal for the last rows (a cache's new tokens), plus noise
            rows, t = v.shape[-2], v.shape[-1]
            f[k] = (np.where(np.tril(np.ones((t, t)))[t - rows:] > 0, 0.0, -1e4) + 0.1 * rng.standard_normal(v.shape)
                    ).astype(np.float32)
        elif k == "hidden_states" and v.dtype != np.float32:
            f[k] = v.astype(np.float16)
    for vi in model.graph.input:  # fp16 graph inputs
        if vi.type.tensor_type.elem_type == FP16:
            f[vi.name] = f[vi.name].astype(np.float16)
    return f


def build(out: Path, names: list[str]) -> dict[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    table = corpus()
    manifest = {}
    for name in names:
        fn, kw, axes, expect, mtype = table[name]
        path = out / f"{name}.onnx"
        onnx.save(fn(name, **kw), str(path))
        manifest[name] = {"file": path.name, "axes": axes, "expect": expect, "model_type": mtype,
                          "num_heads": N if expect == "attention" else 0, "hidden_size": D if expect == "attention"
                          else 0}
    (out / "concepts.json").write_text(json.dumps({"models": manifest}, indent=1, default=str))
    return manifest


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    only = ""
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    out = Path(args[0] if args else "/tmp/concepts/models")
    names = [n for n in corpus() if not only or any(n.startswith(p) for p in only.split(","))]
    print(f"{len(build(out, names))} graphs in {out}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
