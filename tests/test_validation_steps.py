"""A validation failure names the step that failed: onnxruntime cannot load the rewritten model, cannot run it,
or which output differs by how much. A file onnxruntime refuses is never called a numeric failure."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.load.loader import load_model
from onnxfuse.options import OptimizeOptions
from onnxfuse.validate.runtime import HOST
from onnxfuse.validate.validate import Validator


def _graph(nodes, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, None])], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _check(tmp_path, candidate: onnx.ModelProto):
    path = str(tmp_path / "m.onnx")
    onnx.save(_graph([helper.make_node("Relu", ["x"], ["y"])]), path)
    model, info = load_model(path)
    return Validator(path, model.proto, OptimizeOptions(), HOST).check(candidate, info)


def test_a_candidate_onnxruntime_cannot_load_says_load(tmp_path):
    bad = _graph([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", no_such_attribute=1.0)])
    out = _check(tmp_path, bad)
    assert not out.ok
    assert out.reason.startswith("onnxruntime cannot load the rewritten model at ORT level disable: ")
    assert "differs" not in out.reason and "onnxfuse-" not in out.reason  # no temporary path, no numbers


def test_a_candidate_onnxruntime_cannot_run_says_run(tmp_path):
    idx = numpy_helper.from_array(np.array([7], np.int64), "idx")  # past the end of axis 1 (3): fails at run time
    bad = _graph([helper.make_node("Gather", ["x", "idx"], ["g"], axis=1), helper.make_node("Relu", ["g"], ["y"])],
                 [idx])
    out = _check(tmp_path, bad)
    assert not out.ok
    assert out.reason.startswith("onnxruntime cannot run the rewritten model at ORT level disable: ")
    assert "failed to run" not in out.reason


def test_a_candidate_with_other_numbers_names_the_output_and_by_how_much(tmp_path):
    out = _check(tmp_path, _graph([helper.make_node("Abs", ["x"], ["y"])]))
    assert not out.ok
    assert out.reason.startswith("output 'y' differs at ORT level disable: max abs ")
    assert "needs tolerance" in out.reason
