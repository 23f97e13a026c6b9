#!/usr/bin/env python3
"""A corpus of memory-bound CNNs *exported by real exporters* (tf2onnx from Keras, torch.onnx.export with the
TorchScript and the dynamo exporter, paddle2onnx): the forms users get, beside the hand-built ones of
``corpora/membound.py``. Random weights (a fixed seed per model; BatchNorm statistics randomized so that no
BN is an identity), batch 1, float32, static realistic input sizes; nothing is downloaded.

Each exporter lives in its own environment (none is a dependency of onnxfuse). The recipes used::

    # TensorFlow (tf2onnx): TF 2.21 / Keras 3.15 / tf2onnx 1.17 / onnx 1.23
    python3.11 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    # torch + torchvision (x86_64: the only pair that imports together here; ~5.6 GB venv)
    python3.11 -m venv /tmp/tvv && /tmp/tvv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript \\
        onnxruntime
    # Paddle: paddlepaddle 3.3.1 / paddle2onnx 2.1.0
    python3.11 -m venv /tmp/pdv && /tmp/pdv/bin/pip install paddlepaddle paddle2onnx packaging

Usage::

    # everything: each exporter in its venv, then onnx.checker + one onnxruntime CPU run here
    python -m corpora.membound_exports /tmp/membound_x --python-tf /tmp/tfvenv/bin/python \\
        --python-torch /tmp/tvv/bin/python --python-paddle /tmp/pdv/bin/python
    # or one exporter, run with that venv's python (checks run when onnxruntime imports there)
    /tmp/tvv/bin/python -m corpora.membound_exports /tmp/membound_x --exporter torch
    python -m corpora.membound_exports /tmp/membound_x --check     # check what is there
    python -m corpora.membound_exports --list

============================== ==============================================================================
keras_effnetb0_224_tf17        keras.applications.EfficientNetB0 (weights=None), 224x224 NHWC; tf2onnx opset 17
keras_mnv3large_224_tf17       keras.applications.MobileNetV3Large, 224x224 NHWC; tf2onnx opset 17
keras_mnv3small_224_tf13       keras.applications.MobileNetV3Small, 224x224 NHWC; tf2onnx opset 13 (no HardSwish op)
keras_unet_256_tf17            a light Keras UNet: SeparableConv2D+BN+ReLU encoder (MaxPool), decoder with
                               Conv2DTranspose (2 levels) and UpSampling2D nearest (2 levels), skip Concats,
                               1x1 head + sigmoid; 256x256x3; tf2onnx opset 17
tv_mnv3large_224_ts17          torchvision mobilenet_v3_large, 224x224; TorchScript exporter opset 17
tv_mnv3large_224_dynamo18      the same net with the dynamo exporter (torch.export + onnxscript), opset 18
tv_effnetb0_224_ts17           torchvision efficientnet_b0 (SiLU, SE), 224x224; TorchScript opset 17
tv_lraspp_mnv3_512_ts17        torchvision lraspp_mobilenet_v3_large (21 classes; bilinear Resize, SE-style
                               scale branch), 512x512; TorchScript opset 17
tv_ssdlite_mnv3_320_ts17       torchvision ssdlite320_mobilenet_v3_large: backbone + extra layers + SSDLite
                               head (raw box regression and class logits, no NMS), 320x320; TorchScript opset 17
torch_crnn_48x320_ts17         CRNN recognizer in plain torch (PP-OCRv2-rec-like): MobileNetV3-style blocks with
                               (2,1) strides, Hardswish/SE/Hardsigmoid, height pooled, 2-layer BiLSTM 96,
                               CTC Linear to 6625 + Softmax; 48x320; TorchScript opset 17
torch_yolov8n_640_ts17         YOLOv8n's published architecture in plain torch (C2f with Split and Concat, SPPF,
                               PAN neck with nearest upsampling, decoupled head; raw [1, 144, 8400] outputs, no
                               DFL decoding or NMS), 640x640; TorchScript opset 17
pd_ppocr_rec_48x320_p2o14      PP-OCRv3-rec-like in paddle.nn: PP-LCNet x0.5 backbone (HardSwish, SE with
                               Hardsigmoid, 5x5 depthwise, (2,1) strides), 2 SVTR-style transformer blocks over
                               the width (dim 120, Swish MLP), CTC FC 6625 + Softmax; paddle2onnx opset 14
pd_mnv3small_224_p2o14         paddle.vision.models.mobilenet_v3_small, 224x224; paddle2onnx opset 14
============================== ==============================================================================

Every model is checked with ``onnx.checker`` and one onnxruntime CPU run (outputs finite, not constant); its
size, node count, opset and op histogram are printed. An export that fails is reported in one line and left
out. Then: ``python -m benchmarks.headroom_table /tmp/membound_x/*.onnx`` and
``python -m benchmarks.nchwc_breakers /tmp/membound_x/*.onnx``.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) % (2**31)


# -- tf2onnx (Keras) ----------------------------------------------------------------------------------------


def _keras_randomize_bn(model, seed: int) -> None:
    import keras
    import numpy as np

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.6, 1.2, c).astype("float32"))
            layer.beta.assign(rng.normal(0, 0.1, c).astype("float32"))
            layer.moving_mean.assign(rng.normal(0, 0.1, c).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.6, 1.4, c).astype("float32"))


def _keras_unet(size: int = 256):
    import keras
    from keras import layers as L

    def block(x, c, sep=True):
        for _ in range(2):
            conv = L.SeparableConv2D(c, 3, padding="same", use_bias=False) if sep else \
                L.Conv2D(c, 3, padding="same", use_bias=False)
            x = L.ReLU()(L.BatchNormalization()(conv(x)))
        return x

    inp = keras.Input((size, size, 3), batch_size=1, name="image")
    skips = []
    x = block(inp, 16, sep=False)
    for c in (32, 64, 128, 256):
        skips.append(x)
        x = block(L.MaxPooling2D(2)(x), c)
    for i, c in enumerate((128, 64, 32, 16)):
        if i < 2:
            x = L.Conv2DTranspose(c, 2, strides=2)(x)
        else:
            x = L.Conv2D(c, 1, use_bias=False)(L.UpSampling2D(2, interpolation="nearest")(x))
        x = block(L.Concatenate()([x, skips.pop()]), c)
    out = L.Conv2D(1, 1, activation="sigmoid", name="mask")(x)
    return keras.Model(inp, out)


def stable_names(path: Path) -> None:
    """tf2onnx's generated names (``Conv__1361``, ``const_fold_opt__28__29``) carry counters that differ from one
    process to the next: rename each such name to its stem and its order of first appearance
    (``Conv__17``), name the small initializers ``const__N`` the same way, and sort the initializers by name,
    so that the same model is written byte for byte alike.
    Nothing but names and initializer order changes."""
    import re

    import onnx

    m = onnx.load(str(path))
    g = m.graph
    pat = re.compile(r"__\d+")
    new: dict[str, str] = {}

    small = {t.name for t in g.initializer if math.prod(t.dims) <= 64}  # deduplicated constants: which name
    # tf2onnx keeps for 3.0 or a Reshape target varies too, so these are named by first use only

    def see(name: str) -> None:
        if name in small and name not in new:
            new[name] = f"const__{len(new) + 1}"
        elif pat.search(name) and name not in new:
            new[name] = f"{pat.sub('', name)}__{len(new) + 1}"

    def sub(name: str) -> str:
        return new.get(name, name)

    for n in g.node:
        for x in (n.name, *n.input, *n.output):
            see(x)
    for x in sorted(t.name for t in g.initializer):  # unused ones, if any, last
        see(x)
    for n in g.node:
        n.name = sub(n.name)
        n.input[:] = [sub(x) for x in n.input]
        n.output[:] = [sub(x) for x in n.output]
    inits = sorted(g.initializer, key=lambda t: sub(t.name))
    for t in inits:
        t.name = sub(t.name)
    del g.initializer[:]
    g.initializer.extend(inits)
    for v in (*g.input, *g.output, *g.value_info):
        v.name = sub(v.name)
    onnx.save(m, str(path))


def export_keras(name: str, path: Path) -> None:
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(seed_of(name))
    apps = keras.applications
    opset = 13 if name.endswith("tf13") else 17
    if name.startswith("keras_effnetb0"):
        m = apps.EfficientNetB0(weights=None, input_shape=(224, 224, 3))
    elif name.startswith("keras_mnv3large"):
        m = apps.MobileNetV3Large(weights=None, input_shape=(224, 224, 3))
    elif name.startswith("keras_mnv3small"):
        m = apps.MobileNetV3Small(weights=None, input_shape=(224, 224, 3))
    elif name.startswith("keras_unet"):
        m = _keras_unet(256)
    else:
        raise KeyError(name)
    _keras_randomize_bn(m, seed_of(name) + 1)
    hw = m.inputs[0].shape[1:3]
    spec = (tf.TensorSpec((1, *hw, 3), tf.float32, name="image"),)
    tf2onnx.convert.from_keras(m, input_signature=spec, opset=opset, output_path=str(path))
    stable_names(path)


# -- torch.onnx.export (torchvision and plain torch) --------------------------------------------------------


def _torch_randomize_bn(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(torch.rand(c, generator=g) * 0.6 + 0.6)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) * 0.8 + 0.6)


def _torch_crnn():
    import torch
    from torch import nn

    class SE(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

        def forward(self, x):
            return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(self.pool(x)))))

    def cbn(cin, cout, k=1, s=1, g=1, act=True):
        mods = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=g, bias=False), nn.BatchNorm2d(cout)]
        return mods + ([nn.Hardswish()] if act else [])

    class Block(nn.Module):
        def __init__(self, cin, exp, cout, k, s, se):
            super().__init__()
            mods = cbn(cin, exp) + cbn(exp, exp, k, s, exp) + ([SE(exp)] if se else []) + cbn(exp, cout, act=False)
            self.body = nn.Sequential(*mods)
            self.res = s == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.res else y

    # (cin, exp, cout, k, stride, se): MobileNetV3-small-like, strides (2,1) after the stem as PP-OCR rec does
    cfg = [(16, 16, 16, 3, (2, 1), True), (16, 72, 24, 3, (2, 1), False), (24, 88, 24, 3, 1, False),
           (24, 96, 40, 5, (2, 1), True), (40, 240, 40, 5, 1, True), (40, 240, 40, 5, 1, True),
           (40, 120, 48, 5, 1, True), (48, 144, 48, 5, 1, True), (48, 288, 96, 5, (2, 1), True),
           (96, 576, 96, 5, 1, True), (96, 576, 96, 5, 1, True)]

    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(*cbn(3, 16, 3, 2))
            self.blocks = nn.Sequential(*[Block(*c) for c in cfg])
            self.last = nn.Sequential(*cbn(96, 288))
            self.pool = nn.MaxPool2d(2, 2)
            self.lstm = nn.LSTM(288, 96, num_layers=2, bidirectional=True, batch_first=True)
            self.fc = nn.Linear(192, 6625)

        def forward(self, x):
            x = self.pool(self.last(self.blocks(self.stem(x))))  # [1, 288, 1, 80]
            x = x.squeeze(2).permute(0, 2, 1)
            x, _ = self.lstm(x)
            return torch.softmax(self.fc(x), dim=2)

    return CRNN()


def _torch_yolov8n():
    """YOLOv8n's published architecture (width 0.25, depth 0.33) in plain torch: Conv = Conv2d + BN + SiLU, C2f
    (Split, bottlenecks, Concat, 1x1 Conv), SPPF (three 5x5 MaxPools, Concat of four), a PAN neck with nearest
    upsampling and Concats, the decoupled head (box 64 and class 80 channels per level, concatenated and
    flattened: the raw outputs, no DFL decoding or NMS)."""
    import torch
    from torch import nn

    class Conv(nn.Module):
        def __init__(self, cin, cout, k=1, s=1):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            return nn.functional.silu(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c, shortcut):
            super().__init__()
            self.cv1, self.cv2, self.add = Conv(c, c, 3), Conv(c, c, 3), shortcut

        def forward(self, x):
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        def __init__(self, cin, cout, n, shortcut):
            super().__init__()
            self.c = cout // 2
            self.cv1, self.cv2 = Conv(cin, 2 * self.c), Conv((2 + n) * self.c, cout)
            self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            y.extend(m(y[-1]) for m in self.m)
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.cv1, self.cv2 = Conv(cin, cin // 2), Conv(cin // 2 * 4, cout)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            y = [self.cv1(x)]
            y.extend(self.m(y[-1]) for _ in range(3))
            return self.cv2(torch.cat(y, 1))

    class Yolo(nn.Module):
        def __init__(self, nc=80):
            super().__init__()
            self.b1 = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32, 1, True), Conv(32, 64, 3, 2),
                                    C2f(64, 64, 2, True))
            self.b2 = nn.Sequential(Conv(64, 128, 3, 2), C2f(128, 128, 2, True))
            self.b3 = nn.Sequential(Conv(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.h12, self.h15 = C2f(384, 128, 1, False), C2f(192, 64, 1, False)
            self.d16, self.h18 = Conv(64, 64, 3, 2), C2f(192, 128, 1, False)
            self.d19, self.h21 = Conv(128, 128, 3, 2), C2f(384, 256, 1, False)
            self.box = nn.ModuleList(nn.Sequential(Conv(c, 64, 3), Conv(64, 64, 3), nn.Conv2d(64, 64, 1))
                                     for c in (64, 128, 256))
            self.cls = nn.ModuleList(nn.Sequential(Conv(c, 80, 3), Conv(80, 80, 3), nn.Conv2d(80, nc, 1))
                                     for c in (64, 128, 256))
            self.no = nc + 64

        def forward(self, x):
            p3 = self.b1(x)
            p4 = self.b2(p3)
            p5 = self.b3(p4)
            h12 = self.h12(torch.cat([self.up(p5), p4], 1))
            h15 = self.h15(torch.cat([self.up(h12), p3], 1))
            h18 = self.h18(torch.cat([self.d16(h15), h12], 1))
            h21 = self.h21(torch.cat([self.d19(h18), p5], 1))
            outs = [torch.cat([b(f), c(f)], 1) for f, b, c in zip((h15, h18, h21), self.box, self.cls, strict=True)]
            return torch.cat([o.flatten(2) for o in outs], 2)  # [1, 144, 8400] at 640x640

    return Yolo()


def export_torch(name: str, path: Path) -> None:
    import torch
    import torchvision.models as tvm
    from torchvision.models import detection, segmentation

    torch.manual_seed(seed_of(name))
    size = 224
    if name.startswith("tv_mnv3large"):
        m = tvm.mobilenet_v3_large(weights=None)
    elif name.startswith("tv_effnetb0"):
        m = tvm.efficientnet_b0(weights=None)
    elif name.startswith("tv_lraspp"):
        size = 512
        net = segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)

        class Seg(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x)["out"]

        m = Seg()
    elif name.startswith("tv_ssdlite"):
        size = 320
        det = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)

        class Raw(torch.nn.Module):  # backbone + extras + head; anchors, decoding and NMS stay outside
            def __init__(self):
                super().__init__()
                self.backbone, self.head = det.backbone, det.head

            def forward(self, x):
                out = self.head(list(self.backbone(x).values()))
                return out["bbox_regression"], out["cls_logits"]

        m = Raw()
    elif name.startswith("torch_crnn"):
        m = _torch_crnn()
    elif name.startswith("torch_yolov8n"):
        size = 640
        m = _torch_yolov8n()
    else:
        raise KeyError(name)
    m.eval()
    _torch_randomize_bn(m, seed_of(name) + 1)
    shape = (1, 3, 48, 320) if name.startswith("torch_crnn") else (1, 3, size, size)
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    n_out = 2 if name.startswith("tv_ssdlite") else 1
    out_names = ["bbox_regression", "cls_logits"] if n_out == 2 else ["output"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if "dynamo" in name:
            prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=18, input_names=["image"],
                                     output_names=out_names, external_data=False)
            prog.save(str(path), external_data=False)
        else:
            torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17, input_names=["image"],
                              output_names=out_names, do_constant_folding=True)


# -- paddle2onnx ---------------------------------------------------------------------------------------------


def _paddle_rec():
    import paddle
    from paddle import nn

    class ConvBN(nn.Layer):
        def __init__(self, cin, cout, k, s, g=1, act=True):
            super().__init__()
            self.conv = nn.Conv2D(cin, cout, k, s, (k - 1) // 2, groups=g, bias_attr=False)
            self.bn = nn.BatchNorm2D(cout)
            self.act = nn.Hardswish() if act else None

        def forward(self, x):
            x = self.bn(self.conv(x))
            return self.act(x) if self.act is not None else x

    class SE(nn.Layer):
        def __init__(self, c):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2D(1)
            self.conv1, self.conv2 = nn.Conv2D(c, c // 4, 1), nn.Conv2D(c // 4, c, 1)
            self.relu, self.hsig = nn.ReLU(), nn.Hardsigmoid()

        def forward(self, x):
            return x * self.hsig(self.conv2(self.relu(self.conv1(self.pool(x)))))

    class DWSep(nn.Layer):
        def __init__(self, cin, cout, k, s, se):
            super().__init__()
            self.dw = ConvBN(cin, cin, k, s, cin)
            self.se = SE(cin) if se else None
            self.pw = ConvBN(cin, cout, 1, 1)

        def forward(self, x):
            x = self.dw(x)
            if self.se is not None:
                x = self.se(x)
            return self.pw(x)

    class Block(nn.Layer):  # an SVTR mixing block: pre-norm attention + Swish MLP
        def __init__(self, dim=120, heads=8):
            super().__init__()
            self.heads, self.hd = heads, dim // heads
            self.n1, self.n2 = nn.LayerNorm(dim, epsilon=1e-6), nn.LayerNorm(dim, epsilon=1e-6)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2, self.act = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim), nn.Swish()

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(self.n1(x)).reshape([b, n, 3, self.heads, self.hd]).transpose([2, 0, 3, 1, 4])
            q, k, v = qkv[0] * (self.hd ** -0.5), qkv[1], qkv[2]
            a = nn.functional.softmax(paddle.matmul(q, k, transpose_y=True), axis=-1)
            x = x + self.proj(paddle.matmul(a, v).transpose([0, 2, 1, 3]).reshape([b, n, c]))
            return x + self.fc2(self.act(self.fc1(self.n2(x))))

    # PP-LCNet x0.5 as PP-OCRv3 rec configures it: (k, cin, cout, stride, se)
    cfg = [(3, 16, 32, 1, False), (3, 32, 64, (2, 1), False), (3, 64, 64, 1, False),
           (3, 64, 128, (2, 1), False), (3, 128, 128, 1, False), (3, 128, 256, (1, 2), False)]
    cfg += [(5, 256, 256, 1, False)] * 5 + [(5, 256, 512, (2, 1), True), (5, 512, 512, 1, True)]

    class Rec(nn.Layer):
        def __init__(self):
            super().__init__()
            self.stem = ConvBN(3, 16, 3, 2)
            self.blocks = nn.Sequential(*[DWSep(ci, co, k, s, se) for k, ci, co, s, se in cfg])
            self.pool = nn.AvgPool2D([3, 2], [3, 2])
            self.reduce = ConvBN(512, 120, 1, 1)
            self.mix = nn.Sequential(Block(), Block())
            self.norm = nn.LayerNorm(120, epsilon=1e-6)
            self.fc = nn.Linear(120, 6625)

        def forward(self, x):
            x = self.reduce(self.pool(self.blocks(self.stem(x))))  # [1, 120, 1, 40]
            x = x.squeeze(2).transpose([0, 2, 1])
            x = self.norm(self.mix(x))
            return nn.functional.softmax(self.fc(x), axis=2)

    return Rec()


def export_paddle(name: str, path: Path) -> None:
    import tempfile

    import numpy as np
    import paddle
    import paddle2onnx

    paddle.seed(seed_of(name))
    if name.startswith("pd_ppocr_rec"):
        m, shape = _paddle_rec(), [1, 3, 48, 320]
    elif name.startswith("pd_mnv3small"):
        m, shape = paddle.vision.models.mobilenet_v3_small(pretrained=False), [1, 3, 224, 224]
    else:
        raise KeyError(name)
    rng = np.random.default_rng(seed_of(name) + 1)
    for layer in m.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            c = layer.weight.shape[0]
            layer.weight.set_value(rng.uniform(0.6, 1.2, c).astype("float32"))
            layer.bias.set_value(rng.normal(0, 0.1, c).astype("float32"))
            layer._mean.set_value(rng.normal(0, 0.1, c).astype("float32"))
            layer._variance.set_value(rng.uniform(0.6, 1.4, c).astype("float32"))
    m.eval()
    with tempfile.TemporaryDirectory(prefix="p2o-") as tmp:
        prefix = os.path.join(tmp, "model")
        paddle.jit.save(m, prefix, input_spec=[paddle.static.InputSpec(shape, "float32", "image")])
        graph = prefix + (".json" if os.path.exists(prefix + ".json") else ".pdmodel")
        paddle2onnx.export(graph, prefix + ".pdiparams", str(path), opset_version=14)


MODELS: dict[str, str] = {
    "keras_effnetb0_224_tf17": "tf", "keras_mnv3large_224_tf17": "tf", "keras_mnv3small_224_tf13": "tf",
    "keras_unet_256_tf17": "tf",
    "tv_mnv3large_224_ts17": "torch", "tv_mnv3large_224_dynamo18": "torch", "tv_effnetb0_224_ts17": "torch",
    "tv_lraspp_mnv3_512_ts17": "torch", "tv_ssdlite_mnv3_320_ts17": "torch", "torch_crnn_48x320_ts17": "torch",
    "torch_yolov8n_640_ts17": "torch",
    "pd_ppocr_rec_48x320_p2o14": "paddle", "pd_mnv3small_224_p2o14": "paddle",
}
EXPORT = {"tf": export_keras, "torch": export_torch, "paddle": export_paddle}


def check(path: Path) -> str:
    """onnx.checker, one onnxruntime CPU run on uniform [0, 1) inputs (outputs finite, not constant); one line."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.random(i.shape, dtype=np.float32) for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    for o in outs:
        if not np.isfinite(o).all() or float(np.std(o)) == 0.0:
            raise ValueError(f"output {o.shape} is not finite or constant")
    hist = collections.Counter(n.op_type for n in m.graph.node)
    ops = " ".join(f"{k}:{v}" for k, v in hist.most_common(10))
    ins = ",".join("x".join(map(str, i.shape)) for i in sess.get_inputs())
    return (f"{path.stem:28s} {path.stat().st_size / 2**20:5.1f} MB {len(m.graph.node):4d} nodes opset {opset:2d} "
            f"in {ins} out {[o.shape for o in outs]}\n{'':28s} {ops}")


