"""patterns/shape.yaml: static dims of Shape become constants, no-op Casts go, Squeeze/Unsqueeze and
ReduceMean/Unsqueeze pairs collapse, Unsqueeze(Gather(shape, i)) becomes one Slice.
(tests/test_shape_rules.py runs some of these through the whole built-in set.)"""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from .conftest import check_fires, check_misses, fuse, make_model


def _dim(x_shape=(2, "n", 4), index=0, start=None, opset=17, i_input=False):
    attrs = {} if start is None else {"start": start}
    nodes = [oh.make_node("Shape", ["x"], ["s"], name="shape", **attrs),
             oh.make_node("Gather", ["s", "i"], ["d"], axis=0, name="dim"),
             oh.make_node("Unsqueeze", ["d", "ax0"], ["y"], name="u")]
    inputs = [("x", list(x_shape))] + ([("i", [], TensorProto.INT64)] if i_input else [])
    inits = {"ax0": np.array([0], np.int64)} | ({} if i_input else {"i": np.array(index, np.int64)})
    return make_model(nodes, inputs, [("y", [1], TensorProto.INT64)], inits, opset=opset)


@pytest.mark.parametrize(("index", "want"), [(0, 2), (2, 4), (-1, 4)])
def test_shape_dim_static_fires(index, want):
    # folding would turn this into a constant by itself: the rule is tested alone (fold=False)
    m = _dim(index=index)
    got = check_fires(m, "shape-dim-static", ["Unsqueeze"], fold=False, feeds={"x": np.zeros((2, 3, 4), np.float32)})
    (init,) = [numpy_helper.to_array(t) for t in got.graph.initializer if t.name == got.graph.node[0].input[0]]
    assert init.dtype == np.int64 and init.shape == () and int(init) == want


def test_shape_dim_static_keeps_the_shape_for_other_readers():
    m = _dim()
    m.graph.node.append(oh.make_node("Concat", ["s", "s"], ["both"], axis=0, name="other"))
    m.graph.output.append(oh.make_tensor_value_info("both", TensorProto.INT64, [6]))
    check_fires(m, "shape-dim-static", ["Shape", "Unsqueeze", "Concat"], fold=False,
                feeds={"x": np.zeros((2, 3, 4), np.float32)})


@pytest.mark.parametrize(("kw", "reason"), [
    ({"index": 1}, "require failed: X.dims[int(I)] >= 0"),  # a symbolic dim
    ({"start": 1, "opset": 15}, "require failed: default(s.start, 0) == 0"),  # Shape(x)[1:] shifts the index
    ({"i_input": True}, "I ('i') is not a constant"),
])
def test_shape_dim_static_near_misses(kw, reason):
    check_misses(_dim(**kw), "shape-dim-static", reason, fold=False)


def _cast(to, x_type=TensorProto.FLOAT, as_output=False):
    nodes = [oh.make_node("Cast", ["x"], ["c" if not as_output else "y"], to=to, name="cast")]
    if not as_output:
        nodes.append(oh.make_node("Neg", ["c"], ["y"], name="neg"))
    return make_model(nodes, [("x", [2, 3], x_type)], [("y", [2, 3], to)])


@pytest.mark.parametrize("x_type", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT16])
def test_cast_identity_fires(x_type):
    got = check_fires(_cast(x_type, x_type), "cast-identity", ["Neg"])
    assert list(got.graph.node[0].input) == ["x"]
    check_fires(_cast(x_type, x_type, as_output=True), "cast-identity", ["Identity"])


def test_cast_identity_near_miss():
    check_misses(_cast(TensorProto.FLOAT16), "cast-identity", "require failed: X.dtype == Y.dtype")


