"""Rewrite time against graph size: transformer-like chains of decomposed LayerNorm + erf-Gelu blocks at
about 10k, 30k and 100k nodes. onnxfuse runs load -> match -> rewrite -> write (no validation, no measuring:
those run the model and scale with its compute, not its node count). Peers on the same files: onnxslim and
onnxruntime's transformers optimizer (when installed).

    python -m benchmarks.scaling [--sizes 10000,30000,100000] [--no-peers]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper


def build(n_nodes: int, hidden: int = 16) -> onnx.ModelProto:
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    half, one, sqrt2, two, eps = (const(n, v) for n, v in
                                  (("half", 0.5), ("one", 1.0), ("sqrt2", 1.4142135), ("two", 2.0), ("eps", 1e-5)))
    gamma, beta = const("gamma", np.ones(hidden)), const("beta", np.zeros(hidden))
    cur, i = "x", 0
    while len(nodes) < n_nodes:
        p = f"/b{i}/"

        def node(op, ins, p=p, **kw):
            out = p + op + str(len(nodes))
            nodes.append(oh.make_node(op, ins, [out], name=out, **kw))
            return out

        mean = node("ReduceMean", [cur], axes=[-1])
        d = node("Sub", [cur, mean])
        var = node("ReduceMean", [node("Pow", [d, two])], axes=[-1])
        ln = node("Add", [node("Mul", [node("Div", [d, node("Sqrt", [node("Add", [var, eps])])]), gamma]), beta])
        s = node("Add", [node("Erf", [node("Div", [ln, sqrt2])]), one])
        cur = node("Add", [node("Mul", [node("Mul", [ln, half]), s]), cur])  # gelu + residual
        i += 1
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, hidden])],
                          [oh.make_tensor_value_info(cur, TensorProto.FLOAT, ["batch", 8, hidden])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def time_onnxfuse(src: str, out: str) -> tuple[float, int]:
    from onnxfuse import OptimizeOptions, optimize

    t = time.perf_counter()
    r = optimize(src, out, OptimizeOptions(validate=False, measure=False))
    return time.perf_counter() - t, len(r.applications)


def time_onnxslim(src: str, out: str) -> float | None:
    try:
        import onnxslim
    except ImportError:
        return None
    t = time.perf_counter()
    onnxslim.slim(src, out)
    return time.perf_counter() - t


def time_ort_transformers(src: str, out: str) -> float | None:
    try:
        from onnxruntime.transformers import optimizer
    except ImportError:
        return None
    t = time.perf_counter()
    m = optimizer.optimize_model(src, model_type="bert", opt_level=0, use_gpu=False)
    m.save_model_to_file(out)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,30000,100000")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peers-up-to", type=int, default=30000, help="skip the (much slower) peers above this size")
    a = ap.parse_args()
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    print(f"{'nodes':>8} {'rewrites':>9} {'onnxfuse s':>11} {'us/node':>8} {'onnxslim s':>11} {'ort-transformers s':>19}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in a.sizes.split(",")):
            src = os.path.join(tmp, f"chain{size}.onnx")
            model = build(size)
            onnx.save(model, src)
            n = len(model.graph.node)
            t_fuse, rewrites = time_onnxfuse(src, os.path.join(tmp, "fuse.onnx"))
            slim = ortx = None
            if not a.no_peers and n <= a.peers_up_to:
                slim = time_onnxslim(src, os.path.join(tmp, "slim.onnx"))
                ortx = time_ort_transformers(src, os.path.join(tmp, "ortx.onnx"))
            fmt = lambda v: f"{v:11.2f}" if v is not None else f"{'n/a':>11}"  # noqa: E731
            print(f"{n:8d} {rewrites:9d} {t_fuse:11.2f} {t_fuse / n * 1e6:8.1f} {fmt(slim)} {fmt(ortx):>19}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
