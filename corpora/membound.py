#!/usr/bin/env python3
"""A corpus of memory-bound CNN models: the mobile / OCR / detection nets where most of the latency is the
time *between* the GEMMs (depthwise convs, squeeze-excitation, activations, Resize, Concat, BatchNorm).

Usage::

    python -m corpora.membound [OUT_DIR]      # default /tmp/membound
    python -m corpora.membound --only mnv3,db_
    python -m corpora.membound --list

Every model is built with ``onnx.helper`` and numpy only (random weights, a fixed seed per model, nothing
downloaded), float32, batch 1, static input shapes; BatchNormalization nodes are kept where the real nets have
them (the way paddle2onnx and un-folded exports write them). Each file is checked with ``onnx.checker`` and one
onnxruntime CPU run; its size, node count and output shapes are printed.

============== ==========================================================================================
mnv3_small     MobileNetV3-small (torchvision config): 224x224, 11 bnecks, depthwise 3x3/5x5, SE with
               GlobalAveragePool + 1x1 convs + HardSigmoid, ReLU / HardSwish, classifier 576-1024-1000. Opset 17
effnet_b0      EfficientNet-B0: 224x224, the 7 MBConv stages (16 blocks), SE, Swish written x*Sigmoid(x),
               head 1x1 to 1280, classifier; stage 6 cut to 3 blocks to stay under 20 MB. Opset 13
db_det_640     DB text detector (PP-OCR det-like): 640x640, MobileNetV3-large-x0.5-like backbone (strides 4..32),
               DBFPN neck (1x1 to 96, nearest Resize x2 adds, 3x3 to 24, Resize x2/x4/x8, Concat), DB head
               (3x3 conv, two ConvTranspose k2 s2, Sigmoid). Opset 14
rec_svtr       SVTR-like recognizer (PP-OCRv3 rec-like): 48x320, depthwise-separable conv stack to [1,C,1,40]
               (height pooled), 2 transformer blocks over the width (dim 120, 8 heads, decomposed LayerNorm,
               Erf GELU), CTC head MatMul to 6625 classes + Softmax. Opset 14
rec_crnn       CRNN: 48x320, the same conv stack, BiLSTM (hidden 96) over the width, CTC head. Opset 14
picodet_416    PicoDet-s-like detector: 416x416, ESNet-like backbone (strides 8/16/32, channel shuffle-free
               depthwise blocks with SE), CSP-PAN neck (1x1 to 96, nearest Resize x2 + Concat top-down,
               depthwise s2 + Concat bottom-up, extra stride-64 level), GFL head per level (depthwise-separable
               convs, cls 80 + reg 32 outputs, Sigmoid, Reshape/Transpose, Concat over levels). Opset 14
============== ==========================================================================================
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def make_divisible(v: float, d: int = 8) -> int:
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


class G:
    """A graph under construction: nodes, initializers (random, from one seeded generator)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def uid(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, arr: np.ndarray, prefix: str = "c") -> str:
        name = self.uid(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 2.0, prefix: str = "w") -> str:
        std = math.sqrt(gain / max(1, fan_in))
        return self.const(self.rng.normal(0, std, shape).astype(np.float32), prefix)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        name = self.uid(op_type.lower())
        outs = [f"{name}_o{i}" if n_out > 1 else f"{name}_o" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- layers -----------------------------------------------------------------------------------------

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        scale = self.const(r.uniform(0.6, 1.2, c).astype(np.float32), "bn_s")
        bias = self.const(r.normal(0, 0.1, c).astype(np.float32), "bn_b")
        mean = self.const(r.normal(0, 0.1, c).astype(np.float32), "bn_m")
        var = self.const(r.uniform(0.6, 1.4, c).astype(np.float32), "bn_v")
        return self.op("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-5)

    def act(self, x: str, kind: str | None) -> str:
        if kind is None:
            return x
        if kind == "relu":
            return self.op("Relu", [x])
        if kind == "hswish":
            return self.op("HardSwish", [x])
        if kind == "hsig":
            return self.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
        if kind == "sigmoid":
            return self.op("Sigmoid", [x])
        if kind == "swish":  # x * Sigmoid(x), as torch exports SiLU below opset 15 and as TF2ONNX writes it
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        raise ValueError(kind)

    def conv(self, x: str, cin: int, cout: int, k: int | tuple[int, int] = 1, s: int | tuple[int, int] = 1,
             groups: int = 1, bn: bool = True, act: str | None = None, bias: bool = False,
             gain: float = 2.0) -> str:
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (s, s) if isinstance(s, int) else s
        w = self.weight((cout, cin // groups, kh, kw), cin // groups * kh * kw, gain)
        ins = [x, w]
        if bias or not bn:
            ins.append(self.const(self.rng.normal(0, 0.05, cout).astype(np.float32), "b"))
        y = self.op("Conv", ins, kernel_shape=[kh, kw], strides=[sh, sw], group=groups,
                    pads=[kh // 2, kw // 2, kh // 2, kw // 2])
        if bn:
            y = self.bn(y, cout)
        return self.act(y, act)

    def se(self, x: str, c: int, mid: int, inner: str, gate: str) -> str:
        s = self.op("GlobalAveragePool", [x])
        s = self.conv(s, c, mid, bn=False, act=inner, bias=True)
        s = self.conv(s, mid, c, bn=False, act=gate, bias=True, gain=1.0)
        return self.op("Mul", [x, s])

    def resize(self, x: str, scale: float) -> str:
        scales = self.const(np.array([1, 1, scale, scale], np.float32), "scales")
        return self.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")

    def linear(self, x: str, din: int, dout: int, bias: bool = True, gain: float = 1.0) -> str:
        y = self.op("MatMul", [x, self.weight((din, dout), din, gain)])
        if bias:
            y = self.op("Add", [y, self.const(self.rng.normal(0, 0.02, dout).astype(np.float32), "b")])
        return y

    def gemm(self, x: str, din: int, dout: int, gain: float = 1.0) -> str:
        return self.op("Gemm", [x, self.weight((dout, din), din, gain),
                                self.const(np.zeros(dout, np.float32), "b")], transB=1)

    def layernorm(self, x: str, d: int) -> str:
        """Decomposed LayerNorm over the last axis (opset < 17 exports)."""
        mean = self.op("ReduceMean", [x], axes=[-1])
        xc = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Pow", [xc, self.const(np.array(2.0, np.float32))])], axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const(np.array(1e-6, np.float32))])])
        y = self.op("Div", [xc, std])
        y = self.op("Mul", [y, self.const(self.rng.uniform(0.8, 1.2, d).astype(np.float32), "ln_g")])
        return self.op("Add", [y, self.const(self.rng.normal(0, 0.02, d).astype(np.float32), "ln_b")])

    def gelu(self, x: str) -> str:
        e = self.op("Erf", [self.op("Div", [x, self.const(np.array(math.sqrt(2), np.float32))])])
        h = self.op("Mul", [x, self.op("Add", [e, self.const(np.array(1.0, np.float32))])])
        return self.op("Mul", [h, self.const(np.array(0.5, np.float32))])

    def model(self, inputs: list[tuple[str, list[int]]], outputs: list[str], opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                                  [helper.make_tensor_value_info(o, F, None) for o in outputs], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnxfuse-membound")
        m.ir_version = 8
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        return m


# -- MobileNetV3-small ------------------------------------------------------------------------------------

MNV3_SMALL = [  # k, exp, out, se, act, stride (torchvision mobilenet_v3_small)
    (3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hswish", 2), (5, 240, 40, True, "hswish", 1), (5, 240, 40, True, "hswish", 1),
    (5, 120, 48, True, "hswish", 1), (5, 144, 48, True, "hswish", 1), (5, 288, 96, True, "hswish", 2),
    (5, 576, 96, True, "hswish", 1), (5, 576, 96, True, "hswish", 1),
]


def mv3_block(g: G, x: str, cin: int, k: int, exp: int, cout: int, se: bool, act: str, s: int) -> str:
    y = x if exp == cin else g.conv(x, cin, exp, 1, act=act)
    y = g.conv(y, exp, exp, k, s, groups=exp, act=act)
    if se:
        y = g.se(y, exp, make_divisible(exp / 4), "relu", "hsig")
    y = g.conv(y, exp, cout, 1, gain=1.0)
    return g.op("Add", [x, y]) if s == 1 and cin == cout else y


def mnv3_small() -> onnx.ModelProto:
    g = G("mnv3_small")
    x = g.conv("input", 3, 16, 3, 2, act="hswish")
    c = 16
    for k, exp, out, se, act, s in MNV3_SMALL:
        x = mv3_block(g, x, c, k, exp, out, se, act, s)
        c = out
    x = g.conv(x, c, 576, 1, act="hswish")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    x = g.act(g.gemm(x, 576, 1024, 2.0), "hswish")
    return g.model([("input", [1, 3, 224, 224])], [g.gemm(x, 1024, 1000)], 17)


# -- EfficientNet-B0 --------------------------------------------------------------------------------------

EFFNET_B0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
             (6, 5, 2, 192, 3), (6, 3, 1, 320, 1)]  # expand, k, stride, out, repeats (B0 has 4 at 192)


def effnet_b0() -> onnx.ModelProto:
    g = G("effnet_b0")
    x = g.conv("input", 3, 32, 3, 2, act="swish")
    c = 32
    for e, k, s, out, reps in EFFNET_B0:
        for i in range(reps):
            stride = s if i == 0 else 1
            exp = c * e
            y = x if e == 1 else g.conv(x, c, exp, 1, act="swish")
            y = g.conv(y, exp, exp, k, stride, groups=exp, act="swish")
            y = g.se(y, exp, max(1, c // 4), "swish", "sigmoid")
            y = g.conv(y, exp, out, 1, gain=1.0)
            x = g.op("Add", [x, y]) if stride == 1 and c == out else y
            c = out
    x = g.conv(x, c, 1280, 1, act="swish")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    return g.model([("input", [1, 3, 224, 224])], [g.gemm(x, 1280, 1000)], 13)


# -- a small mobile backbone for the OCR detector (MobileNetV3-large x0.5-like) ----------------------------

MNV3_LARGE_X05 = [  # k, exp, out, se, act, stride
    (3, 8, 8, False, "relu", 1), (3, 32, 16, False, "relu", 2), (3, 40, 16, False, "relu", 1),
    (5, 40, 24, True, "relu", 2), (5, 64, 24, True, "relu", 1), (5, 64, 24, True, "relu", 1),
    (3, 120, 40, False, "hswish", 2), (3, 104, 40, False, "hswish", 1), (3, 96, 40, False, "hswish", 1),
    (3, 96, 40, False, "hswish", 1), (3, 240, 56, True, "hswish", 1), (3, 336, 56, True, "hswish", 1),
    (5, 336, 80, True, "hswish", 2), (5, 480, 80, True, "hswish", 1), (5, 480, 80, True, "hswish", 1),
]


def mnv3_large_x05(g: G, x: str) -> list[tuple[str, int]]:
    """Features at strides 4, 8, 16, 32: [(name, channels)]."""
    x = g.conv(x, 3, 8, 3, 2, act="hswish")
    c, feats = 8, []
    for i, (k, exp, out, se, act, s) in enumerate(MNV3_LARGE_X05):
        if s == 2 and i > 0:
            feats.append((x, c))
        x = mv3_block(g, x, c, k, exp, out, se, act, s)
        c = out
    x = g.conv(x, c, 480, 1, act="hswish")
    feats.append((x, 480))
    return feats[-4:]


def db_det(size: int = 640) -> onnx.ModelProto:
    g = G(f"db_det_{size}")
    feats = mnv3_large_x05(g, "x")
    ins = [g.conv(f, c, 96, 1, bn=False) for f, c in feats]  # DBFPN: 1x1 convs, no BN
    in2, in3, in4, in5 = ins
    out4 = g.op("Add", [in4, g.resize(in5, 2)])
    out3 = g.op("Add", [in3, g.resize(out4, 2)])
    out2 = g.op("Add", [in2, g.resize(out3, 2)])
    p5 = g.resize(g.conv(in5, 96, 24, 3, bn=False), 8)
    p4 = g.resize(g.conv(out4, 96, 24, 3, bn=False), 4)
    p3 = g.resize(g.conv(out3, 96, 24, 3, bn=False), 2)
    p2 = g.conv(out2, 96, 24, 3, bn=False)
    fuse = g.op("Concat", [p5, p4, p3, p2], axis=1)
    h = g.conv(fuse, 96, 24, 3, act="relu")
    w1 = g.weight((24, 24, 2, 2), 24 * 4)
    h = g.op("ConvTranspose", [h, w1, g.const(np.zeros(24, np.float32))], kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Relu", [g.bn(h, 24)])
    w2 = g.weight((24, 1, 2, 2), 24 * 4, 1.0)
    h = g.op("ConvTranspose", [h, w2, g.const(np.zeros(1, np.float32))], kernel_shape=[2, 2], strides=[2, 2])
    return g.model([("x", [1, 3, size, size])], [g.op("Sigmoid", [h])], 14)


# -- text recognizers ---------------------------------------------------------------------------------------

REC_STACK = [  # (out, stride) of depthwise-separable blocks after the stem (PP-OCR MobileNetV1Enhance-like)
    (64, 1), (128, (2, 1)), (128, 1), (256, (2, 1)), (256, 1), (512, (2, 1)), (512, 1), (512, 1),
    (512, (2, 1)), (512, 1),
]


def rec_backbone(g: G) -> tuple[str, int]:
    x = g.conv("x", 3, 32, 3, 2, act="hswish")  # 24 x 160
    c = 32
    for i, (out, s) in enumerate(REC_STACK):
        x = g.conv(x, c, c, 3, s, groups=c, act="hswish")
        if i >= 6:
            x = g.se(x, c, c // 4, "relu", "hsig")
        x = g.conv(x, c, out, 1, act="hswish")
        c = out
    # here [1, 512, 2, 160]; pool to height 1 and width 40 (the avg-pool / max-pool of PP-OCR rec)
    x = g.op("MaxPool", [x], kernel_shape=[2, 4], strides=[2, 4])
    return x, c


def rec_svtr() -> onnx.ModelProto:
    g = G("rec_svtr")
    x, c = rec_backbone(g)
    d, heads, width = 120, 8, 40
    x = g.conv(x, c, c // 8, 3, act="swish")
    x = g.conv(x, c // 8, d, 1, act="swish")  # [1, 120, 1, 40]
    x = g.op("Transpose", [g.op("Squeeze", [x, g.const(np.array([2], np.int64))])], perm=[0, 2, 1])  # [1,40,120]
    hd = d // heads
    for _ in range(2):
        h = g.layernorm(x, d)
        qkv = g.linear(h, d, 3 * d)
        qkv = g.op("Transpose", [g.op("Reshape", [qkv, g.const(np.array([0, width, 3, heads, hd], np.int64))])],
                   perm=[2, 0, 3, 1, 4])  # [3, 1, heads, width, hd]
        q, k, v = g.op("Split", [qkv], n_out=3, axis=0)
        sq = g.const(np.array([0], np.int64))
        q, k, v = (g.op("Squeeze", [t, sq]) for t in (q, k, v))
        q = g.op("Mul", [q, g.const(np.array(hd ** -0.5, np.float32))])
        a = g.op("Softmax", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])], axis=-1)
        o = g.op("Transpose", [g.op("MatMul", [a, v])], perm=[0, 2, 1, 3])
        o = g.op("Reshape", [o, g.const(np.array([0, width, d], np.int64))])
        x = g.op("Add", [x, g.linear(o, d, d)])
        h = g.layernorm(x, d)
        x = g.op("Add", [x, g.linear(g.gelu(g.linear(h, d, 2 * d)), 2 * d, d)])
    x = g.layernorm(x, d)
    logits = g.linear(x, d, 6625)
    return g.model([("x", [1, 3, 48, 320])], [g.op("Softmax", [logits], axis=2)], 14)


def rec_crnn() -> onnx.ModelProto:
    g = G("rec_crnn")
    x, c = rec_backbone(g)
    hidden = 96
    seq = g.op("Transpose", [g.op("Squeeze", [x, g.const(np.array([2], np.int64))])], perm=[2, 0, 1])  # [40,1,512]
    for layer in range(2):
        din = c if layer == 0 else 2 * hidden
        w = g.weight((2, 4 * hidden, din), din, 1.0)
        r = g.weight((2, 4 * hidden, hidden), hidden, 1.0)
        b = g.const(np.zeros((2, 8 * hidden), np.float32))
        y, _, _ = g.op("LSTM", [seq, w, r, b], n_out=3, hidden_size=hidden, direction="bidirectional")
        # Y: [seq, 2, batch, hidden] -> [seq, batch, 2*hidden]
        y = g.op("Transpose", [y], perm=[0, 2, 1, 3])
        seq = g.op("Reshape", [y, g.const(np.array([0, 0, 2 * hidden], np.int64))])
    x = g.op("Transpose", [seq], perm=[1, 0, 2])
    logits = g.linear(x, 2 * hidden, 6625)
    return g.model([("x", [1, 3, 48, 320])], [g.op("Softmax", [logits], axis=2)], 14)


# -- PicoDet-like detector ----------------------------------------------------------------------------------

def es_block(g: G, x: str, cin: int, cout: int, s: int) -> str:
    """ESNet-like unit: 1x1 -> depthwise (SE) -> 1x1; residual at stride 1."""
    mid = cout // 2
    y = g.conv(x, cin, mid, 1, act="hswish")
    y = g.conv(y, mid, mid, 3, s, groups=mid)
    y = g.se(y, mid, mid // 4, "relu", "hsig")
    y = g.conv(y, mid, cout, 1, act="hswish", gain=1.0)
    return g.op("Add", [x, y]) if s == 1 and cin == cout else y


def dws(g: G, x: str, cin: int, cout: int, k: int = 5, s: int = 1) -> str:
    y = g.conv(x, cin, cin, k, s, groups=cin, act="hswish")
    return g.conv(y, cin, cout, 1, act="hswish")


def picodet(size: int = 416) -> onnx.ModelProto:
    g = G(f"picodet_{size}")
    x = g.conv("image", 3, 24, 3, 2, act="hswish")
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # stride 4
    c, feats = 24, []
    for out, reps in ((96, 3), (192, 7), (384, 3)):  # strides 8, 16, 32
        for i in range(reps):
            x = es_block(g, x, c, out, 2 if i == 0 else 1)
            c = out
        feats.append((x, c))
    ch = 96
    c3, c4, c5 = (g.conv(f, cf, ch, 1, act="hswish") for f, cf in feats)
    # top-down
    t4 = dws(g, g.op("Concat", [g.resize(c5, 2), c4], axis=1), 2 * ch, ch)
    t3 = dws(g, g.op("Concat", [g.resize(t4, 2), c3], axis=1), 2 * ch, ch)
    # bottom-up
    b4 = dws(g, g.op("Concat", [dws(g, t3, ch, ch, s=2), t4], axis=1), 2 * ch, ch)
    b5 = dws(g, g.op("Concat", [dws(g, b4, ch, ch, s=2), c5], axis=1), 2 * ch, ch)
    b6 = g.op("Add", [dws(g, c5, ch, ch, s=2), dws(g, b5, ch, ch, s=2)])  # extra level, stride 64
    scores, boxes = [], []
    for level in (t3, b4, b5, b6):
        h = level
        for _ in range(4):
            h = dws(g, h, ch, ch)
        cls = g.op("Sigmoid", [g.conv(h, ch, 80, 1, bn=False, gain=1.0)])
        reg = g.conv(h, ch, 32, 1, bn=False, gain=1.0)
        scores.append(g.op("Transpose", [g.op("Reshape", [cls, g.const(np.array([1, 80, -1], np.int64))])],
                           perm=[0, 2, 1]))
        boxes.append(g.op("Transpose", [g.op("Reshape", [reg, g.const(np.array([1, 32, -1], np.int64))])],
                          perm=[0, 2, 1]))
    out = [g.op("Concat", scores, axis=1), g.op("Concat", boxes, axis=1)]
    return g.model([("image", [1, 3, size, size])], out, 14)


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mnv3_small": mnv3_small,
    "effnet_b0": effnet_b0,
    "db_det_640": lambda: db_det(640),
    "rec_svtr": rec_svtr,
    "rec_crnn": rec_crnn,
    "picodet_416": lambda: picodet(416),
}


def check(path: Path) -> tuple[int, list[tuple[int, ...]]]:
    import onnxruntime as ort

    onnx.checker.check_model(str(path), full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.uniform(-1, 1, i.shape).astype(np.float32) for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    for o in outs:
        if not np.isfinite(o).all():
            raise RuntimeError(f"{path.name}: non-finite outputs")
    return len(onnx.load(str(path), load_external_data=False).graph.node), [o.shape for o in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="/tmp/membound")
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(MODELS))
        return 0
    prefixes = [p for p in a.only.split(",") if p]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, build in MODELS.items():
        if prefixes and not any(name.startswith(p) for p in prefixes):
            continue
        path = out / f"{name}.onnx"
        try:
            onnx.save(build(), str(path))
            nodes, shapes = check(path)
        except Exception as exc:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"{name:14s} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        print(f"{name:14s} {os.path.getsize(path) / 2**20:6.1f} MB  {nodes:4d} nodes  outputs {shapes}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
