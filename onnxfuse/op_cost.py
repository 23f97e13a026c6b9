"""What one kernel call costs, from the shapes onnxruntime's profiler records: bytes it reads and writes
(counting what the kernel touches: a Gather reads the rows it returns, not its table; Shape/Size read no data; a
view moves nothing unless onnxruntime must copy it; weights onnxruntime pre-packed are read every call) and
FLOPs for convolutions, matrix products, attention and normalisations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

DTYPE_BYTES = {"float": 4, "float16": 2, "bfloat16": 2, "double": 8, "int64": 8, "int32": 4, "int8": 1,
               "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "uint32": 4, "uint64": 8}
CONV_OPS = {"Conv", "FusedConv", "NhwcConv", "NhwcFusedConv", "QLinearConv", "ConvInteger"}
MATMUL_OPS = {"MatMul", "FusedMatMul", "MatMulInteger", "MatMulNBits", "TransposeMatMul", "QLinearMatMul"}
GEMM_OPS = {"Gemm", "FusedGemm"}
# the FLOP-carrying ops: their work at the GEMM peak is the model's GEMM-bound limit (ProfileResult.gemm_bound_ms)
GEMM_CLASS = CONV_OPS | MATMUL_OPS | GEMM_OPS | {"ConvTranspose", "Attention", "MultiHeadAttention",
                                                  "GroupQueryAttention", "DynamicQuantizeMatMul",
                                                  "MatMulIntegerToFloat"}
NORM_OPS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
            "SkipSimplifiedLayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNorm",
            "EmbedLayerNormalization"}

# --- bytes model: what one kernel call reads and writes ------------------------------------------------------
# The profiler records the shapes of the inputs a call sees, in order, leaving out absent optional inputs and
# initializers onnxruntime pre-packed and released (MatMul/Gemm/Attention weights): those are added back from the
# model file (or, for a node onnxruntime renamed, from the shapes). Everything not listed below reads every input
# once and writes every output once (elementwise ops, Expand (reads its input once), Concat, Transpose,
# normalisations, attention's inputs, weights and outputs; attention's S x S scores are not counted).
SHAPE_OPS = {"Shape", "Size"}  # read the input's shape, not its data
# Views: onnxruntime hands the input's buffer on (zero bytes) unless the input is a graph input or the output is
# a graph output, where it copies (measured: a Reshape of a 16 MiB graph input takes as long as a Neg of it).
VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout", "ExpandDims"}
ROW_OPS = {"Gather", "GatherElements", "GatherND", "Slice"}  # read only the elements they return
TABLE_OPS = {"EmbedLayerNormalization"}  # ids index embedding tables: the rows read, not the tables
ROTARY_OPS = {"RotaryEmbedding"}  # cos/sin caches indexed by position: the rows read
LOOKUP_WEIGHT_OPS = MATMUL_OPS | GEMM_OPS | {"Attention"}  # whole I/O, and weights onnxruntime may pre-pack
# Ops checked to read each input once and write each output once (the default for any op not listed anywhere
# here; a rule that creates an op in none of these sets fails the test that keeps this list honest).
WHOLE_IO_OPS = {
    "Abs", "Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Exp", "Erf", "Relu", "LeakyRelu", "Sigmoid", "Tanh",
    "HardSigmoid", "HardSwish", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "IsNaN", "Where", "Cast", "Expand",
    "Concat", "Split", "Transpose", "Pad", "Resize", "ReduceMean", "ReduceSum", "GlobalAveragePool", "Softmax",
    "LayerNormalization",
    "BatchNormalization", "InstanceNormalization", "RMSNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "Conv", "FusedConv", "NhwcConv", "ConvTranspose", "MultiHeadAttention",
    "GroupQueryAttention",  # q/k/v (or the packed QKV) and the caches read once, output and present written once
    "Range",  # reads three scalars, writes its output (rotary-embedding-batch: the position ids)
}
CONTROL_FLOW = {"If", "Loop", "Scan"}  # their events include their subgraphs' nodes, which are listed themselves
INT_TYPES = {"int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64"}


def entries(raw: list[dict] | None) -> list[tuple[str, list[int]]]:
    return [(dtype, list(dims)) for e in raw or [] for dtype, dims in e.items()]


def _elements(dims: list[int]) -> float:
    return float(np.prod(dims)) if dims else 1.0


def _nbytes(entry: tuple[str, list[int]]) -> float:
    return _elements(entry[1]) * DTYPE_BYTES.get(entry[0], 4)


def _rows_read(table: tuple[str, list[int]], rows: float) -> float:
    """A [rows, ...] table of which `rows` rows are read (at most the whole table)."""
    dims = table[1]
    if not dims or dims[0] <= 0:
        return _nbytes(table)
    return min(_nbytes(table), rows * _nbytes(table) / dims[0])


def node_bytes(op: str, inputs: list[dict], outputs: list[dict], released: float | None = None,
               view_copies: bool = False) -> float:
    """Bytes one call moves, from the profiler's input_type_shape / output_type_shape. `released`: bytes of
    initializers onnxruntime pre-packed and left out of the record (None: unknown, inferred from the shapes for
    MatMul, Gemm and Attention); `view_copies`: a view op that onnxruntime has to copy (graph input or output)."""
    ins, outs = entries(inputs), entries(outputs)
    written = sum(_nbytes(o) for o in outs)
    extra = _inferred_weights(op, ins, outs) if released is None else released
    if op in SHAPE_OPS:
        return written
    if op in VIEW_OPS:
        meta = sum(_nbytes(e) for e in ins[1:])  # Reshape's shape, Squeeze's axes
        return meta + (_nbytes(ins[0]) + written if view_copies and ins else 0.0)
    if op in CONTROL_FLOW:  # the subgraphs' nodes read and write the data; they are events of their own
        return sum(_nbytes(e) for e in ins)
    if op in ROW_OPS and ins:
        return min(_nbytes(ins[0]), written) + sum(_nbytes(e) for e in ins[1:]) + written + extra
    if op in TABLE_OPS and outs and outs[0][1]:
        hidden = outs[0][1][-1]
        ids = max((_elements(d) for t, d in ins if t in INT_TYPES), default=0.0)
        read = sum(_rows_read(e, ids) if e[0] not in INT_TYPES and len(e[1]) == 2 and e[1][-1] == hidden
                   else _nbytes(e) for e in ins)
        return read + written + extra
    if op in ROTARY_OPS and len(ins) >= 4 and len(ins[0][1]) in (3, 4):
        x, pos = ins[0][1], ins[1][1]
        seq = x[2] if len(x) == 4 else x[1]
        rows = _elements(pos) if _elements(pos) > 1 else seq  # position ids, or one offset for the sequence
        return (_nbytes(ins[0]) + _nbytes(ins[1]) + sum(_rows_read(e, rows) for e in ins[2:4])
                + sum(_nbytes(e) for e in ins[4:]) + written + extra)
    return sum(_nbytes(e) for e in ins) + written + extra


def _inferred_weights(op: str, ins: list[tuple[str, list[int]]], outs: list[tuple[str, list[int]]]) -> float:
    """Bytes of a constant weight the profiler did not record (pre-packed), from the other shapes: a node
    onnxruntime created itself (a fusion) is not in the model file."""
    if op not in LOOKUP_WEIGHT_OPS or not ins or not outs or not outs[0][1] or not ins[0][1]:
        return 0.0
    dtype, a = ins[0]
    out = outs[0][1]
    size = DTYPE_BYTES.get(dtype, 4)
    if op in MATMUL_OPS and op not in ("MatMulInteger", "MatMulNBits", "QLinearMatMul") and len(ins) == 1:
        n = out[-1]
        k = _elements(a) * n / max(_elements(out), 1.0)  # batch x M x K / (batch x M): transA or not
        return k * n * size
    if op in GEMM_OPS and len(out) == 2:
        m, n = out
        k = _elements(a) / max(m, 1)
        if not any(len(d) == 2 and _elements(d) == k * n for _, d in ins[1:]):
            return k * n * size
        return 0.0
    if op == "Attention" and len(a) == 3:
        if any(t == dtype and len(d) == 2 and d[0] == a[-1] for t, d in ins[1:]):
            return 0.0  # the weights are recorded
        bias = next((d for t, d in ins[1:] if t == dtype and len(d) == 1), None)
        return a[-1] * (bias[0] if bias else 3 * out[-1]) * size
    return 0.0


def released_bytes(recorded: list[tuple[str, list[int]]],
                    declared: list[tuple[float, list[int]] | None]) -> float | None:
    """Bytes of the node's initializers missing from the profiler's record. `declared`: the node's present
    inputs in order, (item size, dims) for an initializer and None for a value computed at run time. The record
    lists the inputs the kernel still holds, in order; an initializer that does not line up was pre-packed.
    None when the two do not line up at all (onnxruntime changed the node)."""
    i, released = 0, 0.0
    for d in declared:
        if i < len(recorded) and (d is None or recorded[i][1] == d[1]):
            i += 1
        elif d is None:
            return None  # a run-time value the record does not have
        else:
            released += d[0] * _elements(d[1])
    return released if i == len(recorded) else None


@dataclass
class NodeInfo:
    declared: list[tuple[float, list[int]] | None] | None  # None: a name onnxruntime gave (inputs unknown)
    view_copies: bool
    replaces: str


def model_index(m: onnx.ModelProto) -> dict[str, NodeInfo]:
    """Node name -> its inputs as the model declares them, whether a view op has to copy, and, for a node
    onnxfuse created, the original nodes it replaced. Subgraphs included; no weights are needed."""
    consts: dict[str, tuple[float, list[int]]] = {}
    index: dict[str, NodeInfo] = {}

    def itemsize(elem_type: int) -> float:
        try:
            return float(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
        except (KeyError, TypeError, ValueError):
            return 4.0

    def walk(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            consts[t.name] = (itemsize(t.data_type), list(t.dims))
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute and n.attribute[0].name == "value":
                t = n.attribute[0].t
                consts[n.output[0]] = (itemsize(t.data_type), list(t.dims))
        ins = {i.name for i in g.input} - set(consts)
        outs = {o.name for o in g.output}
        for n in g.node:
            replaced = n.doc_string.split("replaced=", 1)[-1] if n.doc_string.startswith("onnxfuse:") else ""
            copies = bool(n.input and n.input[0] in ins) or any(o in outs for o in n.output)
            info = NodeInfo([consts.get(i) for i in n.input if i], copies, replaced)
            index[n.name] = info
            for o in n.output:  # onnxruntime's NCHWc transform renames a conv after its output value
                index.setdefault(f"{o}_nchwc", NodeInfo(None, False, replaced))
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub)

    walk(m.graph)
    return index


def node_flops(op: str, ins: list[list[int]], outs: list[list[int]]) -> float:
    """FLOPs of one call from its input/output shapes (multiply-add = 2)."""
    out_elems = float(np.prod(outs[0])) if outs and outs[0] else 1.0
    if op in CONV_OPS and len(ins) > 1:
        return 2.0 * out_elems * float(np.prod(ins[1][1:]))
    if op == "ConvTranspose" and len(ins) > 1:
        return 2.0 * float(np.prod(ins[0])) * float(np.prod(ins[1][1:]))
    if op in MATMUL_OPS and ins and ins[0]:
        return 2.0 * out_elems * ins[0][-1]
    if op in GEMM_OPS and ins and outs and outs[0]:  # B may be pre-packed (not recorded): K from A and M
        k = float(np.prod(ins[0])) / max(outs[0][0], 1)
        return 2.0 * out_elems * k
    if op == "MultiHeadAttention" and len(ins) > 1 and len(ins[0]) == 3:  # projected q, k, v: no projection
        b, s, h = ins[0]
        k = ins[1]
        s_kv = k[1] if len(k) == 3 else k[2] if len(k) == 4 else s
        return 4.0 * b * s * s_kv * h
    if op in ("Attention", "MultiHeadAttention") and ins and len(ins[0]) == 3:
        b, s, h = ins[0]
        return 2.0 * b * s * h * 3 * h + 4.0 * b * s * s * h
    if op in NORM_OPS:
        return 8.0 * out_elems
    if op == "Softmax":
        return 5.0 * out_elems
    return out_elems
