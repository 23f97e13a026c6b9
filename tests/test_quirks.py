"""Real-world model quirks (issue 13): the bar for an input is "onnxruntime loads it".

Each accepted quirk is a small model that onnxruntime runs but that is malformed in some way (onnx.checker
rejects it, or its declared types disagree with the graph). It must optimize: a fusion fires, the output passes
onnx.checker, loads in onnxruntime, gives the original's numbers, and the repair is reported (text and --json).
Each refused quirk is one onnxruntime refuses (or, for a shapeless graph input, one no repair can make pass the
checker): one clear line on stderr, exit code 1, nothing written. docs/errors.md lists both.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from conftest import ort_run, save
from onnx import TensorProto, numpy_helper

from onnxfuse import OptimizeOptions, optimize

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)
X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return oh.make_tensor_value_info(name, elem, shape)


def conv_relu(opset=17, ir=8, names=True) -> onnx.ModelProto:
    """x -> Conv -> Relu -> y: conv-relu fuses it into com.microsoft.FusedConv."""
    nodes = [oh.make_node("Conv", ["x", "w", "b"], ["c"], name="conv" if names else "", pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["c"], ["y"], name="relu" if names else "")]
    g = oh.make_graph(nodes, "g", [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])],
                      [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)], ir_version=ir)


def conv_bn_relu(opset=17, ir=8) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu: conv-bn-fold needs the BN parameters constant, conv-relu does not."""
    rng = np.random.default_rng(1)
    inits = {"w": W, "scale": rng.uniform(0.5, 1.5, 4), "bias": rng.standard_normal(4),
             "mean": rng.standard_normal(4), "var": rng.uniform(0.5, 1.5, 4)}
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"], name="bn"),
             oh.make_node("Relu", ["n"], ["y"], name="relu")]
    g = oh.make_graph(nodes, "g", [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])],
                      [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)], ir_version=ir)


