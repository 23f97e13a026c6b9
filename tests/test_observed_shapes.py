"""Shapes known from the runs validation makes: where onnx's shape inference leaves a value without a shape (a
Reshape target computed from Shape at opset 12, as older torch exporters write it), the runs of the original
give its rank and fixed dims, and its dynamic dims by name, so rules whose conditions need them match; the
rewrite keeps the dynamic dims dynamic (checked at another sequence length than validation used)."""

import numpy as np
import onnx
import onnx.helper as oh
from conftest import ort_run, save
from onnx import TensorProto
from onnx import numpy_helper as nh

from onnxfuse import OptimizeOptions, optimize

RNG = np.random.default_rng(0)
H = 32


def _model() -> onnx.ModelProto:
    """y = LayerNorm(Reshape(x @ w, [Shape(x)[0], Shape(x)[1], H]) + r), LayerNorm written out (opset 12)."""
    c = {"w": RNG.standard_normal((H, H)).astype(np.float32), "i0": np.array(0, np.int64),
         "i1": np.array(1, np.int64), "hid": np.array([H], np.int64), "ax": np.array([0], np.int64),
         "two": np.float32(2.0), "eps": np.float32(1e-5), "g": RNG.uniform(0.5, 1.5, H).astype(np.float32),
         "b": RNG.standard_normal(H).astype(np.float32)}
    nodes = [oh.make_node("MatMul", ["x", "w"], ["mm"]), oh.make_node("Shape", ["x"], ["shp"]),
             oh.make_node("Gather", ["shp", "i0"], ["d0"], axis=0), oh.make_node("Gather", ["shp", "i1"], ["d1"], axis=0),
             oh.make_node("Unsqueeze", ["d0"], ["u0"], axes=[0]), oh.make_node("Unsqueeze", ["d1"], ["u1"], axes=[0]),
             oh.make_node("Concat", ["u0", "u1", "hid"], ["tgt"], axis=0),
             oh.make_node("Reshape", ["mm", "tgt"], ["rs"]), oh.make_node("Add", ["rs", "r"], ["s"]),
             oh.make_node("ReduceMean", ["s"], ["mean"], axes=[-1]), oh.make_node("Sub", ["s", "mean"], ["d"]),
             oh.make_node("Pow", ["d", "two"], ["sq"]), oh.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             oh.make_node("Add", ["var", "eps"], ["ve"]), oh.make_node("Sqrt", ["ve"], ["std"]),
             oh.make_node("Div", ["d", "std"], ["n"]), oh.make_node("Mul", ["n", "g"], ["gn"]),
             oh.make_node("Add", ["gn", "b"], ["y"])]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", H]),
                                   oh.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", "seq", H])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", H])],
                      [nh.from_array(v, k) for k, v in c.items()])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 12)], ir_version=7)


def test_shape_inference_alone_does_not_know(tmp_path):
    inferred = onnx.shape_inference.infer_shapes(_model(), data_prop=True)
    known = {v.name: v for v in inferred.graph.value_info}
    assert "s" not in known or not known["s"].type.tensor_type.HasField("shape")


def test_rules_match_on_observed_shapes(tmp_path):
    src = save(_model(), tmp_path / "m.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False))
    assert r.validation == "passed"
    ops = [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node]
    assert "SkipLayerNormalization" in ops and "ReduceMean" not in ops
    for shape in ((1, 7, H), (3, 50, H)):  # the dynamic dims stayed dynamic
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "r": RNG.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(ort_run(onnx.load(src), feeds)[0], ort_run(onnx.load(str(tmp_path / "o.onnx")),
                                                                               feeds)[0], rtol=1e-4, atol=1e-4)


def test_without_validation_nothing_is_observed(tmp_path):
    """--no-validate runs nothing: the shapes stay unknown and the norm is not fused (no guessing)."""
    src = save(_model(), tmp_path / "m.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False, validate=False))
    assert "SkipLayerNormalization" not in [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node]
    assert r.validation.startswith("skipped")


def _strided_se() -> onnx.ModelProto:
    """x [1, 16, h, w] -> com.microsoft.FusedConv stride 32 (onnx infers no shape past it) = c;
    y = c * Sigmoid(GlobalAveragePool(c)): a squeeze-excitation product whose H, W follow x's by striding."""
    c = {"w": (RNG.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)}
    nodes = [oh.make_node("FusedConv", ["x", "w"], ["c"], domain="com.microsoft", strides=[32, 32], pads=[1, 1, 1, 1],
                          activation="Relu"),
             oh.make_node("GlobalAveragePool", ["c"], ["p"]), oh.make_node("Sigmoid", ["p"], ["g"]),
             oh.make_node("Mul", ["c", "g"], ["y"])]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "h", "w"])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                      [nh.from_array(v, k) for k, v in c.items()])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)], ir_version=8)


def test_a_dim_derived_by_striding_is_not_taken_as_fixed(tmp_path):
    """224 and 223 both give 7 at stride 32: moving the inputs by one would make H, W look fixed, and a rule that
    needs static H, W (se-gate-broadcast's constant scales) would write a model that fails at other sizes."""
    src = save(_strided_se(), tmp_path / "m.onnx")
    r = optimize(src, tmp_path / "o.onnx", OptimizeOptions(measure=False, only=["se-gate-broadcast"]))
    assert r.fired == {}, r.fired
    for hw in [(224, 224), (640, 320)]:
        x = RNG.standard_normal((1, 16, *hw)).astype(np.float32)
        assert ort_run(str(tmp_path / "o.onnx"), {"x": x})[0].shape == (1, 16, *((d - 1) // 32 + 1 for d in hw))
