#!/usr/bin/env python3
"""Generate a corpus of small ONNX models in different *provenance styles* (IR/opset versions, initializers
listed as inputs, external data, local functions, control flow, quantized, float16/bfloat16, already optimized
by onnxruntime, written by onnxruntime's transformers optimizer, `ai.onnx` domain spelling, unnamed dims, a
silero-VAD-v5-like model), to see how onnxfuse copes with each (benchmarks/styles_table.py).

    python models/make_style_models.py [OUT_DIR]        (default: models/styles/)

Only onnx, numpy and onnxruntime (its quantization and transformers tools; the latter need sympy) are used; every tensor comes from a
seeded generator. Each file name states its style. External data is written as `<model>.weights` beside the
model (`*.onnx.data` is git-ignored). Every model is checked to load and run in onnxruntime CPU with
ORT_DISABLE_ALL and ORT_ENABLE_ALL; `onnx.checker` results are printed (some styles fail it on purpose).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ort.set_default_logger_severity(3)
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


class G:
    """Nodes and initializers of one graph at one opset, with opset-dependent spellings of a few ops."""

    def __init__(self, opset: int, prefix: str = "", seed: int = 0, domain: str = ""):
        self.opset, self.prefix, self.domain = opset, prefix, domain
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.const_nodes = False

    def _name(self, op: str) -> str:
        self.n += 1
        return f"{self.prefix}/{op}_{self.n}"

    def op(self, op: str, inputs: list[str], n_out: int = 1, domain: str | None = None, **attrs) -> str | list[str]:
        name = self._name(op)
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name,
                                           domain=self.domain if domain is None else domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def init(self, name: str, arr: np.ndarray) -> str:
        name = f"{self.prefix}.{name}" if self.prefix else name
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def w(self, name: str, *shape: int, scale: float = 0.2) -> str:
        return self.init(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def c(self, name: str, value, dtype=np.float32) -> str:
        if self.const_nodes:  # torch.onnx.export style: small constants as Constant nodes, weights as initializers
            return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))
        return self.init(name, np.asarray(value, dtype=dtype))

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.c(f"axes_{self.n}", axes, np.int64)])
        return self.op("Unsqueeze", [x], axes=axes)

    def squeeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.c(f"axes_{self.n}", axes, np.int64)])
        return self.op("Squeeze", [x], axes=axes)

    def reduce_mean(self, x: str, axes: list[int], keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.c(f"axes_{self.n}", axes, np.int64)], keepdims=keepdims)
        return self.op("ReduceMean", [x], axes=axes, keepdims=keepdims)

    def conv_bn_relu(self, x: str, cin: int, cout: int, tag: str, bn: bool = True, k: int = 3) -> str:
        y = self.op("Conv", [x, self.w(f"{tag}.weight", cout, cin, k, k), self.w(f"{tag}.bias", cout)],
                    kernel_shape=[k, k], pads=[k // 2] * 4)
        if bn:
            y = self.op("BatchNormalization", [y, self.c(f"{tag}.bn.scale", 1 + 0.1 * self.rng.standard_normal(cout)),
                                               self.c(f"{tag}.bn.bias", 0.1 * self.rng.standard_normal(cout)),
                                               self.c(f"{tag}.bn.mean", 0.1 * self.rng.standard_normal(cout)),
                                               self.c(f"{tag}.bn.var", 1 + 0.1 * self.rng.random(cout))],
                        epsilon=1e-5)
        return self.op("Relu", [y])

    def layernorm(self, x: str, h: int, tag: str, fused: bool) -> str:
        gamma = self.init(f"{tag}.gamma", (1 + 0.1 * self.rng.standard_normal(h)).astype(np.float32))
        beta = self.w(f"{tag}.beta", h, scale=0.1)
        if fused:
            return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)
        mean = self.reduce_mean(x, [-1])
        d = self.op("Sub", [x, mean])
        var = self.reduce_mean(self.op("Pow", [d, self.c(f"{tag}.two", 2.0)]), [-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.c(f"{tag}.eps", 1e-12)])])
        return self.op("Add", [self.op("Mul", [self.op("Div", [d, std]), gamma]), beta])

    def gelu(self, x: str, tag: str) -> str:
        e = self.op("Erf", [self.op("Div", [x, self.c(f"{tag}.sqrt2", 1.4142135)])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, self.c(f"{tag}.one", 1.0)])]),
                               self.c(f"{tag}.half", 0.5)])

    def linear(self, x: str, i: int, o: int, tag: str) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.w(f"{tag}.weight", i, o)]), self.w(f"{tag}.bias", o, scale=0.05)])


def model_of(g: G, inputs, outputs, ir: int, opset: int, *, init_as_inputs: bool = False, name: str = "style",
             functions=(), extra_opsets=(), onnx_domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    if init_as_inputs or ir < 4:  # IR 3 requires every initializer to be a graph input too
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.inits)
    opsets = [helper.make_opsetid(onnx_domain, opset), *extra_opsets]
    m = helper.make_model(graph, opset_imports=opsets, producer_name="onnxfuse-make_style_models",
                          producer_version="1.0", functions=list(functions))
    m.ir_version = ir
    return m


# --------------------------------------------------------------------------- #
# CNN: Conv+BN+Relu, MaxPool, Conv+BN+Relu, GlobalAveragePool, Flatten, Gemm
# --------------------------------------------------------------------------- #
def cnn(opset: int, ir: int, *, init_as_inputs=False, batch="batch", domain: str = "") -> onnx.ModelProto:
    g = G(opset, seed=opset, domain=domain)
    y = g.conv_bn_relu("input", 3, 8, "conv1")
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = g.conv_bn_relu(y, 8, 16, "conv2")
    y = g.op("GlobalAveragePool", [y])
    y = g.op("Flatten", [y], axis=1)
    g.op("Gemm", [y, g.w("fc.weight", 10, 16), g.w("fc.bias", 10)], transB=1)
    g.nodes[-1].output[0] = "logits"
    return model_of(g, [helper.make_tensor_value_info("input", F32, [batch, 3, 16, 16])],
                    [helper.make_tensor_value_info("logits", F32, [batch, 10])], ir, opset,
                    init_as_inputs=init_as_inputs, name="cnn", onnx_domain=domain)


# --------------------------------------------------------------------------- #
# BERT-like encoder: Gather embedding, LayerNorm, per layer: Q/K/V MatMul+Add, heads via Reshape/Transpose,
# QK^T / sqrt(d) + mask, Softmax, context, output projection + residual + LayerNorm, erf-GELU FFN + residual + LN
# --------------------------------------------------------------------------- #
def bert(opset: int, ir: int, *, hidden=32, heads=2, ffn=64, layers=1, vocab=32, init_as_inputs=False,
         fused_ln: bool | None = None, gelu_fn: bool = False, dims=("batch", "seq"), seed=1,
         const_nodes: bool = False) -> onnx.ModelProto:
    fused_ln = opset >= 17 if fused_ln is None else fused_ln
    g = G(opset, seed=seed)
    g.const_nodes = const_nodes
    hd = hidden // heads
    x = g.op("Gather", [g.w("embeddings.word", vocab, hidden, scale=0.5), "input_ids"], axis=0)
    x = g.layernorm(x, hidden, "embeddings.ln", fused_ln)
    m = g.unsqueeze("attention_mask", [1, 2])
    m = g.op("Cast", [m], to=F32)
    m = g.op("Mul", [g.op("Sub", [g.c("mask.one", 1.0), m]), g.c("mask.neg", -10000.0)])
    shape_heads = g.c("shape.heads", [0, 0, heads, hd], np.int64)
    shape_back = g.c("shape.back", [0, 0, hidden], np.int64)
    for li in range(layers):
        t = f"layer{li}"
        q = g.op("Transpose", [g.op("Reshape", [g.linear(x, hidden, hidden, f"{t}.q"), shape_heads])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [g.linear(x, hidden, hidden, f"{t}.k"), shape_heads])], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [g.linear(x, hidden, hidden, f"{t}.v"), shape_heads])], perm=[0, 2, 1, 3])
        s = g.op("Div", [g.op("MatMul", [q, k]), g.c(f"{t}.scale", float(np.sqrt(hd)))])
        p = g.op("Softmax", [g.op("Add", [s, m])], axis=-1)
        ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [p, v])], perm=[0, 2, 1, 3]), shape_back])
        a = g.op("Add", [g.linear(ctx, hidden, hidden, f"{t}.o"), x])
        x = g.layernorm(a, hidden, f"{t}.ln1", fused_ln)
        h = g.linear(x, hidden, ffn, f"{t}.ffn1")
        h = g.op("Gelu", [h], domain="local") if gelu_fn else g.gelu(h, f"{t}.gelu")
        x = g.layernorm(g.op("Add", [g.linear(h, ffn, hidden, f"{t}.ffn2"), x]), hidden, f"{t}.ln2", fused_ln)
    g.nodes[-1].output[0] = "last_hidden_state"
    functions, extra = [], []
    if gelu_fn:
        fg = G(opset, prefix="f")
        e = fg.op("Erf", [fg.op("Div", ["X", fg.op("Constant", [], value=numpy_helper.from_array(np.float32(1.4142135)))])])
        one = fg.op("Constant", [], value=numpy_helper.from_array(np.float32(1.0)))
        half = fg.op("Constant", [], value=numpy_helper.from_array(np.float32(0.5)))
        fg.op("Mul", [fg.op("Mul", ["X", fg.op("Add", [e, one])]), half])
        fg.nodes[-1].output[0] = "Y"
        functions = [helper.make_function("local", "Gelu", ["X"], ["Y"], fg.nodes, [helper.make_opsetid("", opset)])]
        extra = [helper.make_opsetid("local", 1)]
    return model_of(g, [helper.make_tensor_value_info("input_ids", I64, list(dims)),
                        helper.make_tensor_value_info("attention_mask", I64, list(dims))],
                    [helper.make_tensor_value_info("last_hidden_state", F32, [*dims, hidden])], ir, opset,
                    init_as_inputs=init_as_inputs, name="bert", functions=functions, extra_opsets=extra)


# --------------------------------------------------------------------------- #
# Control flow: If / Loop / Scan whose bodies read outer-scope initializers and hold Conv+Relu
# --------------------------------------------------------------------------- #
def _sub(opset: int, prefix: str) -> G:
    return G(opset, prefix=prefix, seed=7)


def if_cnn(opset=13, ir=7) -> onnx.ModelProto:
    g = G(opset, seed=3)
    w1, b1, w2, b2 = g.w("then.weight", 8, 3, 3, 3), g.w("then.bias", 8), g.w("else.weight", 8, 3, 3, 3), g.w("else.bias", 8)
    scale = g.c("else.scale", 0.5 + g.rng.random((1, 8, 1, 1)))
    cond = g.op("Greater", [g.op("ReduceMean", ["input"], keepdims=0), g.c("zero", 0.0)])
    t = _sub(opset, "then")
    t.op("Relu", [t.op("Conv", ["input", w1, b1], kernel_shape=[3, 3], pads=[1] * 4)])
    t_out = t.nodes[-1].output[0]
    e = _sub(opset, "else")
    e.op("Relu", [e.op("Mul", [e.op("Conv", ["input", w2, b2], kernel_shape=[3, 3], pads=[1] * 4), scale])])
    e_out = e.nodes[-1].output[0]
    vi = [helper.make_tensor_value_info(t_out, F32, None)]
    then_g = helper.make_graph(t.nodes, "then_branch", [], vi)
    else_g = helper.make_graph(e.nodes, "else_branch", [], [helper.make_tensor_value_info(e_out, F32, None)])
    y = g.op("If", [cond], then_branch=then_g, else_branch=else_g)
    y = g.op("GlobalAveragePool", [g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])])
    g.op("Gemm", [g.op("Flatten", [y]), g.w("fc.weight", 10, 8), g.w("fc.bias", 10)], transB=1)
    g.nodes[-1].output[0] = "logits"
    return model_of(g, [helper.make_tensor_value_info("input", F32, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info("logits", F32, ["batch", 10])], ir, opset, name="if_cnn")


def loop_cnn(opset=13, ir=7) -> onnx.ModelProto:
    g = G(opset, seed=4)
    x = g.conv_bn_relu("input", 3, 8, "stem")
    wl, bl = g.w("loop.weight", 8, 8, 3, 3, scale=0.1), g.w("loop.bias", 8)
    b = _sub(opset, "body")
    y = b.op("Relu", [b.op("Conv", ["h_in", wl, bl], kernel_shape=[3, 3], pads=[1] * 4)])
    b.op("Identity", ["cond_in"])
    body = helper.make_graph(b.nodes, "loop_body",
                             [helper.make_tensor_value_info("iter", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_in", F32, None)],
                             [helper.make_tensor_value_info(b.nodes[-1].output[0], TensorProto.BOOL, []),
                              helper.make_tensor_value_info(y, F32, None)])
    h = g.op("Loop", [g.c("trip", 3, np.int64), g.c("cond", True, np.bool_), x], body=body)
    y = g.op("Flatten", [g.op("GlobalAveragePool", [h])])
    g.op("Gemm", [y, g.w("fc.weight", 10, 8), g.w("fc.bias", 10)], transB=1)
    g.nodes[-1].output[0] = "logits"
    return model_of(g, [helper.make_tensor_value_info("input", F32, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info("logits", F32, ["batch", 10])], ir, opset, name="loop_cnn")


def scan_cnn(opset=13, ir=7) -> onnx.ModelProto:
    g = G(opset, seed=5)
    ws, bs = g.w("scan.weight", 8, 3, 3, 3), g.w("scan.bias", 8)
    b = _sub(opset, "body")
    f = b.unsqueeze("frame", [0])
    f = b.op("Relu", [b.op("Conv", [f, ws, bs], kernel_shape=[3, 3], pads=[1] * 4)])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [f])])
    acc = b.op("Add", ["acc_in", f])
    b.op("Identity", [f])
    body = helper.make_graph(b.nodes, "scan_body",
                             [helper.make_tensor_value_info("acc_in", F32, [1, 8]),
                              helper.make_tensor_value_info("frame", F32, [3, 16, 16])],
                             [helper.make_tensor_value_info(acc, F32, [1, 8]),
                              helper.make_tensor_value_info(b.nodes[-1].output[0], F32, [1, 8])], b.inits)
    outs = g.op("Scan", [g.c("acc0", np.zeros((1, 8))), "frames"], n_out=2, body=body, num_scan_inputs=1)
    g.op("Identity", [outs[0]])
    g.nodes[-1].output[0] = "total"
    g.op("Identity", [outs[1]])
    g.nodes[-1].output[0] = "per_frame"
    return model_of(g, [helper.make_tensor_value_info("frames", F32, ["frames", 3, 16, 16])],
                    [helper.make_tensor_value_info("total", F32, [1, 8]),
                     helper.make_tensor_value_info("per_frame", F32, ["frames", 1, 8])], ir, opset, name="scan_cnn")


def functions_cnn(opset=15, ir=8) -> onnx.ModelProto:
    """Conv+Relu as a model-local function `local.ConvRelu(X, W, B)`, used twice."""
    g = G(opset, seed=6)
    y = g.op("ConvRelu", ["input", g.w("conv1.weight", 8, 3, 3, 3), g.w("conv1.bias", 8)], domain="local")
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = g.op("ConvRelu", [y, g.w("conv2.weight", 16, 8, 3, 3), g.w("conv2.bias", 16)], domain="local")
    g.op("Gemm", [g.op("Flatten", [g.op("GlobalAveragePool", [y])]), g.w("fc.weight", 10, 16), g.w("fc.bias", 10)], transB=1)
    g.nodes[-1].output[0] = "logits"
    fn = helper.make_function("local", "ConvRelu", ["X", "W", "B"], ["Y"], [
        helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1] * 4),
        helper.make_node("Relu", ["c"], ["Y"])], [helper.make_opsetid("", opset)])
    return model_of(g, [helper.make_tensor_value_info("input", F32, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info("logits", F32, ["batch", 10])], ir, opset, name="functions_cnn",
                    functions=[fn], extra_opsets=[helper.make_opsetid("local", 1)])


# --------------------------------------------------------------------------- #
# silero-VAD-v5-like: input [?, ?], state [2, ?, 128], sr scalar; If(sr == 16000) with an LSTM whose initial
# h/c are slices of `state` in each branch
# --------------------------------------------------------------------------- #
def silero_like(opset=16, ir=8) -> onnx.ModelProto:
    g = G(opset, seed=8)
    hid, feat = 128, 16
    # low-rank LSTM weights (keeps the file small): W = A @ B, computed in the outer graph
    wmat = g.op("MatMul", [g.w("lstm.W.a", 4 * hid, 4, scale=0.3), g.w("lstm.W.b", 4, feat, scale=0.3)])
    rmat = g.op("MatMul", [g.w("lstm.R.a", 4 * hid, 4, scale=0.2), g.w("lstm.R.b", 4, hid, scale=0.2)])
    wl, rl = g.unsqueeze(wmat, [0]), g.unsqueeze(rmat, [0])
    bl = g.w("lstm.B", 1, 8 * hid, scale=0.05)
    cond = g.op("Equal", ["sr", g.c("sr16k", 16000, np.int64)])

    def branch(tag: str, stride: int) -> onnx.GraphProto:
        b = G(opset, prefix=tag, seed=9 + stride)
        x = b.unsqueeze("input", [1])  # [B, 1, T]
        x = b.op("Relu", [b.op("Conv", [x, g.w(f"{tag}.stft.weight", 16, 1, 8), g.w(f"{tag}.stft.bias", 16)],
                                kernel_shape=[8], strides=[stride])])
        x = b.op("Relu", [b.op("Conv", [x, g.w(f"{tag}.enc.weight", feat, 16, 3, scale=0.1), g.w(f"{tag}.enc.bias", feat)],
                                kernel_shape=[3], pads=[1, 1])])
        x = b.unsqueeze(b.reduce_mean(x, [2], keepdims=0), [0])  # [1, B, feat]
        h0 = b.op("Slice", ["state", b.c("s0", [0], np.int64), b.c("e0", [1], np.int64), b.c("ax", [0], np.int64)])
        c0 = b.op("Slice", ["state", b.c("s1", [1], np.int64), b.c("e1", [2], np.int64), b.c("ax1", [0], np.int64)])
        _, yh, yc = b.op("LSTM", [x, wl, rl, bl, "", h0, c0], n_out=3, hidden_size=hid)
        d = b.op("Relu", [b.squeeze(yh, [0])])
        out = b.op("Sigmoid", [b.op("Gemm", [d, g.w(f"{tag}.dec.weight", 1, hid), g.w(f"{tag}.dec.bias", 1)], transB=1)])
        state_n = b.op("Concat", [yh, yc], axis=0)
        # branch-local constants stay initializers of the branch
        return helper.make_graph(b.nodes, f"{tag}_branch", [], [helper.make_tensor_value_info(out, F32, None),
                                                                 helper.make_tensor_value_info(state_n, F32, None)], b.inits)

    outs = g.op("If", [cond], n_out=2, then_branch=branch("sr16k", 4), else_branch=branch("sr8k", 2))
    g.op("Identity", [outs[0]])
    g.nodes[-1].output[0] = "output"
    g.op("Identity", [outs[1]])
    g.nodes[-1].output[0] = "stateN"
    return model_of(g, [helper.make_tensor_value_info("input", F32, [None, None]),
                        helper.make_tensor_value_info("state", F32, [2, None, 128]),
                        helper.make_tensor_value_info("sr", I64, [])],
                    [helper.make_tensor_value_info("output", F32, [None, 1]),
                     helper.make_tensor_value_info("stateN", F32, [None, None, None])], ir, opset, name="silero_like")


# --------------------------------------------------------------------------- #
# onnxruntime's own tools
# --------------------------------------------------------------------------- #
def feeds_for(m: onnx.ModelProto | str, batch: int = 1, seq: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(m if isinstance(m, str) else m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    names = {i.name for i in sess.get_inputs()}
    if {"input", "state", "sr"} <= names:  # silero-like
        return {"input": rng.standard_normal((batch, 512)).astype(np.float32),
                "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)}
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else (batch if k == 0 else (4 if i.name == "frames" else seq))
                 for k, d in enumerate(i.shape)]
        if i.name == "frames":
            shape[0] = 3
        if i.type in ("tensor(int64)", "tensor(int32)"):
            dt = np.int64 if i.type == "tensor(int64)" else np.int32
            feeds[i.name] = (np.ones(shape, dt) if "mask" in i.name else rng.integers(0, 32, shape)).astype(dt)
        elif i.type == "tensor(float16)":
            feeds[i.name] = rng.standard_normal(shape).astype(np.float16)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


class Calib:
    """A deterministic calibration reader: 8 seeded batches."""

    def __init__(self, model_path: str):
        self.data = iter([feeds_for(model_path, seed=s) for s in range(8)])

    def get_next(self):
        return next(self.data, None)


def quantized_cnn(tmp: str, fmt: str) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    src, dst = os.path.join(tmp, "cnn13.onnx"), os.path.join(tmp, f"cnn_{fmt}.onnx")
    onnx.save(cnn(13, 7), src)
    quantize_static(src, dst, Calib(src), quant_format=getattr(QuantFormat, fmt), activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return onnx.load(dst)


def dynamic_quant_bert(tmp: str) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    src, dst = os.path.join(tmp, "bert64.onnx"), os.path.join(tmp, "bert64_dq.onnx")
    onnx.save(bert(13, 7, hidden=64, heads=4, ffn=128, layers=2, vocab=32), src)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    return onnx.load(dst)


def fp16(m: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    return convert_float_to_float16(m, keep_io_types=True)


def bf16_cnn(opset=13, ir=7) -> onnx.ModelProto:
    """Float32 CNN whose middle (MaxPool input reshaped/transposed) runs in bfloat16: ORT CPU has bf16 kernels for
    data movement (Transpose, Reshape, Identity, Concat, Slice...) and Cast but not for Conv/MatMul/Add/Relu."""
    g = G(opset, seed=11)
    y = g.conv_bn_relu("input", 3, 8, "conv1")
    y = g.op("Cast", [y], to=TensorProto.BFLOAT16)
    y = g.op("Transpose", [y], perm=[0, 2, 3, 1])
    y = g.op("Transpose", [y], perm=[0, 3, 1, 2])
    y = g.op("Cast", [g.op("Identity", [y])], to=F32)
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = g.conv_bn_relu(y, 8, 16, "conv2")
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])])
    g.op("Gemm", [y, g.w("fc.weight", 10, 16), g.w("fc.bias", 10)], transB=1)
    g.nodes[-1].output[0] = "logits"
    return model_of(g, [helper.make_tensor_value_info("input", F32, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info("logits", F32, ["batch", 10])], ir, opset, name="bf16_cnn")


def ort_optimized(tmp: str, m: onnx.ModelProto, level: str, tag: str) -> onnx.ModelProto:
    src, dst = os.path.join(tmp, f"{tag}.onnx"), os.path.join(tmp, f"{tag}_{level}.onnx")
    onnx.save(m, src)
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = dst
    so.intra_op_num_threads = 1
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return onnx.load(dst)


def transformers_optimized(tmp: str, m: onnx.ModelProto, opt_level: int, tag: str, hidden=32, heads=2) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model
    src, dst = os.path.join(tmp, f"{tag}.onnx"), os.path.join(tmp, f"{tag}_tfopt.onnx")
    onnx.save(m, src)
    opt = optimize_model(src, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=opt_level,
                         use_gpu=False)
    opt.save_model_to_file(dst)
    return onnx.load(dst)


def ai_onnx_domain(m: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for op in m.opset_import:
        if op.domain == "":
            op.domain = "ai.onnx"
    for n in m.graph.node:
        if n.domain == "":
            n.domain = "ai.onnx"
    return m


# --------------------------------------------------------------------------- #
def build(tmp: str) -> dict[str, onnx.ModelProto]:
    out: dict[str, onnx.ModelProto] = {}
    for ir, op in [(3, 7), (3, 8), (4, 9), (5, 10), (6, 11), (7, 13), (8, 15), (9, 19), (10, 21), (10, 23)]:
        out[f"cnn_ir{ir}_op{op}"] = cnn(op, ir)
        if op >= 11:
            out[f"bert_ir{ir}_op{op}"] = bert(op, ir)
    out["cnn_ir3_op9_init_as_inputs"] = cnn(9, 3, init_as_inputs=True)
    out["cnn_ir4_op9_init_as_inputs"] = cnn(9, 4, init_as_inputs=True)
    out["cnn_ir6_op11_init_as_inputs"] = cnn(11, 6, init_as_inputs=True)
    out["bert_ir3_op11_init_as_inputs"] = bert(11, 3, init_as_inputs=True)
    out["bert_ir6_op11_init_as_inputs"] = bert(11, 6, init_as_inputs=True)
    # torch.onnx.export(keep_initializers_as_inputs=True): weights are initializers listed as inputs, scalars and
    # shapes are Constant nodes (so fusions that need only constant scalars still fire)
    out["bert_ir6_op11_init_as_inputs_const_nodes"] = bert(11, 6, init_as_inputs=True, const_nodes=True)
    out["bert_ir8_op17_init_as_inputs_const_nodes"] = bert(17, 8, init_as_inputs=True, const_nodes=True)
    out["bert_ir8_op17_local_function_gelu"] = bert(17, 8, gelu_fn=True)
    out["cnn_ir8_op15_local_function_convrelu"] = functions_cnn()
    out["cnn_ir7_op13_if_outer_scope"] = if_cnn()
    out["cnn_ir7_op13_loop_outer_scope"] = loop_cnn()
    out["cnn_ir7_op13_scan_outer_scope"] = scan_cnn()
    out["cnn_ir7_op13_qdq_int8"] = quantized_cnn(tmp, "QDQ")
    out["cnn_ir7_op13_qoperator_int8"] = quantized_cnn(tmp, "QOperator")
    out["bert_ir7_op13_h64_dynamic_int8"] = dynamic_quant_bert(tmp)
    out["bert_ir7_op13_fp16_keep_io"] = fp16(bert(13, 7))
    out["cnn_ir7_op13_fp16_keep_io"] = fp16(cnn(13, 7))
    out["cnn_ir7_op13_bf16_inside"] = bf16_cnn()
    out["cnn_ir7_op13_ort_extended"] = ort_optimized(tmp, cnn(13, 7), "ORT_ENABLE_EXTENDED", "cnn")
    out["cnn_ir7_op13_ort_all_nchwc"] = ort_optimized(tmp, cnn(13, 7), "ORT_ENABLE_ALL", "cnn")
    out["bert_ir7_op13_ort_extended"] = ort_optimized(tmp, bert(13, 7), "ORT_ENABLE_EXTENDED", "bert")
    out["bert_ir7_op13_ort_all"] = ort_optimized(tmp, bert(13, 7), "ORT_ENABLE_ALL", "bert")
    out["bert_ir7_op13_tfopt_level0"] = transformers_optimized(tmp, bert(13, 7), 0, "bert13")
    out["bert_ir7_op14_tfopt_level0_onnx_layernorm"] = transformers_optimized(tmp, bert(14, 7), 0, "bert14")
    out["bert_ir8_op16_tfopt_level0_onnx_layernorm"] = transformers_optimized(tmp, bert(16, 8), 0, "bert16")
    out["cnn_ir7_op13_ai_onnx_domain"] = ai_onnx_domain(cnn(13, 7))
    out["bert_ir7_op13_ai_onnx_domain"] = ai_onnx_domain(bert(13, 7))
    out["cnn_ir7_op13_unnamed_dims"] = cnn(13, 7, batch=None)
    out["bert_ir7_op13_unnamed_dims"] = bert(13, 7, dims=(None, None))
    out["silero_v5_like_ir8_op16"] = silero_like()
    return out


def check(path: str) -> str:
    """Run with ORT_DISABLE_ALL and ORT_ENABLE_ALL; raise if onnxruntime can't; return onnx.checker's verdict."""
    feeds = feeds_for(path)
    results = []
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        results.append(sess.run(None, feeds))
    for a, b in zip(*results, strict=True):
        if not np.allclose(a.astype(np.float32), b.astype(np.float32), atol=1e-2, rtol=1e-2):
            raise RuntimeError(f"{path}: DISABLE_ALL and ENABLE_ALL differ")
    try:
        onnx.checker.check_model(path, full_check=True)
        return "checker ok"
    except Exception as e:  # some styles fail it on purpose (LayerNormalization at opset 16)
        return f"checker: {str(e).strip().splitlines()[0][:90]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(HERE / "styles"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        models = build(tmp)
    total = 0
    for name, m in models.items():
        path = os.path.join(args.out, name + ".onnx")
        onnx.save(m, path)
        total += os.path.getsize(path)
        print(f"{name + '.onnx':50s} {os.path.getsize(path) / 1024:7.1f} KB  {check(path)}")
    # external data: the weights in `<model>.weights` beside the model
    name = "bert_ir7_op13_external_data"
    path = os.path.join(args.out, name + ".onnx")
    if os.path.exists(path[:-5] + ".weights"):  # onnx appends to an existing data file
        os.remove(path[:-5] + ".weights")
    onnx.save_model(bert(13, 7), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".weights", size_threshold=1024)
    size = os.path.getsize(path) + os.path.getsize(path[:-5] + ".weights")
    total += size
    print(f"{name + '.onnx':50s} {size / 1024:7.1f} KB  {check(path)} (+ {name}.weights)")
    print(f"total {total / 1024:.0f} KB in {len(models) + 1} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