def _squeeze_pair(x_shape, a, b, out_shape, shared=False):
    nodes = [oh.make_node("Squeeze", ["x", "a"], ["s"], name="sq"),
             oh.make_node("Unsqueeze", ["s", "b"], ["u"], name="usq"),
             oh.make_node("Relu", ["u"], ["y"], name="relu")]
    outputs = [("y", out_shape)]
    if shared:
        nodes.append(oh.make_node("Neg", ["s"], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, [("x", x_shape)], outputs, {"a": np.array(a, np.int64), "b": np.array(b, np.int64)})


@pytest.mark.parametrize(("a", "b"), [([0], [0]), ([0], [-3]), ([0, 2], [2, 0])])
def test_squeeze_unsqueeze_fires(a, b):
    got = check_fires(_squeeze_pair([1, "n", 1], a, b, [1, "n", 1]), "squeeze-unsqueeze", ["Relu"])
    assert list(got.graph.node[0].input) == ["x"]


def test_squeeze_unsqueeze_keeps_a_squeeze_others_read():
    m = _squeeze_pair([1, "n", 3], [0], [0], [1, "n", 3], shared=True)
    check_fires(m, "squeeze-unsqueeze", ["Squeeze", "Relu", "Neg"])


def test_squeeze_unsqueeze_near_miss():
    check_misses(_squeeze_pair([1, "n", 3], [0], [2], ["n", 3, 1]), "squeeze-unsqueeze",
                 "require failed: norm_axes(A, X.rank) == norm_axes(B, X.rank)")


def test_squeeze_unsqueeze_reshape_fires():
    got = check_fires(_squeeze_pair([1, "n", 3], [0], [2], ["n", 3, 1]), "squeeze-unsqueeze-reshape",
                      ["Reshape", "Relu"])
    assert got.graph.node[0].input[0] == "x"


def test_squeeze_unsqueeze_reshape_near_miss():
    # two unknown dims: no single Reshape target
    check_misses(_squeeze_pair([1, "n", "m"], [0], [2], ["n", "m", 1]), "squeeze-unsqueeze-reshape",
                 "require failed: unknown_dims(Y.dims) <= 1")


def _mean_unsqueeze(axes=(1,), b=(1,), keepdims=0, opset=15):
    inits = {"b": np.array(b, np.int64)}
    if opset >= 18:  # axes became an input
        mean = oh.make_node("ReduceMean", ["x", "axes"], ["r"], keepdims=keepdims, name="mean")
        inits["axes"] = np.array(axes, np.int64)
    else:
        mean = oh.make_node("ReduceMean", ["x"], ["r"], axes=list(axes), keepdims=keepdims, name="mean")
    nodes = [mean, oh.make_node("Unsqueeze", ["r", "b"], ["y"], name="usq")]
    return make_model(nodes, [("x", [2, 4, 3])], [("y", None)], inits, opset=opset)


@pytest.mark.parametrize(("axes", "b"), [((1,), (1,)), ((1,), (-2,)), ((0, 2), (2, 0))])
def test_reducemean_unsqueeze_fires(axes, b):
    got = check_fires(_mean_unsqueeze(axes, b), "reducemean-unsqueeze", ["ReduceMean"])
    attrs = {a.name: oh.get_attribute_value(a) for a in got.graph.node[0].attribute}
    assert attrs == {"axes": list(axes), "keepdims": 1}


def test_reducemean_unsqueeze_near_misses():
    check_misses(_mean_unsqueeze((1,), (2,)), "reducemean-unsqueeze",
                 "require failed: norm_axes(r.axes, X.rank) == norm_axes(B, X.rank)")
    check_misses(_mean_unsqueeze((1,), (1,), keepdims=1), "reducemean-unsqueeze", "ReduceMean keepdims=1, rule needs 0")
    r, _ = fuse(_mean_unsqueeze(opset=18), "reducemean-unsqueeze")
    assert r.fired == {} and "outside the rule's range 13..17" in r.skipped[0].reason


def _mean(x_shape, axes, keepdims=1, opset=15):
    nodes = [oh.make_node("ReduceMean", ["x"], ["m"], axes=list(axes), keepdims=keepdims, name="mean"),
             oh.make_node("Neg", ["m"], ["y"], name="neg")]
    return make_model(nodes, [("x", x_shape)], [("y", None)], opset=opset)


@pytest.mark.parametrize("axes", [(1,), (-3,), (3,), (1, 3)])
def test_reducemean_size1_fires(axes):
    check_fires(_mean([2, 1, 4, 1], axes), "reducemean-size1", ["Neg"])


@pytest.mark.parametrize(("kw", "reason"), [
    ({"x_shape": [2, 1, 4, 1], "axes": (2,)}, "require failed: all(take(X.dims, norm_axes(Y.axes, X.rank)) == 1)"),
    ({"x_shape": [2, 1, 4, 1], "axes": (1, 2)}, "require failed: all(take(X.dims"),  # one axis is not size 1
    ({"x_shape": [2, "n", 4], "axes": (1,)}, "require failed: all(take(X.dims"),  # unknown: may not be 1
    ({"x_shape": [2, 1, 4], "axes": (1,), "keepdims": 0}, "ReduceMean keepdims=0, rule needs 1"),
])
def test_reducemean_size1_near_misses(kw, reason):
    check_misses(_mean(**kw), "reducemean-size1", reason)


def _gather_unsqueeze(index=-2, axes=(0,), v_rank=1):
    nodes = [oh.make_node("Shape", ["x"], ["s"], name="shape"),
             oh.make_node("Gather", ["s", "i"], ["g"], axis=0, name="gather"),
             oh.make_node("Unsqueeze", ["g", "a"], ["y"], name="usq")]
    inputs = [("x", ["b", "s", "h"])]
    if v_rank == 2:  # a rank-2 V (not a shape)
        nodes = [oh.make_node("Gather", ["x", "i"], ["g"], axis=0, name="gather"),
                 oh.make_node("Unsqueeze", ["g", "a"], ["y"], name="usq")]
        inputs = [("x", [3, 4], TensorProto.INT64)]
    return make_model(nodes, inputs, [("y", None, TensorProto.INT64)],
                      {"i": np.array(index, np.int64), "a": np.array(axes, np.int64)})


@pytest.mark.parametrize(("index", "start", "axes"), [(0, 0, (0,)), (2, 2, (0,)), (-2, 1, (0,)), (-3, 0, (-1,))])
def test_gather_unsqueeze_slice_fires(index, start, axes):
    got = check_fires(_gather_unsqueeze(index, axes), "gather-unsqueeze-slice", ["Shape", "Slice"],
                      feeds={"x": np.zeros((2, 5, 7), np.float32)})
    inits = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    sl = got.graph.node[1]
    assert [int(inits[n][0]) for n in sl.input[1:3]] == [start, start + 1]


@pytest.mark.parametrize(("kw", "reason"), [
    ({"index": 3}, "require failed: int(I) < V.dims[0]"),
    ({"index": -4}, "require failed: int(I) >= -V.dims[0]"),
    ({"axes": (0, 1)}, "require failed: norm_axes(A, 1) == [0]"),  # [1, 1], not [1]
    ({"v_rank": 2, "index": 0}, "V has rank 2, rule allows 1"),
])
def test_gather_unsqueeze_slice_near_misses(kw, reason):
    check_misses(_gather_unsqueeze(**kw), "gather-unsqueeze-slice", reason)


def _dims_slice(start, end, x_shape=("n", 4, 16)):
    nodes = [oh.make_node("Shape", ["x"], ["s"], name="shape"),
             oh.make_node("Slice", ["s", "st", "en"], ["d"], name="slice"),
             oh.make_node("Cast", ["d"], ["y"], name="cast", to=TensorProto.FLOAT)]
    return make_model(nodes, [("x", list(x_shape))], [("y", None)],
                      {"st": np.array(start, np.int64), "en": np.array(end, np.int64)})


@pytest.mark.parametrize(("start", "end", "want"), [([-1], [2**63 - 1], [16]), ([1], [3], [4, 16])])
def test_shape_slice_static_fires(start, end, want):
    """Shape(q)[-1:], as SDPA exports without a scale compute it: the static dims become a constant."""
    got = check_fires(_dims_slice(start, end), "shape-slice-static", ["Cast"], fold=False,
                      feeds={"x": np.zeros((3, 4, 16), np.float32)})
    (init,) = [numpy_helper.to_array(t) for t in got.graph.initializer if t.name == got.graph.node[0].input[0]]
    assert init.dtype == np.int64 and list(init) == want


def test_shape_slice_static_leaves_symbolic_dims():
    check_misses(_dims_slice([0], [2]), "shape-slice-static", "min(X.dims[int(ST[0]):int(EN[0])]) >= 0",
                 fold=False)
