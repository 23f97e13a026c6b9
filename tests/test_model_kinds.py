"""Model kinds the loader must handle: old opsets, Loop bodies, model-local functions, the CUDA target."""

import os

import numpy as np
import onnx
import onnx.helper as oh
from conftest import MODELS, make_model, op_types, ort_run, save
from onnx import TensorProto

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.patterns.spec import json_schema_text
from onnxfuse.targets import available


def _conv_relu_nodes(x="x", y="y", prefix=""):
    return [oh.make_node("Conv", [x, "w"], [prefix + "c"], name=prefix + "conv", pads=[1, 1, 1, 1]),
            oh.make_node("Relu", [prefix + "c"], [y], name=prefix + "relu")]


W = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)


def test_opset_7_model(tmp_path):
    m = make_model(_conv_relu_nodes(), [("x", [1, 3, 8, 8]), ("w", [4, 3, 3, 3])], [("y", [1, 4, 8, 8])],
                   {"w": W}, opset=7)
    m.ir_version = 3  # initializers are also graph inputs in IR 3
    src = save(m, tmp_path / "old.onnx")
    r = optimize(src, str(tmp_path / "o.onnx"), OptimizeOptions(measure=False))
    assert r.fired == {"conv-relu": 1} and r.validation == "passed"
    assert op_types(onnx.load(str(tmp_path / "o.onnx"))) == ["com.microsoft.FusedConv"]


def test_loop_body_is_optimized(tmp_path):
    """Conv+Relu inside a Loop body that reads the outer weight `w` and outer input `x`."""
    body = oh.make_graph(
        _conv_relu_nodes(y="out", prefix="b_") + [oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [oh.make_tensor_value_info("i", TensorProto.INT64, []), oh.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         oh.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])])
    loop = oh.make_node("Loop", ["trip", ""], ["scan_out"], body=body, name="loop")
    m = make_model([loop], [("x", [1, 3, 8, 8])], [("scan_out", [2, 1, 4, 8, 8])],
                   {"w": W, "trip": np.array(2, np.int64)}, opset=13)
    src = save(m, tmp_path / "loop.onnx")
    out = tmp_path / "o.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False))
    assert r.fired == {"conv-relu": 1}
    got = onnx.load(str(out))
    body_ops = [n.op_type for n in got.graph.node[0].attribute[0].g.node]
    assert body_ops == ["FusedConv", "Identity"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_model_local_functions_kept(tmp_path):
    fn = oh.make_function("local", "MyRelu", ["a"], ["b"], [oh.make_node("Relu", ["a"], ["b"])],
                          [oh.make_opsetid("", 17)])
    nodes = _conv_relu_nodes(y="y0") + [oh.make_node("MyRelu", ["y0"], ["y"], domain="local", name="f")]
    m = make_model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], {"w": W}, opset=17)
    m.functions.append(fn)
    m.opset_import.append(oh.make_opsetid("local", 1))
    src = save(m, tmp_path / "fn.onnx")
    out = tmp_path / "o.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False))
    assert r.fired == {"conv-relu": 1}
    got = onnx.load(str(out))
    assert [f.SerializeToString() for f in got.functions] == [fn.SerializeToString()]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_cuda_target_without_gpu(tmp_path):
    r = optimize(os.path.join(MODELS, "cnn_small.onnx"), str(tmp_path / "o.onnx"), OptimizeOptions(measure=False, target="cuda"))
    skipped = {s.rule: s.reason for s in r.skipped}
    # CUDA FusedConv runs Relu only: the other activations are declared cpu-only and skipped with a reason
    assert skipped["conv-activation"] == "declared for cpu only"
    assert "conv-activation" not in r.fired and r.fired["conv-relu"] == 2
    assert "gemm-activation" in skipped
    if not available("cuda"):
        assert r.validation == "passed on CPU (the installed onnxruntime has no CUDA execution provider)"


def test_schema_file_is_current():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "onnxfuse", "patterns", "schema.json")
    with open(path) as f:
        assert f.read() == json_schema_text(), "regenerate with: onnxfuse patterns schema > onnxfuse/patterns/schema.json"
