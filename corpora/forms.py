#!/usr/bin/env python3
"""A corpus of small transformer graphs written the way other exporters and converters write them.

Usage::

    python -m corpora.forms [OUT_DIR]        # default /tmp/forms
    python -m corpora.forms --list
    python -m corpora.forms --only bert_,gelu_
    python -m corpora.forms --torch OUT_DIR  # also export tiny HF BERT / GPT-2 (needs torch,
                                                           # transformers; optional)

Every model is built with ``onnx.helper`` and numpy only (random weights, a fixed seed per model), so the corpus
regenerates anywhere; each one is checked with ``onnx.checker`` and one onnxruntime CPU run on the feeds that
``forms.json`` (written next to the models) describes. ``forms.json`` lists per model: the form, the family
(attention / embed / gelu / skipln), the model type and head count for onnxruntime's transformers optimizer,
the hidden size, the symbolic dims and the feeds' value ranges.

The forms were read off the node sequences that onnxruntime's transformers fusions
(``fusion_attention.py``, ``fusion_gpt_attention*.py``, ``fusion_conformer_attention.py``,
``fusion_mha_dit.py``, ``fusion_embedlayer.py``, ``fusion_fastgelu.py``, ``fusion_biasgelu.py``,
``fusion_skiplayernorm.py``, ``fusion_layernorm.py``) and onnxscript's ``ort_fusions`` rules expect; the
generators are written from scratch. Older torch exporters (opset < 17) write LayerNorm decomposed
(ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), so the opset 11-13 models do too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
VOCAB, MAXPOS, TYPES = 100, 64, 2
DIMS = {"batch": 2, "seq": 8, "past": 3}  # the feeds' sizes for symbolic dims


class G:
    """A tiny graph builder: auto-named nodes, seeded random initializers, opset-dependent op spellings."""

    def __init__(self, name: str, opset: int = 13):
        self.name, self.opset = name, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.n = 0
        self.ms = False

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, value, dtype=np.float32, name: str | None = None) -> str:
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def i64(self, *values) -> str:
        return self.const(list(values), np.int64)

    def w(self, *shape, scale: float = 0.1) -> str:
        return self.const(self.rng.standard_normal(shape).astype(np.float32) * scale)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", outputs=None, **attrs):
        name = self._name(op_type)
        outs = outputs or [f"{name}_o{i}" if n_out > 1 else f"{name}_o" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        if domain == "com.microsoft":
            self.ms = True
        return outs[0] if n_out == 1 else outs

    def inp(self, name: str, dtype, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def out(self, value: str, name: str, dtype=F, shape=None) -> str:
        """Make ``value`` a graph output called ``name``: its producer's output is renamed (exporters write no
        Identity there); an Identity only for a graph input or a value that already is an output."""
        producer = next((n for n in self.nodes if value in n.output), None)
        if producer is None or any(o.name == value for o in self.outputs):
            self.op("Identity", [value], outputs=[name])
        else:
            for n in self.nodes:
                for seq in (n.input, n.output):
                    for i, v in enumerate(seq):
                        if v == value:
                            seq[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    # ---- opset-dependent spellings ------------------------------------------------------------- #
    def unsqueeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.i64(*axes)])
        return self.op("Unsqueeze", [x], axes=axes)

    def squeeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.i64(*axes)])
        return self.op("Squeeze", [x], axes=axes)

    def split(self, x: str, sizes: list[int], axis: int) -> list[str]:
        if self.opset >= 13:
            return self.op("Split", [x, self.i64(*sizes)], n_out=len(sizes), axis=axis)
        return self.op("Split", [x], n_out=len(sizes), axis=axis, split=sizes)

    def reduce_mean(self, x: str, axes: list[int]) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.i64(*axes)], keepdims=1)
        return self.op("ReduceMean", [x], axes=axes, keepdims=1)

    def slice(self, x: str, starts, ends, axes, steps=None) -> str:
        ins = [x, starts if isinstance(starts, str) else self.i64(*starts),
               ends if isinstance(ends, str) else self.i64(*ends), self.i64(*axes)]
        if steps is not None:
            ins.append(self.i64(*steps))
        return self.op("Slice", ins)

    def dim(self, x: str, i: int) -> str:
        """Shape(x) -> Gather(i) (a scalar), as the torch exporter writes ``x.size(i)``."""
        return self.op("Gather", [self.op("Shape", [x]), self.const(i, np.int64)], axis=0)

    def shape_target(self, x: str, tail: list[int], n_lead: int = 2) -> str:
        """Concat(Unsqueeze(Shape(x)[0]), ..., tail...): a Reshape target computed from Shape."""
        parts = [self.unsqueeze(self.dim(x, i), [0]) for i in range(n_lead)]
        return self.op("Concat", parts + [self.i64(*tail)], axis=0)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        if self.ms:
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="onnxfuse-forms")
        m.ir_version = 8 if self.opset <= 17 else 9
        onnx.checker.check_model(m, full_check=True)
        return m


# --------------------------------------------------------------------------- #
# Shared pieces
# --------------------------------------------------------------------------- #
def layer_norm(g: G, x: str, d: int, decomposed: bool, eps: float = 1e-5) -> str:
    gamma = g.const(1 + 0.1 * g.rng.standard_normal(d))
    beta = g.w(d)
    if not decomposed:
        return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
    mean = g.reduce_mean(x, [-1])
    sub = g.op("Sub", [x, mean])
    var = g.reduce_mean(g.op("Pow", [sub, g.const(2.0)]), [-1])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(eps)])])
    return g.op("Add", [g.op("Mul", [g.op("Div", [sub, std]), gamma]), beta])


def linear(g: G, x: str, din: int, dout: int, bias: bool = True, bias_first: bool = False) -> str:
    y = g.op("MatMul", [x, g.w(din, dout)])
    if not bias:
        return y
    b = g.w(dout)
    return g.op("Add", [b, y] if bias_first else [y, b])


def heads(g: G, x: str, n: int, h: int, reshape: str, perm=(0, 2, 1, 3)) -> str:
    """[B,S,N*H] -> Reshape [B,S,N,H] -> Transpose."""
    if reshape == "const":
        target = g.i64(0, 0, n, h)
    elif reshape == "shape":
        target = g.shape_target(x, [n, h])
    else:  # "neg": -1 for the sequence, as some exporters fold it
        target = g.i64(0, -1, n, h)
    return g.op("Transpose", [g.op("Reshape", [x, target])], perm=list(perm))


def merge_heads(g: G, ctx: str, d: int, reshape: str) -> str:
    t = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    target = g.shape_target(t, [d]) if reshape == "shape" else g.i64(0, 0, d)
    return g.op("Reshape", [t, target])


def bert_mask(g: G, mask: str, cast: bool = True, sub_first: bool = True, value: float = -10000.0) -> str:
    """[B,S] int mask -> Unsqueeze(1) -> Unsqueeze(2) -> Cast -> (1 - m) * -10000."""
    if g.opset >= 13 and not cast:
        u = g.unsqueeze(g.unsqueeze(g.op("Cast", [mask], to=F), [1]), [2])
    else:
        u = g.unsqueeze(g.unsqueeze(mask, [1]), [2])
        u = g.op("Cast", [u], to=F)
    s = g.op("Sub", [g.const(1.0), u])
    return g.op("Mul", [s, g.const(value)] if sub_first else [g.const(value), s])


def ffn(g: G, x: str, d: int, act: str = "erf") -> str:
    hdn = linear(g, x, d, 4 * d)
    if act == "erf":
        e = g.op("Erf", [g.op("Div", [hdn, g.const(math.sqrt(2.0))])])
        hdn = g.op("Mul", [g.op("Mul", [hdn, g.op("Add", [e, g.const(1.0)])]), g.const(0.5)])
    return linear(g, hdn, 4 * d, d)


# --------------------------------------------------------------------------- #
# BERT attention, older torch exporters (opset 11-13)
# --------------------------------------------------------------------------- #
def bert_torch(name, opset=13, n=4, d=64, reshape="const", scale="div", k_perm="0231", axis=3,
               mask="cast", ln="auto", ffn_act=None, static=False):
    """x [B,S,D] (the previous layer's output) -> Q/K/V MatMul+Add -> heads -> scores -> Softmax -> context ->
    out MatMul+Add -> Add(x) -> LayerNorm (-> FFN -> Add -> LayerNorm)."""
    g = G(name, opset)
    h = d // n
    decomposed = opset < 17 if ln == "auto" else ln == "decomposed"
    seq = 8 if static else "seq"
    x = g.inp("hidden_states", F, ["batch", seq, d])
    q = heads(g, linear(g, x, d, d), n, h, reshape)
    v = heads(g, linear(g, x, d, d), n, h, reshape)
    k_lin = linear(g, x, d, d)
    if k_perm == "0231":
        k = heads(g, k_lin, n, h, reshape, perm=(0, 2, 3, 1))
    else:  # transpose_for_scores then key.transpose(-1, -2)
        k = g.op("Transpose", [heads(g, k_lin, n, h, reshape)], perm=[0, 1, 3, 2])
    inv = 1.0 / math.sqrt(h)
    if scale == "div_q":
        q = g.op("Div", [q, g.const(math.sqrt(h))])
    elif scale == "mul_q":
        q = g.op("Mul", [q, g.const(inv)])
    s = g.op("MatMul", [q, k])
    if scale == "div":
        s = g.op("Div", [s, g.const(math.sqrt(h))])
    elif scale == "mul":
        s = g.op("Mul", [s, g.const(inv)])
    if mask != "none":
        m = g.inp("attention_mask", I64, ["batch", seq])
        s = g.op("Add", [s, bert_mask(g, m, cast=mask == "cast")])
    p = g.op("Softmax", [s], axis=axis)
    ctx = merge_heads(g, g.op("MatMul", [p, v]), d, reshape)
    y = layer_norm(g, g.op("Add", [linear(g, ctx, d, d), x]), d, decomposed)
    if ffn_act:
        y = layer_norm(g, g.op("Add", [ffn(g, y, d, ffn_act), y]), d, decomposed)
    g.out(y, "last_hidden_state", F, ["batch", seq, d])
    return g.model()


def bert_merged_qkv(name, opset=13, n=4, d=64, how="split", mask=True):
    """One MatMul to 3*hidden (+Add), then Split into three (or Slice x3), heads, scaled scores."""
    g = G(name, opset)
    h = d // n
    x = g.inp("hidden_states", F, ["batch", "seq", d])
    qkv = linear(g, x, d, 3 * d)
    if how == "split":
        parts = g.split(qkv, [d, d, d], axis=2)
    else:
        parts = [g.slice(qkv, [i * d], [(i + 1) * d], [2], [1]) for i in range(3)]
    q = heads(g, parts[0], n, h, "const")
    k = heads(g, parts[1], n, h, "const", perm=(0, 2, 3, 1))
    v = heads(g, parts[2], n, h, "const")
    s = g.op("Div", [g.op("MatMul", [q, k]), g.const(math.sqrt(h))])
    if mask:
        s = g.op("Add", [s, bert_mask(g, g.inp("attention_mask", I64, ["batch", "seq"]))])
    ctx = merge_heads(g, g.op("MatMul", [g.op("Softmax", [s], axis=-1), v]), d, "const")
    y = layer_norm(g, g.op("Add", [linear(g, ctx, d, d), x]), d, opset < 17)
    g.out(y, "last_hidden_state", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# GPT-2 (HF Conv1D = Reshape -> Gemm -> Reshape), causal mask from a tril buffer, past / present
# --------------------------------------------------------------------------- #
def conv1d(g: G, x: str, din: int, dout: int, gemm: bool = True) -> str:
    if not gemm:
        return linear(g, x, din, dout)
    flat = g.op("Reshape", [x, g.i64(-1, din)])
    y = g.op("Gemm", [flat, g.w(din, dout), g.w(dout)])
    return g.op("Reshape", [y, g.shape_target(x, [dout])])


def gpt2(name, opset=13, n=4, d=64, past="none", gemm=True, attn_mask=False, k_form="0231", where=True):
    """HF GPT-2 (transformers 2.x-4.x, TorchScript exporter): LN -> Conv1D c_attn -> Split -> heads; K
    permuted [0,2,3,1] (k_form "0231") or transposed after the past Concat ("0213"); scores / sqrt(H); causal
    mask bias[:, :, ns-nd:ns, :ns] sliced by Shape of the scores, Where(mask, w, -10000) (or w*b - 1e4*(1-b));
    past [2,B,N,P,H] by Split+Squeeze ("split") or Gather ("gather"); present = Concat(Unsqueeze k, v)."""
    g = G(name, opset)
    h = d // n
    x = g.inp("hidden_states", F, ["batch", "seq", d])
    ln1 = layer_norm(g, x, d, opset < 17)
    qkv = conv1d(g, ln1, d, 3 * d, gemm) if gemm else linear(g, ln1, d, 3 * d)
    qs, ks, vs = g.split(qkv, [d, d, d], axis=2)
    q = heads(g, qs, n, h, "shape")
    v = heads(g, vs, n, h, "shape")
    if past != "none":
        pst = g.inp("past_0", F, [2, "batch", n, "past", h])
        if past == "split":
            pk, pv = (g.squeeze(t, [0]) for t in g.split(pst, [1, 1], axis=0))
        else:
            pk = g.op("Gather", [pst, g.const(0, np.int64)], axis=0)
            pv = g.op("Gather", [pst, g.const(1, np.int64)], axis=0)
    if k_form == "0231":
        k = heads(g, ks, n, h, "shape", perm=(0, 2, 3, 1))
        if past != "none":
            k = g.op("Concat", [g.op("Transpose", [pk], perm=[0, 1, 3, 2]), k], axis=-1)
            present_k = g.op("Transpose", [k], perm=[0, 1, 3, 2])
        kT = k
    else:
        k = heads(g, ks, n, h, "shape")
        if past != "none":
            k = g.op("Concat", [pk, k], axis=-2)
        present_k = k
        kT = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    if past != "none":
        v = g.op("Concat", [pv, v], axis=-2)
    w = g.op("Div", [g.op("MatMul", [q, kT]), g.const(math.sqrt(h))])
    # causal mask: nd, ns = w.size(-2), w.size(-1); b = bias[:, :, ns-nd:ns, :ns]
    nd = g.squeeze(g.slice(g.op("Shape", [w]), [-2], [-1], [0]), [0])
    ns = g.squeeze(g.slice(g.op("Shape", [w]), [-1], [2**62], [0]), [0])
    start = g.unsqueeze(g.op("Sub", [ns, nd]), [0])
    end = g.unsqueeze(ns, [0])
    tril = g.const(np.tril(np.ones((1, 1, MAXPOS, MAXPOS))).astype(np.uint8), np.uint8)
    b = g.slice(g.slice(tril, start, end, [2], [1]), [0], end, [3], [1])
    if where:
        w = g.op("Where", [g.op("Cast", [b], to=BOOL), w, g.const(-10000.0)])
    else:  # w * b - 1e4 * (1 - b)
        bf = g.op("Cast", [b], to=F)
        w = g.op("Sub", [g.op("Mul", [w, bf]), g.op("Mul", [g.const(10000.0), g.op("Sub", [g.const(1.0), bf])])])
    if attn_mask:
        m = g.inp("attention_mask", F, ["batch", "total"])
        mm = g.unsqueeze(g.unsqueeze(g.op("Reshape", [m, g.i64(0, -1)]), [1]), [2])
        w = g.op("Add", [w, g.op("Mul", [g.op("Sub", [g.const(1.0), mm]), g.const(-10000.0)])])
    ctx = g.op("MatMul", [g.op("Softmax", [w], axis=-1), v])
    t = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [t, g.shape_target(t, [d])])
    a = conv1d(g, merged, d, d, gemm)
    y = layer_norm(g, g.op("Add", [x, a]), d, opset < 17)
    g.out(y, "output", F, ["batch", "seq", d])
    if past != "none":
        present = g.op("Concat", [g.unsqueeze(present_k, [0]), g.unsqueeze(v, [0])], axis=0)
        g.out(present, "present_0", F, [2, "batch", n, "total", h])
    return g.model()


def gpt2_megatron(name, opset=13, n=4, d=64):
    """Megatron-style: LN -> MatMul+Add -> Split; Q and K each divided by sqrt(sqrt(H)); causal mask applied
    as scores * tril - 10000 * (1 - tril) (Mul, Sub) before Softmax."""
    g = G(name, opset)
    h = d // n
    x = g.inp("hidden_states", F, ["batch", "seq", d])
    ln1 = layer_norm(g, x, d, opset < 17)
    qs, ks, vs = g.split(linear(g, ln1, d, 3 * d), [d, d, d], axis=2)
    c = g.const(math.sqrt(math.sqrt(h)))
    q = g.op("Div", [heads(g, qs, n, h, "shape"), c])
    k = g.op("Div", [heads(g, ks, n, h, "shape", perm=(0, 2, 3, 1)), c])
    v = heads(g, vs, n, h, "shape")
    s = g.op("MatMul", [q, k])
    sl = g.unsqueeze(g.dim(s, 2), [0])
    tril = g.inp("causal_mask", F, [1, 1, MAXPOS, MAXPOS])
    m = g.slice(g.slice(tril, [0], sl, [2], [1]), [0], sl, [3], [1])
    s = g.op("Sub", [g.op("Mul", [s, m]), g.op("Mul", [g.op("Sub", [g.const(1.0), m]), g.const(10000.0)])])
    ctx = merge_heads(g, g.op("MatMul", [g.op("Softmax", [s], axis=-1), v]), d, "shape")
    y = layer_norm(g, g.op("Add", [x, linear(g, ctx, d, d)]), d, opset < 17)
    g.out(y, "output", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# tf2onnx BERT / Keras MultiHeadAttention
# --------------------------------------------------------------------------- #
def bert_tf2onnx(name, opset=13, n=4, d=64, flat=False, mask=True):
    """tf2onnx: MatMul on [B,S,D] (or on [B*S,D] after Reshape(-1, D) when flat) then Add (BiasAdd); Reshape
    targets computed from Shape; Transpose; scores Mul 1/sqrt(H); mask (1 - Cast(Reshape(mask))) * -10000;
    LayerNorm decomposed the TF way (mean, SquaredDifference as Sub+Mul, rsqrt as Sqrt+Reciprocal)."""
    g = G(name, opset)
    h = d // n
    x = g.inp("input_ids_embeddings", F, ["batch", "seq", d])
    src = g.op("Reshape", [x, g.i64(-1, d)]) if flat else x
    bs = g.op("Shape", [x])
    b_ = g.slice(bs, [0], [1], [0])
    s_ = g.slice(bs, [1], [2], [0])
    tgt = g.op("Concat", [b_, s_, g.i64(n, h)], axis=0)

    def proj(perm):
        return g.op("Transpose", [g.op("Reshape", [linear(g, src, d, d), tgt])], perm=list(perm))

    q, k, v = proj((0, 2, 1, 3)), proj((0, 2, 3, 1)), proj((0, 2, 1, 3))
    s = g.op("Mul", [g.op("MatMul", [q, k]), g.const(1.0 / math.sqrt(h))])
    if mask:
        m = g.inp("input_mask", I64, ["batch", "seq"])
        mr = g.op("Cast", [g.op("Reshape", [m, g.op("Concat", [b_, g.i64(1, 1), s_], axis=0)])], to=F)
        s = g.op("Add", [s, g.op("Mul", [g.op("Sub", [g.const(1.0), mr]), g.const(-10000.0)])])
    ctx = g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.i64(-1, d) if flat else g.op("Concat", [b_, s_, g.i64(d)], axis=0)])
    o = linear(g, ctx, d, d)
    if flat:
        o = g.op("Reshape", [o, g.op("Concat", [b_, s_, g.i64(d)], axis=0)])
    r = g.op("Add", [o, x])
    mean = g.reduce_mean(r, [-1])
    diff = g.op("Sub", [r, mean])
    var = g.reduce_mean(g.op("Mul", [diff, diff]), [-1])
    rs = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.const(1e-12)])])])
    y = g.op("Add", [g.op("Mul", [diff, g.op("Mul", [rs, g.const(np.ones(d))])]), g.w(d)])
    g.out(y, "output", F, ["batch", "seq", d])
    return g.model()


def keras_mha_einsum(name, opset=13, n=4, d=64):
    """tf2onnx of keras.layers.MultiHeadAttention: Einsum projections abc,cde->abde (+ bias [N,H]),
    scores Einsum aecd,abcd->acbe on Q * 1/sqrt(H), Softmax, context Einsum acbe,aecd->abcd, output
    Einsum abcd,cde->abe (+ bias), residual Add, LayerNormalization."""
    g = G(name, opset)
    h = d // n
    x = g.inp("query", F, ["batch", "seq", d])

    def proj():
        y = g.op("Einsum", [x, g.w(d, n, h)], equation="abc,cde->abde")
        return g.op("Add", [y, g.w(n, h)])

    q = g.op("Mul", [proj(), g.const(1.0 / math.sqrt(h))])
    k, v = proj(), proj()
    s = g.op("Einsum", [k, q], equation="aecd,abcd->acbe")
    p = g.op("Softmax", [s], axis=-1)
    ctx = g.op("Einsum", [p, v], equation="acbe,aecd->abcd")
    o = g.op("Add", [g.op("Einsum", [ctx, g.w(n, h, d)], equation="abcd,cde->abe"), g.w(d)])
    y = layer_norm(g, g.op("Add", [x, o]), d, opset < 17, eps=1e-3)
    g.out(y, "output", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# Conformer, DiT / MMDiT, BART / Whisper SDPA-like
# --------------------------------------------------------------------------- #
def conformer(name, opset=13, n=4, d=64, pos="input", mask=False, kv_bias=False):
    """Conformer (NeMo/ESPnet-like): Q = MatMul+Add, scaled by Div(sqrt(H)) after Transpose; K/V MatMul without
    bias Add; scores + relative position bias ([1,N,S,S] input, or Q_v @ P^T from a position projection)."""
    g = G(name, opset)
    h = d // n
    x = g.inp("x", F, ["batch", "seq", d])
    q = g.op("Div", [heads(g, linear(g, x, d, d), n, h, "const"), g.const(math.sqrt(h))])
    k = heads(g, linear(g, x, d, d, bias=kv_bias), n, h, "const", perm=(0, 2, 3, 1))
    v = heads(g, linear(g, x, d, d, bias=kv_bias), n, h, "const")
    s = g.op("MatMul", [q, k])
    if pos == "input":
        bias = g.inp("pos_bias", F, [1, n, "seq", "seq"])
    else:  # matrix_bd = (q + pos_bias_v) @ p^T, p from a position embedding projection
        pe = g.inp("pos_emb", F, [1, "seq", d])
        p = heads(g, linear(g, pe, d, d, bias=False), n, h, "const", perm=(0, 2, 3, 1))
        bias = g.op("MatMul", [g.op("Add", [q, g.w(n, 1, h)]), p])
    s = g.op("Add", [s, bias])
    if mask:
        m = g.inp("mask", BOOL, ["batch", 1, "seq"])
        s = g.op("Where", [g.unsqueeze(m, [1]), s, g.const(-10000.0)])
    ctx = merge_heads(g, g.op("MatMul", [g.op("Softmax", [s], axis=-1), v]), d, "const")
    y = layer_norm(g, g.op("Add", [x, linear(g, ctx, d, d)]), d, opset < 17)
    g.out(y, "output", F, ["batch", "seq", d])
    return g.model()


def dit(name, opset=17, n=4, d=64, kT="direct", cast=True, mmdit=False):
    """Diffusers DiT / SD3 MMDiT (torch exporter): Q/K/V projections with bias; K already transposed by one
    Transpose [0,2,3,1] (kT "direct") or via Transpose then Transpose [0,1,3,2]; scale applied as
    Mul(Q, s) and Mul(K, s) with s = 1/sqrt(sqrt(H)); Cast to float32 around Softmax; MMDiT concatenates
    the image and context streams on the sequence axis before attention and splits after."""
    g = G(name, opset)
    h = d // n
    x = g.inp("hidden_states", F, ["batch", "seq", d])
    if mmdit:
        c = g.inp("encoder_hidden_states", F, ["batch", "ctx", d])

    def proj(perm, src=None):
        return heads(g, linear(g, src or x, d, d), n, h, "shape", perm=perm)

    def stream(perm):
        t = proj(perm)
        if mmdit:
            t = g.op("Concat", [t, proj(perm, c)], axis=3 if perm == (0, 2, 3, 1) else 2)
        return t

    sc = g.const(1.0 / math.sqrt(math.sqrt(h)))
    q = g.op("Mul", [stream((0, 2, 1, 3)), sc])
    if kT == "direct":
        k = stream((0, 2, 3, 1))
    else:
        k = g.op("Transpose", [stream((0, 2, 1, 3))], perm=[0, 1, 3, 2])
    k = g.op("Mul", [k, sc])
    v = stream((0, 2, 1, 3))
    s = g.op("MatMul", [q, k])
    if cast:
        s = g.op("Cast", [s], to=F)
    p = g.op("Softmax", [s], axis=-1)
    if cast:
        p = g.op("Cast", [p], to=F)
    ctx = g.op("Transpose", [g.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.shape_target(ctx, [d])])
    if mmdit:
        xs = g.op("Slice", [ctx, g.i64(0), g.unsqueeze(g.dim(x, 1), [0]), g.i64(1)])
        g.out(linear(g, xs, d, d), "output", F, ["batch", "seq", d])
    else:
        g.out(linear(g, ctx, d, d), "output", F, ["batch", "seq", d])
    return g.model()


def sdpa(name, opset=14, n=4, d=64, mask="none", k_bias=True, scale="q", cross=False, ln=False):
    """BART / Whisper (TorchScript exporter, eager attention): Q = (MatMul+Add) * H^-0.5 (scale "q"), or the
    torch SDPA decomposition Mul(Q, sqrt(s)) @ Mul(K^T, sqrt(s)) with s from Sqrt(1/Sqrt(Shape(Q)[-1]))
    (scale "sdpa"); K without bias for Whisper (k_bias False); K transposed [0,1,3,2] after the heads;
    optional additive float mask [B,1,S,T] or a key padding mask; cross attention reads K/V from an
    encoder input."""
    g = G(name, opset)
    h = d // n
    x = g.inp("hidden_states", F, ["batch", "seq", d])
    kv_src = g.inp("encoder_hidden_states", F, ["batch", "enc", d]) if cross else x
    t = "enc" if cross else "seq"
    qp = linear(g, x, d, d)
    if scale == "q":
        qp = g.op("Mul", [qp, g.const(h ** -0.5)])
    q = heads(g, qp, n, h, "neg")
    k = heads(g, linear(g, kv_src, d, d, bias=k_bias), n, h, "neg")
    v = heads(g, linear(g, kv_src, d, d), n, h, "neg")
    kT = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    if scale == "sdpa":
        hd = g.op("Cast", [g.slice(g.op("Shape", [q]), [-1], [2**62], [0])], to=F)
        s = g.op("Sqrt", [g.op("Div", [g.const([1.0]), g.op("Sqrt", [hd])])])
        q, kT = g.op("Mul", [q, s]), g.op("Mul", [kT, s])
    sc = g.op("MatMul", [q, kT])
    if mask == "float":
        sc = g.op("Add", [sc, g.inp("attention_mask", F, ["batch", 1, "seq", t])])
    elif mask == "padding":
        m = g.inp("attention_mask", I64, ["batch", t])
        inv = g.op("Sub", [g.const(1.0), g.op("Cast", [g.unsqueeze(m, [1, 2])], to=F)])
        sc = g.op("Add", [sc, g.op("Mul", [inv, g.const(np.finfo(np.float32).min)])])
    ctx = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), v])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.i64(0, -1, d)])
    o = linear(g, ctx, d, d)
    if ln:
        o = layer_norm(g, g.op("Add", [x, o]), d, opset < 17)
    g.out(o, "output", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# Embeddings
# --------------------------------------------------------------------------- #
def embed(name, opset=13, n=4, d=64, pos="slice", segment=True, ln="auto", attention=True, mask_index=True,
          order="wsp"):
    """word (+ segment) Gather -> Add -> + position Gather -> Add -> LayerNorm. Position ids from Slice of a
    constant [1, MAXPOS] buffer ending at Shape(input_ids)[1] (BERT, "slice"), Range + Unsqueeze + Expand
    (DistilBERT, "range"), or a position_ids input ("input"). With ``attention`` the LayerNorm feeds one
    BERT attention layer (the form onnxruntime's EmbedLayerNormalization fusion checks for); with
    ``mask_index`` the mask is also reduced to a mask index (ReduceSum over the sequence) as an output."""
    g = G(name, opset)
    decomposed = opset < 17 if ln == "auto" else ln == "decomposed"
    ids = g.inp("input_ids", I64, ["batch", "seq"])
    word = g.op("Gather", [g.w(VOCAB, d), ids], axis=0)
    if pos == "slice":
        buf = g.const(np.arange(MAXPOS)[None, :], np.int64)
        pids = g.slice(buf, [0], g.unsqueeze(g.dim(ids, 1), [0]), [1], [1])
    elif pos == "range":
        seq = g.dim(ids, 1)
        r = g.op("Range", [g.const(0, np.int64), seq, g.const(1, np.int64)])
        pids = g.op("Expand", [g.unsqueeze(r, [0]), g.op("Shape", [ids])])
    else:
        pids = g.inp("position_ids", I64, ["batch", "seq"])
    posv = g.op("Gather", [g.w(MAXPOS, d), pids], axis=0)
    if segment:
        seg = g.op("Gather", [g.w(TYPES, d), g.inp("token_type_ids", I64, ["batch", "seq"])], axis=0)
        s = g.op("Add", [g.op("Add", [word, seg]), posv]) if order == "wsp" else \
            g.op("Add", [g.op("Add", [word, posv]), seg])
    else:
        s = g.op("Add", [word, posv])
    e = layer_norm(g, s, d, decomposed, eps=1e-12)
    mask = g.inp("attention_mask", I64, ["batch", "seq"])
    if mask_index:
        g.out(g.op("ReduceSum", [mask, g.i64(1)], keepdims=0), "mask_index", I64, ["batch"])
    if attention:
        h = d // n
        q = heads(g, linear(g, e, d, d), n, h, "const")
        k = heads(g, linear(g, e, d, d), n, h, "const", perm=(0, 2, 3, 1))
        v = heads(g, linear(g, e, d, d), n, h, "const")
        sc = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), g.const(math.sqrt(h))]), bert_mask(g, mask)])
        ctx = merge_heads(g, g.op("MatMul", [g.op("Softmax", [sc], axis=-1), v]), d, "const")
        e = layer_norm(g, g.op("Add", [linear(g, ctx, d, d), e]), d, decomposed)
    else:
        e = g.op("Mul", [e, g.op("Cast", [g.unsqueeze(mask, [2])], to=F)])
    g.out(e, "last_hidden_state", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# GELU spellings inside an FFN (MatMul -> [Add bias] -> GELU -> MatMul)
# --------------------------------------------------------------------------- #
def gelu_ffn(name, opset=13, d=32, kind="newgelu", bias=True, d_ff=None):
    """Forms (x is the FFN hidden, after the bias Add when ``bias``):
    newgelu   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3))))       HF NewGELUActivation
    cube      the same with x * x * x                                            HF gelu_new (older)
    megatron  x * 0.5 * (1 + tanh(0.7978845608 * x * (1 + 0.044715 * x * x)))    Megatron bias_gelu
    folded    0.5 * x * (1 + tanh(0.7978845608 * x + 0.0356774081 * x^3))        constants pre-multiplied
    erf       x * 0.5 * (1 + erf(x / sqrt(2)))                                   torch F.gelu (opset < 20)
    erf_mul   0.5 * x * (1 + erf(x * 0.70710678))                                tf2onnx / Keras
    erf_half  (x * 0.5) * (erf(x * 0.70710678) + 1)                              Megatron / DeepSpeed
    onnx_gelu Gelu(approximate=tanh) (opset 20)"""
    form = kind
    g = G(name, opset)
    ff = d_ff or 4 * d
    x0 = g.inp("x", F, ["batch", "seq", d])
    x = linear(g, x0, d, ff, bias=bias)
    c = g.const
    if form in ("newgelu", "cube"):
        x3 = g.op("Pow", [x, c(3.0)]) if form == "newgelu" else g.op("Mul", [g.op("Mul", [x, x]), x])
        inner = g.op("Mul", [c(math.sqrt(2 / math.pi)), g.op("Add", [x, g.op("Mul", [c(0.044715), x3])])])
        y = g.op("Mul", [g.op("Mul", [c(0.5), x]), g.op("Add", [c(1.0), g.op("Tanh", [inner])])])
    elif form == "megatron":
        t = g.op("Mul", [g.op("Mul", [c(0.7978845608), x]),
                         g.op("Add", [c(1.0), g.op("Mul", [g.op("Mul", [c(0.044715), x]), x])])])
        y = g.op("Mul", [g.op("Mul", [x, c(0.5)]), g.op("Add", [c(1.0), g.op("Tanh", [t])])])
    elif form == "folded":
        t = g.op("Add", [g.op("Mul", [x, c(0.7978845608)]),
                         g.op("Mul", [g.op("Pow", [x, c(3.0)]), c(0.7978845608 * 0.044715)])])
        y = g.op("Mul", [g.op("Mul", [c(0.5), x]), g.op("Add", [g.op("Tanh", [t]), c(1.0)])])
    elif form == "erf":
        e = g.op("Erf", [g.op("Div", [x, c(math.sqrt(2.0))])])
        y = g.op("Mul", [g.op("Mul", [x, c(0.5)]), g.op("Add", [c(1.0), e])])
    elif form == "erf_mul":
        e = g.op("Erf", [g.op("Mul", [x, c(1 / math.sqrt(2.0))])])
        y = g.op("Mul", [g.op("Mul", [c(0.5), x]), g.op("Add", [c(1.0), e])])
    elif form == "erf_half":
        e = g.op("Erf", [g.op("Mul", [x, c(1 / math.sqrt(2.0))])])
        y = g.op("Mul", [g.op("Mul", [x, c(0.5)]), g.op("Add", [e, c(1.0)])])
    elif form == "onnx_gelu":
        y = g.op("Gelu", [x], approximate="tanh")
    else:
        raise ValueError(form)
    g.out(linear(g, y, ff, d), "y", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# Skip + LayerNorm
# --------------------------------------------------------------------------- #
def skip_ln(name, opset=13, d=64, swapped=False, bias=True, reuse="none", ln="auto", bias_first=False):
    """residual + (MatMul [+ bias]) -> LayerNorm; ``swapped`` writes Add(residual, x) instead of Add(x, residual);
    ``reuse`` = "output": the Add's output is also a graph output; "consumer": another node reads it (the
    next residual); "none"."""
    g = G(name, opset)
    decomposed = opset < 17 if ln == "auto" else ln == "decomposed"
    r = g.inp("residual", F, ["batch", "seq", d])
    y = linear(g, g.inp("x", F, ["batch", "seq", d]), d, d, bias=bias, bias_first=bias_first)
    s = g.op("Add", [r, y] if swapped else [y, r])
    out = layer_norm(g, s, d, decomposed)
    if reuse == "output":
        g.out(s, "residual_out", F, ["batch", "seq", d])
    elif reuse == "consumer":
        out = g.op("Add", [linear(g, out, d, d), s])
    g.out(out, "y", F, ["batch", "seq", d])
    return g.model()


# --------------------------------------------------------------------------- #
# The corpus
# --------------------------------------------------------------------------- #
Entry = tuple[str, str, str, dict, Callable[..., onnx.ModelProto], dict]


def corpus() -> list[Entry]:
    """(name, form, ORT model type, optimizer args, generator, kwargs)."""
    e: list[Entry] = []

    def add(name, form, mtype, fn, n=4, d=64, **kw):
        kw = {**kw}
        if fn not in (gelu_ffn, skip_ln):
            kw["n"] = n
        kw["d"] = d
        e.append((name, form, mtype, {"num_heads": n, "hidden_size": d}, fn, kw))

    # BERT, older torch exporters
    add("bert_o11_const_div", "bert torch opset11: const [0,0,N,H], Div, K perm 0231, Cast mask, axis=-1",
        "bert", bert_torch, opset=11, axis=-1)
    add("bert_o11_const_div_ax3", "same, Softmax axis=3", "bert", bert_torch, opset=11, axis=3)
    add("bert_o12_shape_div", "bert torch opset12: Reshape target from Shape/Gather/Unsqueeze/Concat",
        "bert", bert_torch, opset=12, reshape="shape", axis=-1)
    add("bert_o12_shape_div_ax3", "Reshape from Shape + Softmax axis=3", "bert", bert_torch, opset=12,
        reshape="shape", axis=3)
    add("bert_o13_const_mul", "scores Mul 1/sqrt(H)", "bert", bert_torch, opset=13, scale="mul", axis=-1)
    add("bert_o13_const_mulq", "Q Mul 1/sqrt(H) before QK MatMul", "bert", bert_torch, opset=13,
        scale="mul_q", axis=-1)
    add("bert_o13_const_divq", "Q Div sqrt(H) before QK MatMul", "bert", bert_torch, opset=13, scale="div_q",
        axis=-1)
    add("bert_o13_kT_twice", "K heads [0,2,1,3] then Transpose [0,1,3,2]", "bert", bert_torch, opset=13,
        k_perm="twice", axis=-1)
    add("bert_o13_nomask", "no attention mask", "bert", bert_torch, opset=13, mask="none", axis=-1)
    add("bert_o13_castfirst", "mask Cast before the Unsqueezes", "bert", bert_torch, opset=13, mask="nocast",
        axis=-1)
    add("bert_o13_static_ax3", "static seq 8, Softmax axis=3", "bert", bert_torch, opset=13, static=True,
        axis=3)
    add("bert_o13_ffn_erf", "full layer: attention + FFN with erf-GELU", "bert", bert_torch, opset=13,
        axis=-1, ffn_act="erf")
    add("bert_o13_n2_d32_ffn", "2 heads, hidden 32, full layer, Softmax axis=3", "bert", bert_torch, n=2,
        d=32, opset=13, axis=3, ffn_act="erf")
    add("bert_o17_lnop_shape", "opset 17 LayerNormalization op, Reshape from Shape", "bert", bert_torch,
        opset=17, reshape="shape", axis=-1)
    # the same forms at opset 17 (LayerNormalization op), to tell the attention cause from the LayerNorm one
    add("bert_o17_const_div_ax3", "opset 17 LN op, Softmax axis=3", "bert", bert_torch, opset=17, axis=3)
    add("bert_o17_const_divq", "opset 17 LN op, Q Div sqrt(H)", "bert", bert_torch, opset=17, scale="div_q",
        axis=-1)
    add("bert_o17_shape_mul_ax3", "opset 17 LN op, Reshape from Shape, scores Mul, Softmax axis=3", "bert",
        bert_torch, opset=17, reshape="shape", scale="mul", axis=3)
    # merged QKV
    add("qkv_split_o13", "merged QKV MatMul(3D) + Split", "bert", bert_merged_qkv, opset=13)
    add("qkv_split_o11", "merged QKV + Split (attribute), opset 11", "bert", bert_merged_qkv, opset=11)
    add("qkv_slice_o13", "merged QKV + Slice x3", "bert", bert_merged_qkv, opset=13, how="slice")
    add("qkv_split_o17_nomask", "merged QKV + Split, no mask, LN op", "bert", bert_merged_qkv, opset=17,
        mask=False)
    # GPT-2
    add("gpt2_nopast_gemm", "GPT-2 Conv1D(Gemm), tril Slice+Where, no past", "gpt2", gpt2, opset=13)
    add("gpt2_past_split", "GPT-2 past via Split+Squeeze, K [0,2,1,3]+Concat+Transpose, present",
        "gpt2", gpt2, opset=13, past="split", k_form="0213")
    add("gpt2_past_gather_mask", "GPT-2 past via Gather, K perm 0231, + attention mask", "gpt2", gpt2,
        opset=13, past="gather", attn_mask=True)
    add("gpt2_past_matmul_o11", "GPT-2 opset 11, MatMul+Add projections, past Split", "gpt2", gpt2,
        opset=11, past="split", gemm=False, k_form="0213")
    add("gpt2_nopast_mulsub", "GPT-2 no past, mask as w*b - 1e4*(1-b)", "gpt2", gpt2, opset=13, where=False)
    add("gpt2_nopast_gemm_o17", "GPT-2 Conv1D(Gemm), no past, opset 17 LN op", "gpt2", gpt2, opset=17)
    add("gpt2_past_split_o17", "GPT-2 past Split+Squeeze, opset 17 LN op", "gpt2", gpt2, opset=17,
        past="split", k_form="0213")
    add("gpt2_megatron_o17", "Megatron form, opset 17 LN op", "gpt2", gpt2_megatron, opset=17)
    add("gpt2_megatron", "Megatron: Q,K / sqrt(sqrt(H)), Mul/Sub causal mask input", "gpt2", gpt2_megatron,
        opset=13)
    # tf2onnx
    add("tf2onnx_bert_3d", "tf2onnx: 3-D MatMul+Add, Reshape from Shape/Slice/Concat, TF LayerNorm",
        "bert_tf", bert_tf2onnx, opset=13)
    add("tf2onnx_bert_flat", "tf2onnx: Reshape(-1,D) 2-D projections", "bert_tf", bert_tf2onnx, opset=13,
        flat=True)
    add("tf2onnx_bert_nomask", "tf2onnx 3-D, no mask", "bert_tf", bert_tf2onnx, opset=13, mask=False)
    add("keras_mha_einsum", "Keras MultiHeadAttention via tf2onnx: Einsum", "bert_keras", keras_mha_einsum,
        opset=13)
    # conformer
    add("conformer_posbias", "conformer: rel-pos bias input added to scores, K/V no bias, Q Div",
        "conformer", conformer, opset=13)
    add("conformer_relpos_mask", "conformer: matrix_bd from pos projection + Where mask", "conformer",
        conformer, opset=13, pos="proj", mask=True)
    add("conformer_kvbias_mask_o17", "conformer with K/V bias, Where mask, opset 17 LN op", "conformer",
        conformer, opset=17, mask=True, kv_bias=True)
    # DiT / MMDiT
    add("dit_cast_kdirect", "DiT: Cast around Softmax, K Transpose [0,2,3,1], Mul scale on Q and K",
        "mmdit", dit, opset=17)
    add("dit_cast_kT2", "DiT: K Transpose then Transpose [0,1,3,2]", "mmdit", dit, opset=17, kT="twice")
    add("mmdit_joint", "MMDiT: joint image/context attention, Cast around Softmax", "mmdit", dit, opset=17,
        mmdit=True)
    # BART / Whisper
    add("bart_self_nomask", "BART eager: Q*H^-0.5, K [0,1,3,2], no mask", "bart", sdpa, opset=14)
    add("bart_self_floatmask", "BART eager + additive float mask [B,1,S,S]", "bart", sdpa, opset=14,
        mask="float")
    add("whisper_self_nokbias", "Whisper: K without bias, no mask", "bart", sdpa, opset=14, k_bias=False)
    add("whisper_cross", "Whisper cross-attention (K/V from encoder), K no bias", "bart", sdpa, opset=14,
        k_bias=False, cross=True)
    add("sdpa_sqrt_scale_pad", "torch SDPA decomposition: Sqrt scale on Q and K^T, padding mask", "bert",
        sdpa, opset=14, scale="sdpa", mask="padding")
    add("sdpa_q_ln_residual", "eager SDPA + residual Add + LayerNorm (post-LN)", "bert", sdpa, opset=17,
        mask="padding", ln=True)
    # embeddings
    add("embed_bert_o13_attn", "BERT embeddings (Slice pos buffer) + segment + decomposed LN + attention",
        "bert", embed, opset=13)
    add("embed_bert_o17_attn", "BERT embeddings + LayerNormalization op + attention", "bert", embed,
        opset=17)
    add("embed_distil_range", "DistilBERT Range/Expand position ids, no segment, LN op + attention", "bert",
        embed, opset=17, pos="range", segment=False)
    add("embed_posids_input", "position_ids input, segment, LN op + attention", "bert", embed, opset=17,
        pos="input")
    add("embed_order_wps", "word + pos, then + segment (other Add order), LN op + attention", "bert", embed,
        opset=17, order="wps")
    add("embed_only_o13", "embeddings + decomposed LN only (no attention after)", "bert", embed, opset=13,
        attention=False)
    add("embed_only_o17", "embeddings + LN op only", "bert", embed, opset=17, attention=False)
    # GELU
    for form in ("newgelu", "cube", "megatron", "folded", "erf", "erf_mul", "erf_half"):
        add(f"gelu_{form}_bias", f"GELU {form}, bias Add before", "bert", gelu_ffn, d=32, opset=13, kind=form)
    for form in ("newgelu", "erf"):
        add(f"gelu_{form}_nobias", f"GELU {form}, no bias Add", "bert", gelu_ffn, d=32, opset=13, kind=form,
            bias=False)
    add("gelu_onnx_tanh_o20", "ONNX Gelu(approximate=tanh), opset 20", "bert", gelu_ffn, d=32, opset=20,
        kind="onnx_gelu")
    # skip-LayerNorm
    add("skipln_o13_bias", "MatMul+Add(bias) + Add(x, residual) + decomposed LN", "bert", skip_ln, opset=13)
    add("skipln_o17_bias", "MatMul+Add(bias) + Add(x, residual) + LN op", "bert", skip_ln, opset=17)
    add("skipln_o17_swapped", "Add(residual, x) operands swapped, bias Add(b, y)", "bert", skip_ln, opset=17,
        swapped=True, bias_first=True)
    add("skipln_o17_nobias", "no bias Add", "bert", skip_ln, opset=17, bias=False)
    add("skipln_o17_sum_output", "Add output also a graph output", "bert", skip_ln, opset=17, reuse="output")
    add("skipln_o17_sum_consumer", "Add output also read by the next residual Add", "bert", skip_ln,
        opset=17, reuse="consumer")
    add("skipln_o13_sum_consumer", "same, decomposed LN", "bert", skip_ln, opset=13, reuse="consumer")
    return e


def family(name: str) -> str:
    for prefix, fam in (("embed", "embed"), ("gelu", "gelu"), ("skipln", "skipln")):
        if name.startswith(prefix):
            return fam
    return "attention"


# Hugging Face Optimum's dim names (corpora/optimum.py) -> the corpus' sizes
OPTIMUM_DIMS = {"batch_size": "batch", "text_batch_size": "batch", "sequence_length": "seq",
                "past_sequence_length": "past", "past_sequence_length + sequence_length": "total",
                "num_channels": 3, "height": 32, "width": 32}


def sym_dim(name: str) -> int:
    if "+" in name:  # "past + seq": the sum of its parts (a mask over the cache and the new tokens)
        return sum(sym_dim(p.strip()) for p in name.split("+"))
    name = OPTIMUM_DIMS.get(name, name)
    if isinstance(name, int):
        return name
    if name == "total":
        return DIMS["seq"] + DIMS["past"]
    return DIMS.get(name, DIMS["seq"])  # seq, enc, ctx


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Feeds for the corpus' inputs: DIMS for symbolic dims, ids below the table sizes, masks with padding."""
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sym_dim(d.dim_param) for d in t.shape.dim]
        name = vi.name
        if name == "causal_mask":
            feeds[name] = np.tril(np.ones(shape, np.float32))
        elif name == "pos_bias":
            feeds[name] = rng.standard_normal(shape).astype(np.float32) * 0.1
        elif t.elem_type == I64:
            if "mask" in name:
                a = np.ones(shape, np.int64)
                a[-1, -2:] = 0
            else:
                a = rng.integers(0, {"token_type_ids": TYPES, "position_ids": DIMS["seq"]}.get(name, VOCAB),
                                 size=shape).astype(np.int64)
            feeds[name] = a
        elif t.elem_type == BOOL:
            a = np.ones(shape, bool)
            a[-1, ..., -2:] = False
            feeds[name] = a
        elif "mask" in name:  # float masks: 1/0 (GPT-2 style) or additive
            a = np.ones(shape, np.float32) if name == "attention_mask" and len(shape) == 2 else \
                np.zeros(shape, np.float32)
            feeds[name] = a
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def check_runs(path: Path) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds_for(onnx.load(str(path))))
    for o in outs:
        if o.dtype.kind == "f" and not np.isfinite(o).all():
            raise RuntimeError(f"{path.name}: non-finite output")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="/tmp/forms")
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--torch", action="store_true", help="also export tiny HF BERT / GPT-2 with torch")
    args = ap.parse_args(argv)
    entries = corpus()
    if args.only:
        entries = [x for x in entries if any(x[0].startswith(p) for p in args.only.split(","))]
    if args.list:
        for name, form, mtype, _, _, _ in entries:
            print(f"{name:28} {mtype:10} {form}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, form, mtype, opt_args, fn, kw in entries:
        m = fn(name, **kw)
        path = out / f"{name}.onnx"
        onnx.save(m, str(path))
        check_runs(path)
        manifest[name] = {"file": path.name, "form": form, "family": family(name), "model_type": mtype,
                          **opt_args, "opset": kw.get("opset"), "bytes": path.stat().st_size}
        print(f"{name:28} {path.stat().st_size / 1024:7.1f} KB  {form}")
    if args.torch:
        from corpora.forms_torch import export_all  # noqa: PLC0415 - optional, needs torch

        manifest.update(export_all(out))
    old = out / "forms.json"
    if old.exists() and args.only:
        manifest = {**json.loads(old.read_text()), **manifest}
    old.write_text(json.dumps({"dims": DIMS, "models": manifest}, indent=1))
    print(f"{len(manifest)} models in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
