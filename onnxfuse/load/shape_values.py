"""Shape facts ONNX's shape inference misses. The values of small shape tensors computed at run time (Shape ->
Slice/Gather -> Concat chains), as dims: an int, a symbolic dim name read from a typed value, or None. ONNX's
shape inference does not give a Reshape-13 output the dims such a target names (it reads only constant
targets), so values a rewrite creates would get fresh `unk__N` dims that no rule can match against the dims they
are made from; a Reshape checks its target at run time, so the dims it names are facts about its output wherever
the model runs. And a Slice with run-time bounds gets every dim invented, the axes it does not slice included
(BERT's position ids, buffer[:, 0:s] of a [1, 512] buffer, are [unk, unk]: a rule would take the 1 for the
batch); those dims are its input's."""

from __future__ import annotations

import numpy as np
import onnx

from ..ir import Graph
from ..tensors import TensorType

Dim = int | str | None


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            return list(a.ints) if a.ints else [a.i]
    return None


def _const(graph: Graph, name: str) -> list[int] | None:
    v = graph.const_value(name) if name else None
    if v is None or v.dtype.kind not in "iu" or v.ndim > 1:
        return None
    return [int(x) for x in np.asarray(v).reshape(-1)]


def shape_values(graph: Graph, protos: list[onnx.NodeProto]) -> dict[str, tuple[tuple[Dim, ...], bool]]:
    """For the int64 outputs of `protos` (in order) that hold dims: (dims, is_scalar)."""
    vals: dict[str, tuple[tuple[Dim, ...], bool]] = {}

    def get(name: str) -> tuple[tuple[Dim, ...], bool] | None:
        if name in vals:
            return vals[name]
        c = _const(graph, name)
        if c is None:
            return None
        v = graph.const_value(name)
        return tuple(c), v is not None and v.ndim == 0

    for p in protos:
        out: tuple[tuple[Dim, ...], bool] | None = None
        ins = [get(i) if i else None for i in p.input]
        if p.op_type == "Shape" and p.domain in ("", "ai.onnx"):
            t = graph.type_of(p.input[0])
            if t is not None and t.shape is not None:
                dims = list(t.shape)
                start, end = (_ints(p, "start") or [0])[0], (_ints(p, "end") or [len(dims)])[0]
                out = (tuple(dims[start:end]), False)
        elif p.op_type == "Slice" and ins and ins[0] is not None and not ins[0][1]:
            bounds = [_const(graph, i) if i else None for i in list(p.input[1:5])]
            if len(bounds) >= 2 and bounds[0] and bounds[1] and len(bounds[0]) == 1 and len(bounds[1]) == 1:
                axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else [0]
                steps = bounds[3] if len(bounds) > 3 and bounds[3] is not None else [1]
                if axes in ([0], [-1]) and len(steps) == 1 and steps[0] != 0:
                    out = (ins[0][0][bounds[0][0]:bounds[1][0]:steps[0]], False)
        elif p.op_type == "Gather" and len(ins) == 2 and ins[0] is not None and not ins[0][1]:
            idx = graph.const_value(p.input[1])
            n = len(ins[0][0])
            if idx is not None and idx.ndim <= 1 and (_ints(p, "axis") or [0])[0] == 0 \
                    and all(-n <= int(i) < n for i in idx.reshape(-1)):
                out = (tuple(ins[0][0][int(i)] for i in idx.reshape(-1)), idx.ndim == 0)
        elif p.op_type == "Concat" and ins and all(v is not None for v in ins):
            out = (tuple(d for v in ins for d in v[0]), False)  # type: ignore[index]
        elif p.op_type == "Unsqueeze" and ins and ins[0] is not None and ins[0][1]:
            out = (ins[0][0], False)
        elif p.op_type == "Squeeze" and ins and ins[0] is not None and len(ins[0][0]) == 1 and not ins[0][1]:
            out = (ins[0][0], True)
        if out is not None and p.output:
            vals[p.output[0]] = out
    return vals


def reshape_types(graph: Graph, protos: list[onnx.NodeProto], known: dict[str, TensorType]) -> dict[str, TensorType]:
    """The types of the Reshape outputs among `protos` whose target `shape_values` knows: the dims it names (0:
    the input's dim where allowzero is off, -1: that of the input's size, if all other dims are numbers)."""
    vals = shape_values(graph, protos)
    out: dict[str, TensorType] = {}
    for p in protos:
        if p.op_type != "Reshape" or p.domain not in ("", "ai.onnx") or len(p.input) < 2:
            continue
        src = known.get(p.input[0]) or graph.type_of(p.input[0])
        target = vals[p.input[1]][0] if p.input[1] in vals else _const(graph, p.input[1])
        if src is None or target is None:
            continue
        dims: list[Dim] = []
        for i, d in enumerate(target):
            if d == 0 and not (_ints(p, "allowzero") or [0])[0]:
                d = src.shape[i] if src.shape is not None and i < len(src.shape) else None
            dims.append(d)
        if -1 in dims:
            rest = [d for d in dims if d != -1]
            size = int(np.prod(src.shape)) if src.shape and all(isinstance(d, int) for d in src.shape) else None
            whole = all(isinstance(d, int) and d > 0 for d in rest)
            dims[dims.index(-1)] = size // int(np.prod(rest)) if size is not None and whole else None
        if any(isinstance(d, int) and d < 0 for d in dims):
            continue
        out[p.output[0]] = TensorType(src.elem_type, tuple(dims))
    return out


def slice_types(graph: Graph, protos: list[onnx.NodeProto]) -> dict[str, TensorType]:
    """The types of the Slice outputs among `protos` whose axes are constant (or absent: the first len(starts)
    axes): the input's dims on every axis the Slice does not slice, the dims shape inference gave (or None) on
    the others. Only outputs that gain a dim this way."""
    out: dict[str, TensorType] = {}
    for p in protos:
        if p.op_type != "Slice" or p.domain not in ("", "ai.onnx") or len(p.input) < 3 or not p.output:
            continue
        src, have = graph.type_of(p.input[0]), graph.type_of(p.output[0])
        if src is None or src.shape is None:
            continue
        rank = len(src.shape)
        if len(p.input) > 3 and p.input[3]:
            axes = _const(graph, p.input[3])
        else:
            starts = graph.const_value(p.input[1]) if p.input[1] else None
            t = graph.type_of(p.input[1])
            n = starts.size if starts is not None else (t.shape[0] if t is not None and t.shape else None)
            axes = list(range(n)) if isinstance(n, int) else None
        if axes is None or not all(-rank <= a < rank for a in axes):
            continue
        sliced = {a % rank for a in axes}
        old = have.shape if have is not None and have.shape is not None and len(have.shape) == rank else (None,) * rank
        dims = tuple(src.shape[i] if i not in sliced else old[i] for i in range(rank))
        if dims != old:
            out[p.output[0]] = TensorType(src.elem_type, dims)
    return out