def bias_gelu(import_ms=True) -> onnx.ModelProto:
    """MatMul -> Add(bias) -> com.microsoft.Gelu: bias-gelu fuses the Add into com.microsoft.BiasGelu."""
    rng = np.random.default_rng(2)
    nodes = [oh.make_node("MatMul", ["x", "w"], ["m"], name="mm"), oh.make_node("Add", ["m", "b"], ["a"], name="add"),
             oh.make_node("Gelu", ["a"], ["y"], name="gelu", domain="com.microsoft")]
    g = oh.make_graph(nodes, "g", [_vi("x", [2, 8])], [_vi("y", [2, 16])],
                      [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
                       numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")])
    ops = [oh.make_opsetid("", 17)] + ([oh.make_opsetid("com.microsoft", 1)] if import_ms else [])
    return oh.make_model(g, opset_imports=ops, ir_version=8)


# ----- quirks onnxruntime loads: repaired, optimized, reported ---------------------------------------------------
def output_without_shape():
    m = conv_relu()
    m.graph.output[0].type.tensor_type.ClearField("shape")  # the issue's model
    return m


def output_without_type():
    m = conv_relu()
    m.graph.output[0].ClearField("type")
    return m


def contrib_output_without_shape():
    m = bias_gelu()  # onnx has no schema for com.microsoft.Gelu: the shape comes from onnxruntime
    m.graph.output[0].type.tensor_type.ClearField("shape")
    return m


def output_stale_shape():
    m = conv_relu()
    m.graph.output[0].CopyFrom(_vi("y", [1, 4, 9, 9]))
    return m


def output_negative_dims():
    m = conv_relu()
    m.graph.output[0].CopyFrom(_vi("y", [-1, 4, -1, -1]))  # hand-written "dynamic" dims
    return m


def value_info_twice():
    m = conv_relu()
    m.graph.value_info.extend([_vi("c", [1, 4, 8, 8]), _vi("c", [1, 4, 8, 8])])
    return m


def value_info_stale():
    """A stale value_info would make folding compute Shape(y) as [1, 4, 9, 9]; re-inferred, it folds right."""
    m = conv_relu()
    m.graph.node.append(oh.make_node("Shape", ["y"], ["s"], name="shape"))
    m.graph.output.append(_vi("s", [4], TensorProto.INT64))
    m.graph.value_info.extend([_vi("c", [1, 4, 9, 9]), _vi("y", [1, 4, 9, 9])])
    return m


def value_info_conflicting_twice():
    m = conv_relu()
    m.graph.value_info.extend([_vi("c", [1, 4, 8, 8]), _vi("c", [1, 5, 8, 8])])
    return m


def value_info_dangling():
    m = conv_relu()
    m.graph.value_info.extend([_vi("removed_by_surgery", [3])])
    return m


def unused_initializers():
    m = conv_relu()
    m.graph.initializer.extend([numpy_helper.from_array(np.zeros((64, 64), np.float32), "old_fc.weight"),
                                numpy_helper.from_array(np.zeros(3, np.int64), "old_shape")])
    return m


def initializers_as_inputs():
    """IR >= 4: an initializer listed as a graph input is an overridable input whose default is its value
    (torch's keep_initializers_as_inputs, old converters). FusedConv takes the bias as it is."""
    m = conv_relu()
    m.graph.input.extend([_vi("b", [4])])
    return m


def ir3_initializers_as_inputs():
    """IR 3: every initializer must be an input, and onnxruntime treats them as constants (refuses a feed)."""
    m = conv_bn_relu(opset=8, ir=3)
    m.graph.input.extend([_vi("w", [4, 3, 3, 3])] + [_vi(n, [4]) for n in ("scale", "bias", "mean", "var")])
    return m


def ir_older_than_opset():
    return conv_relu(opset=17, ir=6)  # opset 17 needs IR 8


def ir3_initializers_not_inputs():
    return conv_relu(opset=17, ir=3)  # checker: "w in initializer but not in graph input"


def ir_version_zero():
    return conv_relu(ir=0)


def unnamed_nodes():
    return conv_relu(names=False)


def opset_imported_twice():
    m = conv_relu()
    m.opset_import.extend([oh.make_opsetid("ai.onnx", 13)])  # onnxruntime uses the last: 13
    return m


def contrib_domain_not_imported():
    return bias_gelu(import_ms=False)


def node_domain_ai_onnx():
    m = conv_relu()
    m.graph.node[0].domain = "ai.onnx"
    return m


def graph_without_name():
    m = conv_relu()
    m.graph.name = ""
    return m


def initializer_twice():
    m = conv_relu()
    m.graph.initializer.append(numpy_helper.from_array(np.full(4, 0.25, np.float32), "b"))  # onnxruntime: last
    return m


def initializer_raw_and_typed():
    m = conv_relu()
    m.graph.initializer[1].float_data.extend([100.0] * 4)  # onnxruntime reads raw_data
    return m


def metadata_key_twice():
    m = conv_relu()
    m.metadata_props.add(key="author", value="a")
    m.metadata_props.add(key="author", value="b")
    return m


CNN_FEEDS = {"x": X}
GELU_FEEDS = {"x": np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)}

# (builder, fragment of the repair note, a rule that must fire, feeds)
ACCEPTED = [
    (output_without_shape, "graph output 'y' had no shape: set to [1, 4, 8, 8]", "conv-relu", CNN_FEEDS),
    (output_without_type, "graph output 'y' had no type: set to float32 [1, 4, 8, 8]", "conv-relu", CNN_FEEDS),
    (contrib_output_without_shape, "graph output 'y' had no shape: set to [2, 16] (from onnxruntime)", "bias-gelu",
     GELU_FEEDS),
    (output_stale_shape, "graph output 'y' declared shape [1, 4, 9, 9], but it is [1, 4, 8, 8]", "conv-relu",
     CNN_FEEDS),
    (output_negative_dims, "declared [1, 4, 8, 8]", "conv-relu", CNN_FEEDS),
    (value_info_twice, "value_info listed more than once for c: kept one", "conv-relu", CNN_FEEDS),
    (value_info_stale, "value_info contradicting the graph dropped, shapes re-inferred: 'c' ([1, 4, 9, 9]; the graph "
     "gives [1, 4, 8, 8])", "conv-relu", CNN_FEEDS),
    (value_info_conflicting_twice, "'c' ([1, 5, 8, 8]; the graph gives [1, 4, 8, 8])", "conv-relu", CNN_FEEDS),
    (value_info_dangling, "value_info for value(s) nothing defines dropped (removed_by_surgery)", "conv-relu",
     CNN_FEEDS),
    (unused_initializers, "2 initializer(s) nothing reads removed (old_fc.weight, old_shape)", "conv-relu",
     CNN_FEEDS),
    (initializers_as_inputs, "1 initializer(s) are also graph inputs (b): kept as inputs", "conv-relu", CNN_FEEDS),
    (ir3_initializers_as_inputs, "(w, scale, bias, mean, ... (5 in all)) are constants below IR 4", "conv-bn-fold",
     CNN_FEEDS),
    (ir_older_than_opset, "ir_version 6 (older than opset ai.onnx 17 needs): set to 8", "conv-relu", CNN_FEEDS),
    (ir3_initializers_not_inputs, "ir_version 3 (older than opset ai.onnx 17 needs): set to 8", "conv-relu",
     CNN_FEEDS),
    (ir_version_zero, "ir_version 0 (unset): set to 8", "conv-relu", CNN_FEEDS),
    (unnamed_nodes, "2 unnamed node(s) named after their op (Conv_0, Relu_0)", "conv-relu", CNN_FEEDS),
    (opset_imported_twice, "opset import for domain 'ai.onnx' listed 2 times (versions 17, 13): kept 13", "conv-relu",
     CNN_FEEDS),
    (contrib_domain_not_imported, "nodes use domain 'com.microsoft' without an opset import: imported version 1",
     "bias-gelu", GELU_FEEDS),
    (node_domain_ai_onnx, "1 node(s) name the default domain 'ai.onnx'", "conv-relu", CNN_FEEDS),
    (graph_without_name, "graph without a name: named 'main_graph'", "conv-relu", CNN_FEEDS),
    (initializer_twice, "initializer(s) listed more than once (b): kept the last", "conv-relu", CNN_FEEDS),
    (initializer_raw_and_typed, "holding both raw_data and typed data (b): kept raw_data", "conv-relu", CNN_FEEDS),
    (metadata_key_twice, "metadata key(s) listed more than once (author): kept the last", "conv-relu", CNN_FEEDS),
]


def _checker_error(m: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError as e:
        return str(e).splitlines()[0]
    return None


def test_at_least_ten_quirks_each_way():
    assert len(ACCEPTED) >= 10 and len(REFUSED) >= 10


@pytest.mark.parametrize("build,note,rule,feeds", ACCEPTED, ids=[c[0].__name__ for c in ACCEPTED])
def test_quirk_onnxruntime_loads_is_repaired_and_optimized(cli, tmp_path, build, note, rule, feeds):
    m = build()
    src = save(m, tmp_path / "quirk.onnx")
    original = open(src, "rb").read()
    want = ort_run(src, feeds)  # onnxruntime loads the original: that is the bar
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--json")
    assert code == 0, stderr
    assert stderr == ""
    result = json.loads(stdout)
    assert any(note in line for line in result["load"]["repairs"] + result["load"]["notes"]), result["load"]
    assert rule in result["fired"], result["fired"]
    assert result["validation"]["status"].startswith("passed")
    got_model = onnx.load(str(out))
    assert _checker_error(got_model) is None
    for have, ref in zip(ort_run(out, feeds), want, strict=True):
        np.testing.assert_allclose(have, ref, rtol=1e-4, atol=1e-5)
    assert open(src, "rb").read() == original  # repairs happen in the loaded copy only


def test_issue_model_text_report(cli, tmp_path):
    """The issue's model: its output has no `shape` field. It used to be refused by onnx.checker."""
    src = save(output_without_shape(), tmp_path / "noshape.onnx")
    assert "Field 'shape' of 'type' is required but missing" in _checker_error(onnx.load(src))
    code, stdout, stderr = cli("optimize", src, tmp_path / "out.onnx", "--details")
    assert code == 0 and stderr == ""
    assert "repaired on load: graph output 'y' had no shape: set to [1, 4, 8, 8] (from shape inference)" in stdout
    assert "validation: passed" in stdout
    y = onnx.load(str(tmp_path / "out.onnx")).graph.output[0]
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [1, 4, 8, 8]


def test_stale_value_info_does_not_mislead_folding(tmp_path):
    src = save(value_info_stale(), tmp_path / "stale.onnx")
    r = optimize(src, str(tmp_path / "out.onnx"), OptimizeOptions(measure=False))
    assert not r.rolled_back and r.fired.get("conv-relu") == 1
    got = onnx.load(str(tmp_path / "out.onnx"))
    assert "Shape" not in [n.op_type for n in got.graph.node]  # folded: the dims are static once re-inferred
    np.testing.assert_array_equal(ort_run(got, CNN_FEEDS)[1], [1, 4, 8, 8])


def test_overridable_initializers_stay_overridable(tmp_path):
    """onnxruntime lets a caller feed an initializer listed as an input (IR >= 4): the output must too, with the
    same result; BatchNormalization is not folded into the Conv when its parameters are such inputs."""
    src = save(initializers_as_inputs(), tmp_path / "ovr.onnx")
    out = tmp_path / "out.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False))
    assert r.fired == {"conv-relu": 1}
    feeds = {**CNN_FEEDS, "b": np.full(4, 3.0, np.float32)}
    for have, ref in zip(ort_run(out, feeds), ort_run(src, feeds), strict=True):
        np.testing.assert_allclose(have, ref, rtol=1e-4, atol=1e-5)
    sess = ort.InferenceSession(str(out), ort.SessionOptions(), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_overridable_initializers()] == ["b"]

    m = conv_bn_relu()
    m.graph.input.extend([_vi(n, [4]) for n in ("scale", "bias", "mean", "var")])
    src = save(m, tmp_path / "bn.onnx")
    r = optimize(src, str(out), OptimizeOptions(measure=False))
    assert "conv-bn-fold" not in r.fired and "4 initializer(s) are also graph inputs" in r.load_notes[0]
    feeds = {**CNN_FEEDS, "var": np.full(4, 2.0, np.float32)}
    np.testing.assert_allclose(ort_run(out, feeds)[0], ort_run(src, feeds)[0], rtol=1e-4, atol=1e-5)


def test_ir3_initializers_become_constants(tmp_path):
    """Below IR 4 onnxruntime does not let initializers listed as inputs be fed: they are constants, and the
    output (IR 4) says so by not listing them, so BatchNormalization folds."""
    src = save(ir3_initializers_as_inputs(), tmp_path / "ir3.onnx")
    so = ort.SessionOptions()
    with pytest.raises(Exception, match="Invalid input name"):
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(
            None, {**CNN_FEEDS, "bias": np.zeros(4, np.float32)})
    r = optimize(src, str(tmp_path / "out.onnx"), OptimizeOptions(measure=False))
    assert r.fired.get("conv-bn-fold") == 1 and r.fired.get("conv-relu") == 1
    got = onnx.load(str(tmp_path / "out.onnx"))
    assert got.ir_version == 4 and [i.name for i in got.graph.input] == ["x"]


def test_repaired_model_is_validated_even_when_nothing_fires(tmp_path):
    src = save(output_without_shape(), tmp_path / "m.onnx")
    r = optimize(src, str(tmp_path / "out.onnx"), OptimizeOptions(measure=False, only=["erf-gelu"]))
    assert r.applications == [] and r.repairs and r.validation == "passed"
    assert _checker_error(onnx.load(str(tmp_path / "out.onnx"))) is None


def test_shapeless_input_with_static_shape(cli, tmp_path):
    """A graph input without a shape is refused (see REFUSED) unless --static --shape gives it one."""
    src = save(input_without_shape(), tmp_path / "in.onnx")
    code, _, stderr = cli("optimize", src, tmp_path / "out.onnx", "--static", "--shape", "x:1x3x8x8")
    assert code == 0, stderr
    assert ort_run(tmp_path / "out.onnx", CNN_FEEDS)[0].shape == (1, 4, 8, 8)


def test_external_data_model_with_quirks(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    m = conv_relu(names=False)
    m.graph.output[0].type.tensor_type.ClearField("shape")
    onnx.save(m, str(d / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    out = tmp_path / "out.onnx"
    r = optimize(str(d / "m.onnx"), str(out), OptimizeOptions(measure=False))
    assert len(r.repairs) == 2 and r.fired == {"conv-relu": 1}
    np.testing.assert_allclose(ort_run(out, CNN_FEEDS)[0], ort_run(str(d / "m.onnx"), CNN_FEEDS)[0], rtol=1e-4,
                               atol=1e-5)


# ----- quirks onnxruntime refuses (and the one no repair fixes): one clear line ---------------------------------
def no_ir_version():
    m = conv_relu()
    m.ClearField("ir_version")
    return m


def no_opset_import():
    m = conv_relu()
    m.ClearField("opset_import")
    return m


def ir_version_too_new():
    m = conv_relu()
    m.ir_version = 99
    return m


def duplicate_node_names():
    m = conv_relu()
    for n in m.graph.node:
        n.name = "n"
    return m


def value_info_wrong_element_type():
    m = conv_relu()
    m.graph.value_info.extend([_vi("c", [1, 4, 8, 8], TensorProto.INT64)])
    return m


def output_wrong_element_type():
    m = conv_relu()
    m.graph.output[0].CopyFrom(_vi("y", [1, 4, 8, 8], TensorProto.DOUBLE))
    return m


def output_undefined_element_type():
    m = conv_relu()
    m.graph.output[0].type.tensor_type.elem_type = 0
    return m


def unknown_attribute():
    m = conv_relu()
    m.graph.node[1].attribute.extend([oh.make_attribute("foo", 1)])
    return m


def truncated_initializer():
    m = conv_relu()
    m.graph.initializer[1].raw_data = m.graph.initializer[1].raw_data[:8]
    return m


def input_listed_twice():
    m = conv_relu()
    m.graph.input.extend([_vi("x", [1, 3, 8, 8])])
    return m


def input_without_shape():
    m = conv_relu()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    return m


def output_rank_unknowable():
    """Reshape to a shape fed at run time, declared without a shape: onnxruntime runs it, but no inference
    knows its rank, and onnx.checker needs a shape on graph outputs."""
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Reshape", ["r", "s"], ["y"], name="rs")]
    g = oh.make_graph(nodes, "g", [_vi("x", [6]), _vi("s", [None], TensorProto.INT64)], [_vi("y", None)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    m.graph.output[0].type.tensor_type.ClearField("shape")
    return m


# (builder, fragment of the one line, whether onnxruntime loads the original)
REFUSED = [
    (no_ir_version, "invalid model: onnxruntime cannot load it (Missing model IR version.)", False),
    (no_opset_import, "onnxruntime cannot load it (Missing opset in the model.", False),
    (ir_version_too_new, "onnxruntime cannot load it (Unsupported model IR version: 99", False),
    (duplicate_node_names, "onnxruntime cannot load it (This is an invalid model. Error: two nodes with same node "
     "name (n).)", False),
    (value_info_wrong_element_type, "onnxruntime cannot load it (Type Error: Type (tensor(int64)) of output arg (c)",
     False),
    (output_wrong_element_type, "onnxruntime cannot load it (Type Error: Type (tensor(double)) of output arg (y)",
     False),
    (output_undefined_element_type, "onnxruntime cannot load it (Failed to load model with error: Invalid tensor "
     "data type 0.)", False),
    (unknown_attribute, "Unrecognized attribute: foo for operator Relu)", False),
    (truncated_initializer, "onnxruntime cannot load it (Deserialize tensor b failed", False),
    (input_listed_twice, "onnxruntime cannot load it (Error: Duplicate definition-site for (x).)", False),
    (input_without_shape, "graph input 'x' has no shape: onnxruntime accepts any rank there, but onnx.checker "
     "requires a shape and onnxfuse cannot tell which rank the model needs (hint: declare its shape in the model, "
     "or pass --static --shape x:DIMS", True),
    (output_rank_unknowable, "graph output 'y' has no shape and neither onnx's nor onnxruntime's shape inference "
     "knows its rank", True),
]


def _ort_loads(path: str) -> bool:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


@pytest.mark.parametrize("build,fragment,ort_loads", REFUSED, ids=[c[0].__name__ for c in REFUSED])
@pytest.mark.parametrize("validate", [True, False], ids=["validate", "no-validate"])
def test_quirk_refused_in_one_line(cli, tmp_path, monkeypatch, build, fragment, ort_loads, validate):
    monkeypatch.chdir(tmp_path)
    src = save(build(), tmp_path / "quirk.onnx")
    assert _ort_loads(src) == ort_loads
    before = set(os.listdir(tmp_path))
    code, stdout, stderr = cli("optimize", src, "out.onnx", *([] if validate else ["--no-validate"]))
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"onnxfuse: error: {src}: ") and fragment in lines[0], lines[0]
    assert set(os.listdir(tmp_path)) == before  # nothing written, no temporary left
