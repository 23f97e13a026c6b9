"""The precision a graph computes in, and what validation may expect from a rewrite there.

A rewrite reorders float arithmetic (a fused kernel sums in another order, a fold computes a constant once).
In float32 that moves an output by ~1e-7 relative, and validation's default tolerance (1e-4) is tight. Two
kinds of graph amplify it, whatever the dtype of their outputs:

- **reduced precision inside** (float16/bfloat16 compute between float32 edges, as `keep_io_types` converters
  write it): each op rounds to ~1e-3 relative, so a reordering moves outputs by the narrow type's tolerance;
- **run-time quantization** (DynamicQuantizeLinear and its fused forms, QuantizeLinear): a value moved by one
  float32 ulp before a quantizer can round to the next integer step, which moves the output by a whole step.

For the first the tolerance is the narrow type's own. For the second it is measured on the model itself: the
original is run with every quantizer's float input moved by up to +/- 2^-19 of itself, each element by its
own fraction (the size of a reordered float32 sum),
and the tolerance is a few times the largest change that makes (`Validator._jitter_noise`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..tensors import iter_nodes

__all__ = ["JITTER", "NOISE_FACTOR", "Precision", "graph_precision", "jittered"]

NARROW = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
# (domain, op) of nodes that quantize a float value at run time -> the index of that float input
QUANTIZERS = {("", "DynamicQuantizeLinear"): 0, ("", "QuantizeLinear"): 0,
              ("com.microsoft", "DynamicQuantizeMatMul"): 0, ("com.microsoft", "DynamicQuantizeLSTM"): 0,
              ("com.microsoft", "QuantizeLinear"): 0, ("com.microsoft", "QAttention"): 0}
JITTER = 2.0**-19  # relative size of the jitter: about what a reordered float32 sum changes
PHASE = 7919.0  # cos(PHASE * x) gives each element its own sign and size of jitter
NOISE_FACTOR = 3.0  # tolerance = this many times the largest change the jitter makes


@dataclass(frozen=True)
class Precision:
    """How a graph computes: `narrow` names a reduced float type used inside (None: none); `quantizers` counts
    nodes that quantize float values at run time."""

    narrow: str | None
    quantizers: int


def _domain(d: str) -> str:
    return "" if d == "ai.onnx" else d


def graph_precision(proto: onnx.ModelProto) -> Precision:
    """Reduced precision inside: a Cast to float16/bfloat16, or such an initializer read by a node other than a
    Cast. Quantizers: QUANTIZERS nodes, subgraphs included."""
    narrow: str | None = None
    quantizers = 0
    inits = {t.name: t.data_type for t in proto.graph.initializer}
    for n in iter_nodes(proto.graph):
        key = (_domain(n.domain), n.op_type)
        if key in QUANTIZERS:
            quantizers += 1
        if narrow is None and key == ("", "Cast"):
            to = next((a.i for a in n.attribute if a.name == "to"), None)
            narrow = NARROW.get(to)
        elif narrow is None and key != ("", "Cast"):
            narrow = next((NARROW[inits[i]] for i in n.input if inits.get(i) in NARROW), None)
    return Precision(narrow, quantizers)


def jittered(proto: onnx.ModelProto, types: dict[str, int], sign: int) -> onnx.ModelProto:
    """A copy of the main graph with each quantizer's float32 input x (types: value name -> element type) moved to
    x * (1 + sign * JITTER * cos(PHASE * x)): every element by its own fraction of JITTER (a uniform scale would
    change nothing: dynamic quantization divides it out again)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    nodes = list(g.node)
    del g.node[:]
    consts = {"__jitter_phase": PHASE, "__jitter_one": 1.0, "__jitter_size": sign * JITTER}
    g.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items())
    for n in nodes:
        idx = QUANTIZERS.get((_domain(n.domain), n.op_type))
        x = n.input[idx] if idx is not None and len(n.input) > idx else ""
        if x and types.get(x) == TensorProto.FLOAT:
            k = f"{n.name or n.output[0]}__jitter"
            g.node.extend([helper.make_node("Mul", [x, "__jitter_phase"], [k + "_t"], name=k + "_t"),
                           helper.make_node("Cos", [k + "_t"], [k + "_c"], name=k + "_c"),
                           helper.make_node("Mul", [k + "_c", "__jitter_size"], [k + "_e"], name=k + "_e"),
                           helper.make_node("Add", [k + "_e", "__jitter_one"], [k + "_f"], name=k + "_f"),
                           helper.make_node("Mul", [x, k + "_f"], [k], name=k)])
            n.input[idx] = k
        g.node.append(n)
    return out
