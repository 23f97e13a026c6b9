"""patterns/exporter_forms.yaml: exporter spellings that onnxruntime cannot keep in its NCHWc layout, rewritten
exactly to ops it can: the spatial ReduceMean to GlobalAveragePool, Reshapes that give a value its own dims
back, and tf2onnx's Tile-based nearest upsample to Resize."""

import numpy as np
import onnx.helper as oh
import pytest

from .conftest import check_fires, check_misses, make_model, rand_feeds


def _attrs(node):
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


# ----- reducemean-global-pool ----------------------------------------------------------------------------------
def _reducemean(axes, x_shape=(1, 8, 5, 7), keepdims=1, opset=17):
    inits = {}
    if opset >= 18:
        node = oh.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=keepdims, name="rm")
        inits["ax"] = np.array(axes, np.int64)
    else:
        node = oh.make_node("ReduceMean", ["x"], ["y"], axes=list(axes), keepdims=keepdims, name="rm")
    nodes = [node, oh.make_node("Relu", ["y"], ["z"], name="relu")]
    return make_model(nodes, [("x", list(x_shape))], [("z", None)], inits, opset=opset)


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize(("axes", "x_shape"), [((2, 3), (1, 8, 5, 7)), ((-1, -2), (2, 3, 4, 6)),
                                               ((2,), (1, 4, 9)), ((2, 3, 4), (1, 2, 3, 4, 5))], ids=str)
def test_reducemean_global_pool_fires(opset, axes, x_shape):
    got = check_fires(_reducemean(axes, x_shape, opset=opset), "reducemean-global-pool",
                      ["GlobalAveragePool", "Relu"])
    assert list(got.graph.node[0].input) == ["x"]


def test_reducemean_global_pool_near_misses():
    # not every spatial axis, the channel axis too, or keepdims=0 (the output has no spatial axes)
    check_misses(_reducemean((2,)), "reducemean-global-pool", "require failed: norm_axes")
    check_misses(_reducemean((1, 2, 3)), "reducemean-global-pool", "require failed: norm_axes")
    check_misses(_reducemean((2, 3), keepdims=0), "reducemean-global-pool", "keepdims=0, rule needs 1")


# ----- reshape-restores-shape / reshape-same-shape -------------------------------------------------------------
def _squeeze_reshape(first="Squeeze", target=(1, 6, 1, 1), x_shape=(1, 6, 1, 1), other_reader=False):
    inits = {"s": np.array(target, np.int64)}
    if first == "Squeeze":
        inner = oh.make_node("Squeeze", ["x", "sa"], ["q"], name="sq")
        inits["sa"] = np.array([2, 3], np.int64)
    elif first == "Flatten":
        inner = oh.make_node("Flatten", ["x"], ["q"], name="fl")
    else:
        inner = oh.make_node("Reshape", ["x", "s0"], ["q"], name="r0")
        inits["s0"] = np.array([x_shape[0], -1], np.int64)
    nodes = [oh.make_node("Relu", ["x0"], ["x"], name="relu"), inner,
             oh.make_node("Reshape", ["q", "s"], ["r"], name="rs"),
             oh.make_node("Sigmoid", ["r"], ["y"], name="sig")]
    outputs = [("y", None)]
    if other_reader:
        nodes.append(oh.make_node("Neg", ["q"], ["probe"], name="probe"))
        outputs.append(("probe", None))
    return make_model(nodes, [("x0", list(x_shape))], outputs, inits)


@pytest.mark.parametrize("first", ["Squeeze", "Flatten", "Reshape"])
def test_reshape_restores_shape_fires(first):
    got = check_fires(_squeeze_reshape(first), "reshape-restores-shape", ["Relu", "Sigmoid"])
    assert list(got.graph.node[1].input) == [got.graph.node[0].output[0]]


def test_reshape_restores_shape_keeps_a_squeeze_others_read():
    check_fires(_squeeze_reshape(other_reader=True), "reshape-restores-shape", ["Relu", "Squeeze", "Sigmoid", "Neg"])


