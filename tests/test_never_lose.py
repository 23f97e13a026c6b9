"""Models onnxruntime runs that onnxfuse must accept through the default path (issue 28): nothing to rewrite costs
no runs, integer shape operands fed by graph inputs get valid values, a declared zero-sized dim is kept."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.helper as oh
from conftest import make_model, op_types, ort_run, save
from onnx import TensorProto

from onnxfuse.inputs.shapes import ShapeSpec, model_inputs
from onnxfuse.inputs.synth import synthesize
from onnxfuse.load.loader import load_model


def _expand_model(with_conv: bool) -> onnx.ModelProto:
    """Expand(data, shape) with `shape` an int64 graph input (as in ONNX's backend test data); with_conv: a
    Conv + Relu beside it, which onnxfuse fuses."""
    nodes = [oh.make_node("Expand", ["data", "shape"], ["expanded"], name="expand")]
    inputs = [("data", [3, 1]), ("shape", [3], TensorProto.INT64)]
    outputs = [("expanded", [2, 3, 6])]  # as the backend test declares it (shape = [2, 1, 6])
    inits = {}
    if with_conv:
        rng = np.random.default_rng(0)
        nodes += [oh.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                  oh.make_node("Relu", ["c"], ["y"], name="relu")]
        inputs.append(("x", [1, 3, 8, 8]))
        outputs.append(("y", [1, 4, 8, 8]))
        inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                 "b": rng.standard_normal(4).astype(np.float32)}
    return make_model(nodes, inputs, outputs, inits, opset=13)


def test_expand_of_a_shape_input_alone_is_written_unchanged(cli, tmp_path):
    src = save(_expand_model(False), tmp_path / "expand.onnx")
    out = tmp_path / "o.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--json", measure=True)
    assert code == 0, stderr
    r = json.loads(stdout)
    assert r["validation"]["status"] == "not needed: nothing was rewritten"
    assert out.read_bytes() == open(src, "rb").read()  # written unchanged
    feeds = {"data": np.arange(3, dtype=np.float32).reshape(3, 1), "shape": np.array([2, 1, 6], np.int64)}
    np.testing.assert_array_equal(ort_run(str(out), feeds)[0], ort_run(src, feeds)[0])


def test_shape_operands_get_values_valid_for_the_op():
    m = make_model([oh.make_node("Cast", ["s"], ["s64"], to=TensorProto.INT64),
                    oh.make_node("Reshape", ["x", "s64"], ["r"]),
                    oh.make_node("Slice", ["r", "st", "en", "ax", "sp"], ["y"])],
                   [("x", [2, 3, 4]), ("s", [3], TensorProto.INT32), ("st", [2], TensorProto.INT64),
                    ("en", [2], TensorProto.INT64), ("ax", [2], TensorProto.INT64), ("sp", [2], TensorProto.INT64)],
                   [("y", None)])
    feeds = synthesize(m, model_inputs(m), ShapeSpec(), 0)
    assert feeds["s"].dtype == np.int32 and feeds["s"].tolist() == [-1, 1, 1]
    assert feeds["st"].tolist() == [0, 0] and feeds["ax"].tolist() == [0, 1] and feeds["sp"].tolist() == [1, 1]
    assert feeds["en"].min() >= 2**31 - 1
    (y,) = ort_run(m, feeds)  # onnxruntime runs on them: the whole input, flattened
    assert y.shape == (24, 1, 1)


def test_expand_of_a_shape_input_beside_a_fusion_validates(cli, tmp_path):
    src = save(_expand_model(True), tmp_path / "expand_conv.onnx")
    out = tmp_path / "o.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--json", measure=True)
    assert code == 0, stderr
    r = json.loads(stdout)
    assert r["validation"]["status"].startswith("passed"), r["validation"]
    shape_input = r["inputs"]["shapes"]["shape"]
    assert shape_input == [3]
    assert {o["name"] for o in r["validation"]["outputs"]} == {"expanded", "y"}
    # the fusion was rewritten and validated (measured selection then keeps it only if it is faster)
    assert "com.microsoft.FusedConv" in {g["group"] for g in r["measure"]["groups"]}
    assert "Expand" in op_types(out)
    rng = np.random.default_rng(1)
    feeds = {"data": rng.standard_normal((3, 1)).astype(np.float32), "shape": np.array([1, 3, 5], np.int64),
             "x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    for a, b in zip(ort_run(str(out), feeds), ort_run(src, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _gelu_model(shape) -> onnx.ModelProto:
    """MatMul + erf-Gelu written out in ops (fused by onnxfuse) on an input of `shape`."""
    w = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    nodes = [oh.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             oh.make_node("Div", ["m", "sqrt2"], ["d"], name="div"),
             oh.make_node("Erf", ["d"], ["e"], name="erf"),
             oh.make_node("Add", ["e", "one"], ["p"], name="add"),
             oh.make_node("Mul", ["m", "p"], ["q"], name="mul"),
             oh.make_node("Mul", ["q", "half"], ["y"], name="mul_half")]
    return make_model(nodes, [("x", shape)], [("y", [shape[0], 8])],
                      {"w": w, "sqrt2": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32),
                       "half": np.array(0.5, np.float32)})


def test_a_declared_zero_dim_is_used_as_is(cli, tmp_path):
    src = save(_gelu_model([0, 4]), tmp_path / "empty.onnx")
    out = tmp_path / "o.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--json", measure=True)
    assert code == 0, stderr
    r = json.loads(stdout)
    assert r["inputs"]["shapes"] == {"x": [0, 4]}
    # "passed", not "not needed": the Gelu was rewritten, and validated on the empty input
    assert r["validation"]["status"].startswith("passed"), r["validation"]
    assert [o["shape"] for o in r["validation"]["outputs"]] == [[0, 8]]
    (y,) = ort_run(str(out), {"x": np.zeros((0, 4), np.float32)})
    assert y.shape == (0, 8)


def test_a_big_one_dim_weight_keeps_its_inferred_shapes(tmp_path):
    """Shape inference sees large weights as stubs (onnx's data propagation would walk a 1-D input element by
    element): the Add's output still has its shape."""
    n = 1 << 16
    m = make_model([oh.make_node("Add", ["x", "W"], ["y"])], [("x", ["batch", n])], [("y", None)],
                   {"W": np.ones(n, np.float32)})
    model, _ = load_model(save(m, tmp_path / "add.onnx"))
    assert model.graph.types["y"].shape == ("batch", n)