def can_check() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="/tmp/membound_x")
    ap.add_argument("--exporter", choices=["tf", "torch", "paddle"], help="export only these, in this python")
    ap.add_argument("--python-tf", help="python of an environment with tensorflow + tf2onnx")
    ap.add_argument("--python-torch", help="python of an environment with torch + torchvision + onnxscript")
    ap.add_argument("--python-paddle", help="python of an environment with paddlepaddle + paddle2onnx")
    ap.add_argument("--only", default="", help="comma-separated name prefixes")
    ap.add_argument("--check", action="store_true", help="only check the files already in OUT")
    ap.add_argument("--no-check", action="store_true", help="export only (the driver checks afterwards)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(f"{n:28s} {e}" for n, e in MODELS.items()))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prefixes = [p for p in a.only.split(",") if p]
    names = [n for n in MODELS if not prefixes or any(n.startswith(p) for p in prefixes)]
    failed = 0
    if a.exporter:  # export here, in this python
        for name in (n for n in names if MODELS[n] == a.exporter):
            path = out / f"{name}.onnx"
            try:
                EXPORT[a.exporter](name, path)
                print(f"exported {path}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and go on
                failed += 1
                print(f"{name} FAILED export: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
    elif not a.check:  # each exporter in its own python
        pythons = {"tf": a.python_tf, "torch": a.python_torch, "paddle": a.python_paddle}
        for exp, py in pythons.items():
            todo = [n for n in names if MODELS[n] == exp]
            if not todo:
                continue
            if not py:
                print(f"skipped {exp} exports (no --python-{exp}): {', '.join(todo)}")
                continue
            cmd = [py, __file__, str(out), "--exporter", exp, "--only", ",".join(todo), "--no-check"]
            failed += subprocess.run(cmd, check=False).returncode != 0
    if a.no_check:
        return 1 if failed else 0
    if not can_check():
        print(f"onnxruntime is not importable here: run `python {__file__} {out} --check` elsewhere")
        return 1 if failed else 0
    for name in names:
        path = out / f"{name}.onnx"
        if not path.exists():
            continue
        try:
            print(check(path), flush=True)
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"{name} FAILED check: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