def test_reshape_restores_shape_near_misses():
    # back to other dims ([1, 1, 6, 1]: the channels moved) or from a symbolic batch
    check_misses(_squeeze_reshape(target=(1, 1, 6, 1)), "reshape-restores-shape", "require failed: ints(Y.dims)")
    m = _squeeze_reshape(first="Flatten", target=(-1, 6, 1, 1))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    check_misses(m, "reshape-restores-shape", "require failed: unknown_dims(X.dims) == 0")


def _reshape(target, x_shape=(1, 8, 1, 1)):
    nodes = [oh.make_node("Relu", ["x0"], ["x"], name="relu"),
             oh.make_node("Reshape", ["x", "s"], ["r"], name="rs"),
             oh.make_node("Sigmoid", ["r"], ["y"], name="sig")]
    return make_model(nodes, [("x0", list(x_shape))], [("y", None)], {"s": np.array(target, np.int64)})


@pytest.mark.parametrize("target", [(1, 8, 1, 1), (1, -1, 1, 1), (0, 8, 1, 1)], ids=str)
def test_reshape_same_shape_fires(target):
    check_fires(_reshape(target), "reshape-same-shape", ["Relu", "Sigmoid"])


def test_reshape_same_shape_near_miss():
    check_misses(_reshape((1, 1, 8, 1)), "reshape-same-shape", "require failed: ints(Y.dims) == ints(X.dims)")


# ----- tile-nearest-upsample -----------------------------------------------------------------------------------
def _upsample(x_shape=(1, 4, 3, 5), sh=2, sw=2, tail=(0, 3, 1, 2), r1_target=None):
    n, c, h, w = x_shape
    inits = {"a1": np.array([3], np.int64), "a2": np.array([3], np.int64),
             "r1": np.array([1, 1, 1, sh, 1], np.int64), "r2": np.array([1, 1, 1, sw, 1], np.int64),
             "s1": np.array(r1_target or [n, h * sh, w, c], np.int64),
             "s2": np.array([n, h * sh, w * sw, c], np.int64)}
    nodes = [oh.make_node("Relu", ["x0"], ["x"], name="relu"),
             oh.make_node("Unsqueeze", ["x", "a1"], ["u1"], name="u1"),
             oh.make_node("Tile", ["u1", "r1"], ["t1"], name="t1"),
             oh.make_node("Transpose", ["t1"], ["p1"], perm=[0, 2, 3, 4, 1], name="p1"),
             oh.make_node("Reshape", ["p1", "s1"], ["q1"], name="q1"),
             oh.make_node("Unsqueeze", ["q1", "a2"], ["u2"], name="u2"),
             oh.make_node("Tile", ["u2", "r2"], ["t2"], name="t2"),
             oh.make_node("Reshape", ["t2", "s2"], ["q2"], name="q2"),
             oh.make_node("Transpose", ["q2"], ["y"], perm=list(tail), name="back")]
    return make_model(nodes, [("x0", list(x_shape))], [("y", None)], inits)


@pytest.mark.parametrize(("x_shape", "sh", "sw"), [((1, 4, 3, 5), 2, 2), ((2, 3, 4, 4), 3, 2), ((1, 16, 8, 8), 2, 1)],
                         ids=str)
def test_tile_nearest_upsample_fires(x_shape, sh, sw):
    m = _upsample(x_shape, sh, sw)
    got = check_fires(m, "tile-nearest-upsample", ["Relu", "Resize"], feeds=rand_feeds(m), rtol=0, atol=0)
    resize = got.graph.node[1]
    assert _attrs(resize) == {"mode": b"nearest", "coordinate_transformation_mode": b"asymmetric",
                              "nearest_mode": b"floor"}
    assert resize.input[1] == ""
    scales = {t.name: t for t in got.graph.initializer}[resize.input[2]]
    assert list(np.frombuffer(scales.raw_data, np.float32)) == [1, 1, sh, sw]


def test_tile_nearest_upsample_near_misses():
    # the last Transpose not back to NCHW; the first Reshape not [N, H*sh, W, C] (rows interleaved otherwise)
    check_misses(_upsample(tail=(0, 3, 2, 1)), "tile-nearest-upsample", None)
    check_misses(_upsample(r1_target=[1, 3, 10, 4]), "tile-nearest-upsample", "require failed: ints(r1.dims)")
