"""The shape interpreter behind the concepts (concepts/interpreter.py, concepts/layout_proof.py): a dim shape inference made up is worked out from
its producer, and one it can only guess stays a guess, also through a broadcast against a fact of 1."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto

from onnxfuse.concepts.interpreter import Interpreter, Sizes, static_dims
from onnxfuse.ir import Model


def _vit_embeddings() -> onnx.ModelProto:
    """ViT's embeddings: patches from a Conv (no shape rule here: its dims are guesses) plus the [1, 17, 64]
    position table; inference names the batch unk__N and takes 17 from the table."""
    w = np.zeros((64, 3, 4, 4), np.float32)
    pos = np.zeros((1, 17, 64), np.float32)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], strides=[4, 4]),
             oh.make_node("Shape", ["c"], ["cs"], start=0, end=1),  # the flatten target read at run time
             oh.make_node("Concat", ["cs", "tail"], ["flat"], axis=0),
             oh.make_node("Reshape", ["c", "flat"], ["f"]),
             oh.make_node("Transpose", ["f"], ["p"], perm=[0, 2, 1]),
             oh.make_node("Add", ["p", "pos"], ["y"])]
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(pos, "pos"),
             onnx.numpy_helper.from_array(np.array([64, -1], np.int64), "tail")]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 3, "h", "w"])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return onnx.shape_inference.infer_shapes(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]))


def test_a_broadcast_against_a_fact_of_one_keeps_the_guess():
    model = _vit_embeddings()
    m = Model(model, ".")
    g = next(iter(m.graphs()))
    shape = g.type_of("y").shape
    assert isinstance(shape[0], str) and shape[0] not in m.input_dim_names and shape[1:] == (17, 64), shape
    it = Interpreter(g, Sizes(static_dims(g), 0))
    out = it.shape_of("y")
    # the batch is the Conv's (a guess here), not the table's 1: the result is a guess, never batch 1 as a fact
    assert out is not None and out[1:] == (17, 64)
    assert "y" in it.guessed


def test_a_layout_proof_is_proved_again_once_the_graph_changes():
    """prove_layout is memoized while the graph is unchanged (Graph.revision); a rewrite changes the revision, and
    the same question then gets the answer of the graph as it is."""
    from onnxfuse.concepts.layout_proof import prove_layout
    from onnxfuse.concepts.layout_text import parse_layout
    from onnxfuse.concepts.shape_ops import Unprovable

    nodes = [oh.make_node("Reshape", ["x", "s4"], ["r"], name="split"),
             oh.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3], name="heads")]
    inits = [onnx.numpy_helper.from_array(np.array([0, 0, 4, 8], np.int64), "s4")]
    g_ = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 32])],
                       [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = Model(onnx.shape_inference.infer_shapes(oh.make_model(g_, opset_imports=[oh.make_opsetid("", 17)])), ".")
    g = next(iter(m.graphs()))
    heads = parse_layout("b s (n d) -> b n s d")
    assert prove_layout(g, "x", "y", frozenset(), heads).atoms["n"] == 4
    before = g.revision
    transpose = g.producer["y"]  # the heads' Transpose becomes one that keeps the order
    g.remove_node(transpose)
    g.add_node(oh.make_node("Transpose", ["r"], ["y"], perm=[0, 1, 2, 3], name="kept"), transpose.seq)
    assert g.revision > before
    try:
        prove_layout(g, "x", "y", frozenset(), heads)
    except Unprovable as e:
        assert "not arranged as" in str(e) or "do not fit" in str(e), e
    else:
        raise AssertionError("a stale proof was returned")
