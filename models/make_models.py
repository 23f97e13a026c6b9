#!/usr/bin/env python3
"""Generate small, deterministic sample ONNX models used as fusion targets.

Usage::

    python models/make_models.py [OUTPUT_DIR]

By default the models are written next to this script (the ``models/`` folder).
Only ``onnx.helper`` and numpy are used; every random tensor comes from a
seeded generator, so repeated runs produce byte-identical files.

Models written:

* ``cnn_small.onnx``         (opset 13) Conv + BN/activation patterns, residual, Gemm head.
* ``transformer_small.onnx`` (opset 17) one BERT-like layer in decomposed TorchScript form.
* ``transformer_op18.onnx``  (opset 18) pre-LN block, opset-18 ReduceMean, tanh-Gelu, RMSNorm, SiLU.
* ``if_subgraph.onnx``       (opset 15) If node whose branches use outer-scope initializers.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 0
PRODUCER = "onnxfuse-make_models"
PRODUCER_VERSION = "1.0"


# --------------------------------------------------------------------------- #
# Small graph-building helper
# --------------------------------------------------------------------------- #
class GraphBuilder:
    """Accumulates nodes and initializers with exporter-style names."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._init_names: set[str] = set()

    # -- tensors ------------------------------------------------------------
    def init(self, name: str, array: np.ndarray) -> str:
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name}")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def scalar(self, name: str, value: float, dtype=np.float32) -> str:
        return self.init(name, np.array(value, dtype=dtype))

    def ints(self, name: str, values) -> str:
        return self.init(name, np.array(values, dtype=np.int64))

    def randn(self, name: str, shape, std: float = 1.0, mean: float = 0.0) -> str:
        arr = (self.rng.standard_normal(shape) * std + mean).astype(np.float32)
        return self.init(name, arr)

    def uniform(self, name: str, shape, low: float, high: float) -> str:
        return self.init(name, self.rng.uniform(low, high, shape).astype(np.float32))

    # -- nodes --------------------------------------------------------------
    def node(self, op_type: str, inputs, name: str, n_out: int = 1, outputs=None, **attrs):
        """Add a node named ``name``; outputs default to ``{name}_output_{i}``."""
        if outputs is None:
            outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def constant(self, name: str, value, dtype=np.float32) -> str:
        """A ``Constant`` node (as the TorchScript exporter emits)."""
        tensor = numpy_helper.from_array(np.array(value, dtype=dtype), name=f"{name}_value")
        return self.node("Constant", [], name, value=tensor)

    # -- composite helpers --------------------------------------------------
    def conv(
        self, x: str, prefix: str, cin: int, cout: int, k: int = 3, stride: int = 1, bias: bool = True
    ) -> str:
        fan_in = cin * k * k
        w = self.randn(f"{prefix}.weight", (cout, cin, k, k), std=math.sqrt(2.0 / fan_in))
        inputs = [x, w]
        if bias:
            inputs.append(self.randn(f"{prefix}.bias", (cout,), std=0.1))
        pad = k // 2
        return self.node(
            "Conv",
            inputs,
            f"/{prefix.replace('.', '/')}/Conv",
            dilations=[1, 1],
            group=1,
            kernel_shape=[k, k],
            pads=[pad, pad, pad, pad],
            strides=[stride, stride],
        )

    def bn_params(self, prefix: str, c: int) -> list[str]:
        return [
            self.uniform(f"{prefix}.weight", (c,), 0.5, 1.5),
            self.randn(f"{prefix}.bias", (c,), std=0.1),
            self.randn(f"{prefix}.running_mean", (c,), std=0.1),
            self.uniform(f"{prefix}.running_var", (c,), 0.5, 1.5),
        ]

    def batchnorm(self, x: str, prefix: str, c: int) -> str:
        return self.node(
            "BatchNormalization",
            [x, *self.bn_params(prefix, c)],
            f"/{prefix.replace('.', '/')}/BatchNormalization",
            epsilon=1e-5,
            momentum=0.9,
        )

    def linear(self, x: str, prefix: str, din: int, dout: int, bias: bool = True) -> str:
        """torch.nn.Linear as exported for 3-D inputs: MatMul (+ Add)."""
        path = "/" + prefix.replace(".", "/")
        w = self.randn(f"onnx::MatMul_{prefix}.weight", (din, dout), std=1.0 / math.sqrt(din))
        y = self.node("MatMul", [x, w], f"{path}/MatMul")
        if bias:
            b = self.randn(f"{prefix}.bias", (dout,), std=0.02)
            y = self.node("Add", [b, y], f"{path}/Add")
        return y


