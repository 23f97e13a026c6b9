#!/usr/bin/env python3
"""The library entry points on a model of realistic size, in memory: `onnxfuse.rewrite_model` on a ModelProto and
`onnxfuse.FusionPass` inside an onnx-ir PassManager. Prints what fired, the time each took, the process's peak
memory, and the rewritten model's largest difference from the original through onnxruntime.

    python -m benchmarks.library_api /work/corpus/bert_base12.onnx      # any .onnx: a 12-layer BERT, a ResNet
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

import onnxfuse


def _feeds(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    from onnxfuse.inputs import make_inputs  # the inputs optimize would validate on

    return make_inputs(proto)


def _run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def main(path: str) -> None:
    import onnx_ir as ir

    t = time.perf_counter()
    proto = onnx.load(path)
    print(f"{path}: {len(proto.graph.node)} nodes, loaded in {time.perf_counter() - t:.1f} s")
    feeds = _feeds(proto)
    want = _run(proto, feeds)
    t = time.perf_counter()
    res = onnxfuse.rewrite_model(proto)
    took = time.perf_counter() - t
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(_run(res.model, feeds), want, strict=True))
    print(f"rewrite_model: {took:.1f} s, {len(res.model.graph.node)} nodes, fired {dict(res.fired)}, "
          f"max abs difference {diff:.2e}")
    model = ir.serde.deserialize_model(proto)
    manager = ir.passes.PassManager([onnxfuse.FusionPass()])
    t = time.perf_counter()
    out = manager(model)
    took = time.perf_counter() - t
    got = ir.serde.serialize_model(out.model)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(_run(got, feeds), want, strict=True))
    print(f"FusionPass in a PassManager: {took:.1f} s, modified={out.modified}, {len(got.graph.node)} nodes, "
          f"max abs difference {diff:.2e}")
    print(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main(sys.argv[1])
