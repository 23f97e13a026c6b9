"""A region as a model: its class signature (both versions' canonical form and the shapes its inputs ran at:
alike regions, such as twelve BERT layers, are one class and are timed once), and one version serialized with
the run-time values it reads as inputs."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import numpy_helper

from ..model_proto import make_model
from .cut import Const, Region

__all__ = ["region_model", "signature"]


def _side_text(nodes: list[onnx.NodeProto], consts: dict[str, Const], region: Region) -> str:
    ids: dict[str, str] = {}

    def ref(v: str) -> str:
        if not v:
            return "_"
        if v not in ids:
            if v in consts:
                ids[v] = f"{len(ids)}:{consts[v].text()}"
            elif v in region.inputs:
                ids[v] = f"{len(ids)}:in{region.inputs.index(v)}"
            else:
                ids[v] = f"{len(ids)}"
            return ids[v]
        return ids[v].split(":")[0]

    parts = []
    for n in nodes:
        attrs = ";".join(f"{a.name}={hashlib.sha1(a.SerializeToString()).hexdigest()[:16]}"
                         for a in sorted(n.attribute, key=lambda a: a.name))
        ins = ",".join(ref(v) for v in n.input)
        outs = ",".join(ref(v) for v in n.output)
        parts.append(f"{n.domain}::{n.op_type}({ins})->({outs}){{{attrs}}}")
    outs = ",".join(ref(v) for v in region.outputs)
    return "|".join(parts) + f"=>{outs}"


def signature(region: Region, shapes: list[list[tuple[str, tuple[int, ...]]]]) -> str:
    """The class of a region: both versions' canonical form, and the dtype and shape of each input as it ran
    (one list per shape profile, in region.inputs order)."""
    text = _side_text(region.original, region.orig_consts, region) + "##" + \
        _side_text(region.fused, region.fused_consts, region) + "##" + repr(shapes)
    return hashlib.sha256(text.encode()).hexdigest()


def region_model(region: Region, fused: bool, opsets: dict[str, int], ir_version: int,
                 feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> bytes:
    """One version of the region as a serialized model whose inputs are the runtime values it reads (typed
    as in the original model, so that onnxruntime sees the same static and symbolic dims). `feeds`: the values
    it will be run on (one dict per profile); where the original has no shape for a value, a dim is static
    only if every profile's value has the same size there."""
    nodes = region.fused if fused else region.original
    consts = region.fused_consts if fused else region.orig_consts
    read = {i for n in nodes for i in n.input if i}
    all_feeds = feeds if isinstance(feeds, list) else [feeds]
    inputs = []
    for v in region.inputs:
        if v not in read:
            continue
        t = region.types.get(v)
        arr = all_feeds[0][v]
        typed = t is not None and t.shape is not None and len(t.shape) == arr.ndim
        dims = [d if not isinstance(d, int) or all(f[v].ndim == arr.ndim and f[v].shape[a] == d for f in all_feeds)
                else f"{v}_{a}" for a, d in enumerate(t.shape if typed else arr.shape)]
        elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        inputs.append(onnx.helper.make_tensor_value_info(v, elem, [d if d is not None else None for d in dims]))
    outputs = []
    for v in region.outputs:
        vi = onnx.ValueInfoProto()
        vi.name = v
        outputs.append(vi)
    inits = [numpy_helper.from_array(np.asarray(c.value()), name) for name, c in consts.items() if name in read]
    graph = onnx.helper.make_graph(list(nodes), "region", inputs, outputs, inits)
    return make_model(graph, opsets, ir_version).SerializeToString()