def _finish(
    builder: GraphBuilder,
    graph_name: str,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    opset: int,
    doc: str,
) -> onnx.ModelProto:
    graph = helper.make_graph(builder.nodes, graph_name, inputs, outputs, initializer=builder.initializers)
    opset_imports = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        graph,
        opset_imports=opset_imports,
        producer_name=PRODUCER,
        producer_version=PRODUCER_VERSION,
        doc_string=doc,
    )
    # Smallest IR version that supports the opset: keeps models loadable by older runtimes.
    model.ir_version = helper.find_min_ir_version_for(opset_imports)
    return model


# --------------------------------------------------------------------------- #
# 1. Small CNN (opset 13)
# --------------------------------------------------------------------------- #
def make_cnn_small(rng: np.random.Generator) -> onnx.ModelProto:
    b = GraphBuilder(rng)
    x = "x"

    # layer1: Conv + BatchNormalization + Relu                      3x32x32 -> 8x32x32
    h = b.conv(x, "layer1.conv", 3, 8)
    h = b.batchnorm(h, "layer1.bn", 8)
    h = b.node("Relu", [h], "/layer1/relu/Relu")

    # layer2: Conv + BN + HardSwish decomposed as x * Clip(x + 3, 0, 6) / 6   -> 16x16x16
    h = b.conv(h, "layer2.conv", 8, 16, stride=2)
    h = b.batchnorm(h, "layer2.bn", 16)
    three = b.constant("/layer2/act/Constant", 3.0)
    t = b.node("Add", [h, three], "/layer2/act/Add")
    cmin = b.constant("/layer2/act/Constant_1", 0.0)
    cmax = b.constant("/layer2/act/Constant_2", 6.0)
    t = b.node("Clip", [t, cmin, cmax], "/layer2/act/Clip")
    t = b.node("Mul", [h, t], "/layer2/act/Mul")
    six = b.constant("/layer2/act/Constant_3", 6.0)
    h = b.node("Div", [t, six], "/layer2/act/Div")

    # layer3: Conv + BN + HardSigmoid op
    h = b.conv(h, "layer3.conv", 16, 16)
    h = b.batchnorm(h, "layer3.bn", 16)
    h = b.node("HardSigmoid", [h], "/layer3/act/HardSigmoid", alpha=1.0 / 6.0, beta=0.5)

    # layer4: Conv + Sigmoid
    h = b.conv(h, "layer4.conv", 16, 16)
    h = b.node("Sigmoid", [h], "/layer4/act/Sigmoid")

    # layer5: Conv + LeakyRelu(0.1)
    h = b.conv(h, "layer5.conv", 16, 16)
    h = b.node("LeakyRelu", [h], "/layer5/act/LeakyRelu", alpha=0.1)

    # layer6: Conv without bias followed by Add of a per-channel [1,C,1,1] constant
    h = b.conv(h, "layer6.conv", 16, 16, bias=False)
    cbias = b.randn("layer6.bias", (1, 16, 1, 1), std=0.1)
    h = b.node("Add", [h, cbias], "/layer6/Add")

    # layer7: residual block  relu(x + conv2(relu(conv1(x))))
    block_in = h
    r = b.conv(block_in, "layer7.conv1", 16, 16)
    r = b.node("Relu", [r], "/layer7/relu/Relu")
    r = b.conv(r, "layer7.conv2", 16, 16)
    r = b.node("Add", [r, block_in], "/layer7/Add")
    h = b.node("Relu", [r], "/layer7/relu_1/Relu")

    # layer8: Conv + Tanh                                            -> 16x8x8
    h = b.conv(h, "layer8.conv", 16, 16, stride=2)
    h = b.node("Tanh", [h], "/layer8/act/Tanh")

    # layer9: Conv + Clip(0, 6)  (Relu6, min/max as initializer inputs)
    h = b.conv(h, "layer9.conv", 16, 32)
    r6min = b.scalar("/layer9/act/Clip_min", 0.0)
    r6max = b.scalar("/layer9/act/Clip_max", 6.0)
    h = b.node("Clip", [h, r6min, r6max], "/layer9/act/Clip")

    # head: GlobalAveragePool, Flatten, Gemm(transB) + Relu, Gemm
    h = b.node("GlobalAveragePool", [h], "/pool/GlobalAveragePool")
    h = b.node("Flatten", [h], "/flatten/Flatten", axis=1)
    w1 = b.randn("fc1.weight", (64, 32), std=math.sqrt(2.0 / 32))
    b1 = b.randn("fc1.bias", (64,), std=0.1)
    h = b.node("Gemm", [h, w1, b1], "/fc1/Gemm", alpha=1.0, beta=1.0, transB=1)
    h = b.node("Relu", [h], "/relu/Relu")
    w2 = b.randn("fc2.weight", (10, 64), std=math.sqrt(1.0 / 64))
    b2 = b.randn("fc2.bias", (10,), std=0.1)
    b.node("Gemm", [h, w2, b2], "/fc2/Gemm", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)

    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])]
    return _finish(
        b, "cnn_small", inputs, outputs, 13, "Small CNN covering Conv+BN+activation fusion targets."
    )


