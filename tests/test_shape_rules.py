"""Squeeze/Unsqueeze/ReduceMean clean-ups (patterns/shape.yaml): exact rewrites, and none where they would not be."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, optimize

OPTS = OptimizeOptions(measure=False, only=["squeeze-unsqueeze", "squeeze-unsqueeze-reshape", "reducemean-unsqueeze",
                                            "reducemean-size1"])


def _pair(x_shape, a, b, out_shape):
    nodes = [oh.make_node("Squeeze", ["x", "a"], ["s"], name="sq"),
             oh.make_node("Unsqueeze", ["s", "b"], ["y"], name="usq")]
    return make_model(nodes, [("x", x_shape)], [("y", out_shape)],
                      {"a": np.array(a, np.int64), "b": np.array(b, np.int64)})


def _optimize(tmp_path, model):
    src = save(model, tmp_path / "in.onnx")
    out = tmp_path / "out.onnx"
    return optimize(src, str(out), OPTS), onnx.load(str(out))


@pytest.mark.parametrize(("x_shape", "a", "b", "out_shape", "ops"), [
    ([1, "n", 3], [0], [-3], [1, "n", 3], ["Identity"]),   # same axis, negative on one side: x itself
    ([1, "n", 3], [0], [2], ["n", 3, 1], ["Reshape"]),      # moved: one Reshape (one unknown dim)
    ([1, "n", "m"], [0], [2], ["n", "m", 1], ["Squeeze", "Unsqueeze"]),  # two unknown dims: no Reshape
])
def test_squeeze_then_unsqueeze(tmp_path, x_shape, a, b, out_shape, ops):
    r, got = _optimize(tmp_path, _pair(x_shape, a, b, out_shape))
    assert op_types(got) == ops
    x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 5 for d in x_shape]).astype(np.float32)
    want = np.expand_dims(np.squeeze(x, tuple(a)), tuple(b))
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], want)


def test_reducemean_then_unsqueeze_keeps_dims_and_a_size_one_mean_is_the_input(tmp_path):
    nodes = [oh.make_node("ReduceMean", ["x"], ["m"], name="mean_c", axes=[1], keepdims=0),
             oh.make_node("Unsqueeze", ["m", "b"], ["y"], name="usq"),
             oh.make_node("ReduceMean", ["y"], ["z"], name="mean_1", axes=[-2], keepdims=1)]
    model = make_model(nodes, [("x", ["n", 4, 3])], [("z", ["n", 1, 3])], {"b": np.array([1], np.int64)}, opset=15)
    r, got = _optimize(tmp_path, model)
    assert r.fired == {"reducemean-unsqueeze": 1, "reducemean-size1": 1}
    assert op_types(got) == ["ReduceMean", "Identity"]
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], x.mean(axis=1, keepdims=True), rtol=1e-6)


def test_reducemean_over_a_dim_that_is_not_one_stays(tmp_path):
    nodes = [oh.make_node("ReduceMean", ["x"], ["z"], name="mean", axes=[1], keepdims=1)]
    model = make_model(nodes, [("x", [2, 4, 3])], [("z", [2, 1, 3])], opset=15)
    r, got = _optimize(tmp_path, model)
    assert r.fired == {} and op_types(got) == ["ReduceMean"]

