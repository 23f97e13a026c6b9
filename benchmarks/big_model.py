"""A model over 2 GB (weights in an external data file) through `onnxfuse optimize`: wall time, peak memory
(max RSS of the onnxfuse process, which also runs onnxruntime for validation), that the output keeps its
weights external, loads in onnxruntime and matches the input's outputs.

    python -m benchmarks.big_model [--gb 2.2] [--dir /tmp/onnxfuse-big]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto

HIDDEN = 8192


def build(folder: str, gb: float) -> tuple[str, int]:
    """MatMul layers with HIDDEN x HIDDEN float32 weights, each followed by an erf-Gelu written out in ops."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "big.onnx")
    data_name = "big.onnx.data"
    layer_bytes = HIDDEN * HIDDEN * 4
    layers = max(1, int(np.ceil(gb * 2**30 / layer_bytes)))
    inits, nodes = [], []
    rng = np.random.default_rng(0)
    offset = 0
    with open(os.path.join(folder, data_name), "wb") as f:
        for i in range(layers):
            w = (rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) / np.sqrt(HIDDEN)).astype(np.float32)
            f.write(w.tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[HIDDEN, HIDDEN])
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(w.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += w.nbytes
            inits.append(t)
            del w
    for name, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5)):
        inits.append(onnx.numpy_helper.from_array(np.array(v, np.float32), name))
    cur = "x"
    for i in range(layers):
        m = nodes.append(oh.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"/l{i}/MatMul")) or f"m{i}"
        nodes += [oh.make_node("Div", [m, "sqrt2"], [f"d{i}"], name=f"/l{i}/Div"),
                  oh.make_node("Erf", [f"d{i}"], [f"e{i}"], name=f"/l{i}/Erf"),
                  oh.make_node("Add", [f"e{i}", "one"], [f"p{i}"], name=f"/l{i}/Add"),
                  oh.make_node("Mul", [m, f"p{i}"], [f"q{i}"], name=f"/l{i}/Mul"),
                  oh.make_node("Mul", [f"q{i}", "half"], [f"g{i}"], name=f"/l{i}/Mul_1")]
        cur = f"g{i}"
    graph = oh.make_graph(nodes, "big", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN])],
                          [oh.make_tensor_value_info(cur, TensorProto.FLOAT, [1, HIDDEN])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, offset


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.2)
    ap.add_argument("--dir", default="/tmp/onnxfuse-big")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    t = time.perf_counter()
    src, weight_bytes = build(a.dir, a.gb)
    print(f"built {src}: weights {weight_bytes / 2**30:.2f} GiB in {time.perf_counter() - t:.1f} s", flush=True)
    out = os.path.join(a.dir, "out", "big.opt.onnx")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", src, out, "--json"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if r.returncode != 0:
        print("onnxfuse failed:", r.stderr.strip())
        return 1
    import json

    res = json.loads(r.stdout)
    files = sorted(os.listdir(os.path.dirname(out)))
    proto = onnx.load(out, load_external_data=False)
    external = sum(1 for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    print(f"onnxfuse optimize: {wall:.1f} s wall, peak RSS {peak / 2**30:.2f} GiB "
          f"({peak / weight_bytes:.2f}x the weights), fired {res['fired']}, validation {res['validation']['status']}")
    print(f"  timings: {', '.join(f'{k} {v:.1f} s' for k, v in res['timings_s'].items())}")
    print(f"  output files {files}; model file {os.path.getsize(out)} bytes; {external} initializers external; "
          f"measure: {res['measure'] and res['measure']['note']}")
    print(f"  max abs error vs original: {max(c['max_abs'] for c in res['validation']['outputs']):.2e}")
    if not a.keep:
        shutil.rmtree(a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