# --------------------------------------------------------------------------- #
# Transformer helpers
# --------------------------------------------------------------------------- #
HIDDEN = 32
HEADS = 2
HEAD_DIM = HIDDEN // HEADS
FFN = 4 * HIDDEN
VOCAB = 100
MAX_POS = 64


def layernorm_op17(b: GraphBuilder, x: str, prefix: str, eps: float = 1e-12) -> str:
    """TorchScript-style decomposed LayerNorm; ReduceMean axes as attribute."""
    p = "/" + prefix.replace(".", "/")
    mean = b.node("ReduceMean", [x], f"{p}/ReduceMean", axes=[-1], keepdims=1)
    d = b.node("Sub", [x, mean], f"{p}/Sub")
    two = b.constant(f"{p}/Constant", 2.0)
    sq = b.node("Pow", [d, two], f"{p}/Pow")
    var = b.node("ReduceMean", [sq], f"{p}/ReduceMean_1", axes=[-1], keepdims=1)
    eps_c = b.constant(f"{p}/Constant_1", eps)
    v = b.node("Add", [var, eps_c], f"{p}/Add")
    std = b.node("Sqrt", [v], f"{p}/Sqrt")
    n = b.node("Div", [d, std], f"{p}/Div")
    gamma = b.uniform(f"{prefix}.weight", (HIDDEN,), 0.8, 1.2)
    beta = b.randn(f"{prefix}.bias", (HIDDEN,), std=0.05)
    n = b.node("Mul", [n, gamma], f"{p}/Mul")
    return b.node("Add", [n, beta], f"{p}/Add_1")


def layernorm_op18(b: GraphBuilder, x: str, prefix: str, axes: str, eps: float = 1e-5) -> str:
    """Decomposed LayerNorm, opset-18 ReduceMean (axes input), x*x squares, Reciprocal+Mul."""
    p = "/" + prefix.replace(".", "/")
    mean = b.node("ReduceMean", [x, axes], f"{p}/ReduceMean", keepdims=1)
    d = b.node("Sub", [x, mean], f"{p}/Sub")
    sq = b.node("Mul", [d, d], f"{p}/Mul")
    var = b.node("ReduceMean", [sq, axes], f"{p}/ReduceMean_1", keepdims=1)
    eps_c = b.scalar(f"{p}/eps", eps)
    v = b.node("Add", [var, eps_c], f"{p}/Add")
    std = b.node("Sqrt", [v], f"{p}/Sqrt")
    inv = b.node("Reciprocal", [std], f"{p}/Reciprocal")
    n = b.node("Mul", [d, inv], f"{p}/Mul_1")
    gamma = b.uniform(f"{prefix}.weight", (HIDDEN,), 0.8, 1.2)
    beta = b.randn(f"{prefix}.bias", (HIDDEN,), std=0.05)
    n = b.node("Mul", [n, gamma], f"{p}/Mul_2")
    return b.node("Add", [n, beta], f"{p}/Add_1")


