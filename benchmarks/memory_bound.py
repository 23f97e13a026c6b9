"""What `onnxfuse optimize` (the default path: validation and measuring) costs on models with one or a few ops and
one big weight, against the cost of just loading the model: wall seconds and peak RSS of a subprocess per case,
and of a "load only" baseline (onnx.load + one onnxruntime session + one run at validation's batch 2).

Cases (each with the weight embedded in the .onnx file and in an external data file; embedded only below 2 GB):
  add      Add(x[batch, N], W[N])                          nothing to rewrite, activations as big as the weight
  matmul   MatMul(x[batch, K], W[K, 256])                  nothing to rewrite, small activations
  gelu     MatMul(x[batch, K], W[K, 256]) + erf-Gelu       a rule fires: validation and measuring run
  biasgelu Add(x[batch, N], W[N]) + erf-Gelu               a rule fires, activations as big as the weight

    python -m benchmarks.memory_bound [--mb 128,512] [--cases add,matmul,gelu] [--layout embedded,external]
                                      [--dir /tmp/onnxfuse-membound] [--onnxfuse-args "..."]

Prints one row per case: weights, onnxfuse's wall s and peak RSS, the baseline's, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto

OUT_COLS = 256

BASELINE = r"""
import sys, numpy as np, onnx, onnxruntime as ort
path, name, shape = sys.argv[1], sys.argv[2], [int(d) for d in sys.argv[3].split(",")]
m = onnx.load(path)  # the weights, as onnx reads them
s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
s.run(None, {name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)})
"""


def _weight(shape: tuple[int, ...]) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])).astype(np.float32)


def build(folder: str, case: str, mb: int, external: bool) -> tuple[str, list[int]]:
    """The model file and the shape of its input at validation's batch 2."""
    os.makedirs(folder, exist_ok=True)
    n = mb * 2**20 // 4
    if case in ("add", "biasgelu"):
        w, x_shape = _weight((n,)), ["batch", n]
        nodes = [oh.make_node("Add", ["x", "W"], ["y" if case == "add" else "m"], name="add")]
        y_shape = ["batch", n]
    else:
        k = n // OUT_COLS
        w, x_shape, y_shape = _weight((k, OUT_COLS)), ["batch", k], ["batch", OUT_COLS]
        nodes = [oh.make_node("MatMul", ["x", "W"], ["y" if case == "matmul" else "m"], name="matmul")]
    if case in ("gelu", "biasgelu"):
        nodes += [oh.make_node("Div", ["m", "sqrt2"], ["d"], name="div"),
                  oh.make_node("Erf", ["d"], ["e"], name="erf"),
                  oh.make_node("Add", ["e", "one"], ["p"], name="add1"),
                  oh.make_node("Mul", ["m", "p"], ["q"], name="mul"),
                  oh.make_node("Mul", ["q", "half"], ["y"], name="mul_half")]
    inits = [onnx.numpy_helper.from_array(w, "W")]
    del w
    if case in ("gelu", "biasgelu"):
        inits += [onnx.numpy_helper.from_array(np.array(v, np.float32), name)
                  for name, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    graph = oh.make_graph(nodes, case, [oh.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    name = f"{case}-{mb}mb-{'ext' if external else 'emb'}"
    path = os.path.join(folder, name + ".onnx")
    onnx.save(model, path, save_as_external_data=external, location=name + ".onnx.data" if external else None,
              size_threshold=1024)
    return path, [2] + [int(d) for d in x_shape[1:]]


def measure(cmd: list[str]) -> tuple[float, int, int, str]:
    """(wall s, peak RSS bytes, exit code, last stderr line) of `cmd` run under /usr/bin/time -v."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    peak = 0
    for line in r.stderr.splitlines():
        if "Maximum resident set size" in line:
            peak = int(line.split(":")[1]) * 1024
    err = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("\t")]
    return wall, peak, r.returncode, err[-1] if err else ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="128,512", help="weight sizes in MiB, comma separated (e.g. 128,512,1024,2048)")
    ap.add_argument("--cases", default="add,matmul,gelu,biasgelu")
    ap.add_argument("--layout", default="embedded,external")
    ap.add_argument("--dir", default="/tmp/onnxfuse-membound")
    ap.add_argument("--onnxfuse-args", default="", help="extra flags for onnxfuse optimize")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if not os.path.exists("/usr/bin/time"):
        print("needs /usr/bin/time (GNU time) for the peak RSS of each subprocess")
        return 2
    rows = []
    print(f"{'case':<26} {'weights':>8} | {'optimize s':>10} {'peak GiB':>8} | {'load s':>7} {'peak GiB':>8} | "
          f"{'x time':>6} {'x peak':>6} {'peak/weights':>12}  result", flush=True)
    for mb in [int(v) for v in a.mb.split(",")]:
        for case in a.cases.split(","):
            for layout in a.layout.split(","):
                external = layout == "external"
                if not external and mb >= 2048:
                    continue  # protobuf's 2 GB limit: such a model is always external
                folder = os.path.join(a.dir, f"{case}-{mb}-{layout}")
                src, shape = build(folder, case, mb, external)
                out = os.path.join(folder, "out", "opt.onnx")
                os.makedirs(os.path.dirname(out), exist_ok=True)
                ow, op, rc, err = measure([sys.executable, "-m", "onnxfuse.cli", "optimize", src, out]
                                          + shlex.split(a.onnxfuse_args))
                bw, bp, brc, berr = measure([sys.executable, "-c", BASELINE, src, "x", ",".join(map(str, shape))])
                status = "ok" if rc == 0 else f"exit {rc}: {err}"
                if brc != 0:
                    status += f"; baseline exit {brc}: {berr}"
                w = mb * 2**20
                row = (f"{os.path.basename(src)[:-5]:<26} {mb:>6}MB | {ow:>10.1f} {op / 2**30:>8.2f} | {bw:>7.1f} "
                       f"{bp / 2**30:>8.2f} | {ow / bw:>6.1f} {op / max(bp, 1):>6.2f} {op / w:>12.2f}  {status}")
                rows.append(row)
                print(row, flush=True)
                if not a.keep:
                    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