def self_attention(b: GraphBuilder, x: str, prefix: str, mask: str | None, scale_by_div: bool) -> str:
    """Multi-head self attention (MatMul+Add projections, Reshape/Transpose head split)."""
    p = "/" + prefix.replace(".", "/")
    split_shape = b.ints(f"{p}/split_heads_shape", [0, 0, HEADS, HEAD_DIM])
    merge_shape = b.ints(f"{p}/merge_heads_shape", [0, 0, HIDDEN])

    def proj(name: str, perm) -> str:
        y = b.linear(x, f"{prefix}.{name}", HIDDEN, HIDDEN)
        y = b.node("Reshape", [y, split_shape], f"{p}/{name}/Reshape")
        return b.node("Transpose", [y], f"{p}/{name}/Transpose", perm=perm)

    q = proj("query", [0, 2, 1, 3])  # [B, H, S, D]
    k = proj("key", [0, 2, 3, 1])  # [B, H, D, S]
    v = proj("value", [0, 2, 1, 3])  # [B, H, S, D]

    scores = b.node("MatMul", [q, k], f"{p}/MatMul")
    if scale_by_div:
        sqrt_d = b.constant(f"{p}/Constant", math.sqrt(HEAD_DIM))
        scores = b.node("Div", [scores, sqrt_d], f"{p}/Div")
    else:
        inv_sqrt_d = b.scalar(f"{p}/scale", 1.0 / math.sqrt(HEAD_DIM))
        scores = b.node("Mul", [scores, inv_sqrt_d], f"{p}/Mul")
    if mask is not None:
        scores = b.node("Add", [scores, mask], f"{p}/Add")
    probs = b.node("Softmax", [scores], f"{p}/Softmax", axis=-1)
    ctx = b.node("MatMul", [probs, v], f"{p}/MatMul_1")
    ctx = b.node("Transpose", [ctx], f"{p}/Transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, merge_shape], f"{p}/Reshape")
    return b.linear(ctx, f"{prefix}.output.dense", HIDDEN, HIDDEN)


# --------------------------------------------------------------------------- #
# 2. BERT-like layer, decomposed, opset 17
# --------------------------------------------------------------------------- #
def make_transformer_small(rng: np.random.Generator) -> onnx.ModelProto:
    b = GraphBuilder(rng)

    # ---- embeddings: word + position, then LayerNorm
    word = b.randn("embeddings.word_embeddings.weight", (VOCAB, HIDDEN), std=0.5)
    pos = b.randn("embeddings.position_embeddings.weight", (MAX_POS, HIDDEN), std=0.1)
    pos_ids = b.init("embeddings.position_ids", np.arange(MAX_POS, dtype=np.int64)[None, :])
    we = b.node("Gather", [word, "input_ids"], "/embeddings/word_embeddings/Gather")
    shape = b.node("Shape", ["input_ids"], "/embeddings/Shape")
    idx1 = b.constant("/embeddings/Constant", 1, dtype=np.int64)
    seq_len = b.node("Gather", [shape, idx1], "/embeddings/Gather", axis=0)
    zero_ax = b.constant("/embeddings/Constant_1", [0], dtype=np.int64)
    seq_1d = b.node("Unsqueeze", [seq_len, zero_ax], "/embeddings/Unsqueeze")
    start = b.constant("/embeddings/Constant_2", [0], dtype=np.int64)
    axes1 = b.constant("/embeddings/Constant_3", [1], dtype=np.int64)
    ids = b.node("Slice", [pos_ids, start, seq_1d, axes1], "/embeddings/Slice")
    pe = b.node("Gather", [pos, ids], "/embeddings/position_embeddings/Gather")
    emb = b.node("Add", [we, pe], "/embeddings/Add")
    h = layernorm_op17(b, emb, "embeddings.LayerNorm")

    # ---- extended attention mask: (1 - mask[:, None, None, :].float()) * -10000
    ax1 = b.constant("/Constant", [1], dtype=np.int64)
    m = b.node("Unsqueeze", ["attention_mask", ax1], "/Unsqueeze")
    ax2 = b.constant("/Constant_1", [2], dtype=np.int64)
    m = b.node("Unsqueeze", [m, ax2], "/Unsqueeze_1")
    m = b.node("Cast", [m], "/Cast", to=TensorProto.FLOAT)
    one = b.constant("/Constant_2", 1.0)
    m = b.node("Sub", [one, m], "/Sub")
    neg = b.constant("/Constant_3", -10000.0)
    mask = b.node("Mul", [m, neg], "/Mul")

    # ---- self attention + residual + LayerNorm
    attn = self_attention(b, h, "encoder.layer.0.attention.self", mask, scale_by_div=True)
    h = b.node("Add", [attn, h], "/encoder/layer.0/attention/output/Add")
    h = layernorm_op17(b, h, "encoder.layer.0.attention.output.LayerNorm")

    # ---- FFN with erf Gelu: x * 0.5 * (1 + erf(x / sqrt(2)))
    f = b.linear(h, "encoder.layer.0.intermediate.dense", HIDDEN, FFN)
    gp = "/encoder/layer.0/intermediate/intermediate_act_fn"
    sqrt2 = b.constant(f"{gp}/Constant", 1.4142135)
    t = b.node("Div", [f, sqrt2], f"{gp}/Div")
    t = b.node("Erf", [t], f"{gp}/Erf")
    c1 = b.constant(f"{gp}/Constant_1", 1.0)
    t = b.node("Add", [t, c1], f"{gp}/Add")
    t = b.node("Mul", [f, t], f"{gp}/Mul")
    c05 = b.constant(f"{gp}/Constant_2", 0.5)
    g = b.node("Mul", [t, c05], f"{gp}/Mul_1")
    f = b.linear(g, "encoder.layer.0.output.dense", FFN, HIDDEN)
    h = b.node("Add", [f, h], "/encoder/layer.0/output/Add")
    h = layernorm_op17(b, h, "encoder.layer.0.output.LayerNorm")
    b.node("Identity", [h], "/Identity", outputs=["last_hidden_state"])

    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    ]
    return _finish(
        b,
        "transformer_small",
        inputs,
        outputs,
        17,
        "One BERT-like layer in decomposed TorchScript-exporter form.",
    )


# --------------------------------------------------------------------------- #
# 3. Pre-LN block with opset-18 idioms
# --------------------------------------------------------------------------- #
def make_transformer_op18(rng: np.random.Generator) -> onnx.ModelProto:
    b = GraphBuilder(rng)
    axes = b.ints("/reduce_axes_last", [-1])
    x = "hidden"

    # ---- h = x + Attn(LN(x))
    n = layernorm_op18(b, x, "block.ln_1", axes)
    attn = self_attention(b, n, "block.attn", None, scale_by_div=False)
    h = b.node("Add", [x, attn], "/block/Add")

    # ---- h = h + MLP(LN(h)) with tanh Gelu
    n = layernorm_op18(b, h, "block.ln_2", axes)
    f = b.linear(n, "block.mlp.c_fc", HIDDEN, FFN)
    gp = "/block/mlp/act"
    three = b.scalar(f"{gp}/pow_exponent", 3.0)
    t = b.node("Pow", [f, three], f"{gp}/Pow")
    k = b.scalar(f"{gp}/coef", 0.044715)
    t = b.node("Mul", [t, k], f"{gp}/Mul")
    t = b.node("Add", [f, t], f"{gp}/Add")
    s = b.scalar(f"{gp}/sqrt_2_over_pi", 0.7978845608)
    t = b.node("Mul", [t, s], f"{gp}/Mul_1")
    t = b.node("Tanh", [t], f"{gp}/Tanh")
    one = b.scalar(f"{gp}/one", 1.0)
    t = b.node("Add", [t, one], f"{gp}/Add_1")
    half = b.scalar(f"{gp}/half", 0.5)
    hx = b.node("Mul", [f, half], f"{gp}/Mul_2")
    g = b.node("Mul", [hx, t], f"{gp}/Mul_3")
    f = b.linear(g, "block.mlp.c_proj", FFN, HIDDEN)
    h = b.node("Add", [h, f], "/block/Add_1")

    # ---- h = h + down(SiLU(gate(RMSNorm(h))) * up(RMSNorm(h)))   (LLaMA-style MLP)
    rp = "/block/rms_norm"
    sq = b.node("Mul", [h, h], f"{rp}/Mul")
    ms = b.node("ReduceMean", [sq, axes], f"{rp}/ReduceMean", keepdims=1)
    eps = b.scalar(f"{rp}/eps", 1e-6)
    ms = b.node("Add", [ms, eps], f"{rp}/Add")
    rms = b.node("Sqrt", [ms], f"{rp}/Sqrt")
    n = b.node("Div", [h, rms], f"{rp}/Div")
    rw = b.uniform("block.rms_norm.weight", (HIDDEN,), 0.8, 1.2)
    n = b.node("Mul", [n, rw], f"{rp}/Mul_1")
    gate = b.linear(n, "block.gated_mlp.gate_proj", HIDDEN, FFN, bias=False)
    sig = b.node("Sigmoid", [gate], "/block/gated_mlp/act_fn/Sigmoid")
    act = b.node("Mul", [gate, sig], "/block/gated_mlp/act_fn/Mul")
    up = b.linear(n, "block.gated_mlp.up_proj", HIDDEN, FFN, bias=False)
    m = b.node("Mul", [act, up], "/block/gated_mlp/Mul")
    down = b.linear(m, "block.gated_mlp.down_proj", FFN, HIDDEN, bias=False)
    b.node("Add", [h, down], "/block/Add_2", outputs=["output"])

    inputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    return _finish(
        b,
        "transformer_op18",
        inputs,
        outputs,
        18,
        "Pre-LN transformer block with opset-18 ReduceMean, tanh Gelu, RMSNorm and SiLU.",
    )


# --------------------------------------------------------------------------- #
# 4. If node with outer-scope initializers (silero-VAD-like), opset 15
# --------------------------------------------------------------------------- #
def make_if_subgraph(rng: np.random.Generator) -> onnx.ModelProto:
    outer = GraphBuilder(rng)
    cin, cmid, cout = 4, 8, 8

    def branch(tag: str) -> onnx.GraphProto:
        # Weights live in the OUTER graph; the branch only references them by name.
        sb = GraphBuilder(rng)
        pre = f"/_model/{tag}"
        w1 = outer.randn(f"_model.{tag}.conv1.weight", (cmid, cin, 3, 3), std=math.sqrt(2.0 / (cin * 9)))
        b1 = outer.randn(f"_model.{tag}.conv1.bias", (cmid,), std=0.1)
        h = sb.node(
            "Conv", ["x", w1, b1], f"{pre}/conv1/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]
        )
        h = sb.node("Relu", [h], f"{pre}/relu/Relu")
        w2 = outer.randn(f"_model.{tag}.conv2.weight", (cout, cmid, 3, 3), std=math.sqrt(2.0 / (cmid * 9)))
        b2 = outer.randn(f"_model.{tag}.conv2.bias", (cout,), std=0.1)
        h = sb.node(
            "Conv", [h, w2, b2], f"{pre}/conv2/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]
        )
        bn = outer.bn_params(f"_model.{tag}.bn", cout)
        h = sb.node("BatchNormalization", [h, *bn], f"{pre}/bn/BatchNormalization", epsilon=1e-5)
        sb.node("Sigmoid", [h], f"{pre}/sigmoid/Sigmoid", outputs=[f"{tag}_y"])
        return helper.make_graph(
            sb.nodes,
            f"{tag}_branch",
            [],
            [helper.make_tensor_value_info(f"{tag}_y", TensorProto.FLOAT, [1, cout, 16, 16])],
        )

    then_g = branch("model16k")
    else_g = branch("model8k")
    sr16k = outer.constant("/Constant", 16000, dtype=np.int64)
    cond = outer.node("Equal", ["sr", sr16k], "/Equal")
    outer.node("If", [cond], "/If", outputs=["y"], then_branch=then_g, else_branch=else_g)

    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 16, 16]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, []),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 16, 16])]
    return _finish(
        outer,
        "if_subgraph",
        inputs,
        outputs,
        15,
        "If node whose branches use outer-scope initializers and input.",
    )


# --------------------------------------------------------------------------- #
MODELS = {
    "cnn_small.onnx": make_cnn_small,
    "transformer_small.onnx": make_transformer_small,
    "transformer_op18.onnx": make_transformer_op18,
    "if_subgraph.onnx": make_if_subgraph,
}


def build_all() -> dict[str, onnx.ModelProto]:
    """Build every sample model in memory (each from its own seeded generator)."""
    out = {}
    for i, (fname, fn) in enumerate(MODELS.items()):
        out[fname] = fn(np.random.default_rng(SEED + i))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "output_dir",
        nargs="?",
        default=str(Path(__file__).resolve().parent),
        help="directory to write the models into (default: the folder containing this script)",
    )
    args = parser.parse_args(argv)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fname, model in build_all().items():
        onnx.checker.check_model(model, full_check=True)
        path = out_dir / fname
        onnx.save_model(model, str(path))
        print(
            f"wrote {path} ({path.stat().st_size} bytes, {len(model.graph.node)} nodes, opset "
            f"{model.opset_import[0].version})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
