"""Constant folding and If inlining: exact, bounded, and never applied to what is not known offline."""

import json
from dataclasses import replace

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, optimize

OPTS = OptimizeOptions(builtin=False, measure=False)


def _run(tmp_path, model, opts=OPTS):
    src = save(model, tmp_path / "in.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, opts)
    return r, onnx.load(out)


def test_shape_arithmetic_on_static_dims_folds_and_symbolic_dims_stay(tmp_path):
    # x: [batch, 4, 6] -> Reshape(x, Concat(Gather(Shape(x), 0), [24])): dim 0 symbolic, so only the
    # static part folds: Gather(Shape(x), [1, 2]) -> [4, 6], then Mul -> 24
    nodes = [
        oh.make_node("Shape", ["x"], ["s"], name="shape"),
        oh.make_node("Gather", ["s", "i0"], ["d0"], name="g0", axis=0),
        oh.make_node("Gather", ["s", "i12"], ["d12"], name="g12", axis=0),
        oh.make_node("ReduceProd", ["d12"], ["p"], name="prod", keepdims=1),
        oh.make_node("Concat", ["d0", "p"], ["target"], name="concat", axis=0),
        oh.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    m = make_model(nodes, [("x", ["batch", 4, 6])], [("y", ["batch", 24])],
                   {"i0": np.array([0], np.int64), "i12": np.array([1, 2], np.int64)})
    r, got = _run(tmp_path, m)
    assert r.cleanups == {"constant-fold": 2}  # g12 and prod; g0 reads a symbolic dim
    assert sorted(op_types(got)) == ["Concat", "Constant", "Gather", "Reshape", "Shape"]
    const = next(n for n in got.graph.node if n.op_type == "Constant")
    assert onnx.numpy_helper.to_array(const.attribute[0].t).tolist() == [24]
    x = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], x.reshape(3, 24))


def test_a_scale_read_from_static_dims_through_a_shape_slice_folds(tmp_path):
    """torch's SDPA export (Hugging Face Optimum's BERT, ViT, CLIP...): the scale is 1/sqrt(q.shape[-1]) read at
    run time, Sqrt(Cast(Slice(Shape(q), -1, INT64_MAX))), and its square root is applied to q. With q's head size
    static and its batch and length symbolic, the whole chain is one number; the dims that are not static stay
    (a Slice over them does not fold)."""
    T = onnx.TensorProto
    nodes = [oh.make_node("Shape", ["q"], ["s"]),
             oh.make_node("Slice", ["s", "m1", "big"], ["d"]),
             oh.make_node("Slice", ["s", "z", "one"], ["b"]),
             oh.make_node("Cast", ["d"], ["df"], to=T.FLOAT), oh.make_node("Sqrt", ["df"], ["r"]),
             oh.make_node("Div", ["c1", "r"], ["scale"]), oh.make_node("Sqrt", ["scale"], ["half"]),
             oh.make_node("Mul", ["q", "half"], ["y"])]
    m = make_model(nodes, [("q", ["batch", 4, "seq", 16])], [("y", None), ("b", None, T.INT64)],
                   {"m1": np.array([-1], np.int64), "big": np.array([2**63 - 1], np.int64),
                    "z": np.array([0], np.int64), "one": np.array([1], np.int64), "c1": np.array([1.0], np.float32)})
    r, got = _run(tmp_path, m)
    assert sorted(op_types(got)) == ["Constant", "Mul", "Shape", "Slice"]  # the batch Slice stays
    const = next(n for n in got.graph.node if n.op_type == "Constant")
    np.testing.assert_allclose(onnx.numpy_helper.to_array(const.attribute[0].t), [0.25 ** 0.5], rtol=1e-6)
    q = np.random.default_rng(0).standard_normal((2, 4, 3, 16)).astype(np.float32)
    y, b = ort_run(got, {"q": q})
    np.testing.assert_allclose(y, q * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(b, [2])


def _conv2d_same(h, w):
    """timm's Conv2dSame as TorchScript exports it (EfficientNet from TensorFlow): per spatial dim
    pad = max((ceil(x / s) - 1) * s + (k - 1) + 1 - x, 0) computed from Shape(x) in float (Div, Ceil), halves by
    integer division, Concat into Pad's pads, then a Conv without padding (k 3, stride 2)."""
    T = onnx.TensorProto
    c = {"one_f": np.array(1.0, np.float32), "s_f": np.array(2.0, np.float32), "kd_f": np.array(3.0, np.float32),
         "zero_f": np.array(0.0, np.float32), "two": np.array(2, np.int64), "z2": np.zeros(2, np.int64),
         "ax0": np.array([0], np.int64), "val": np.array(0.0, np.float32),
         "w": np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)}
    nodes = [oh.make_node("Shape", ["x"], ["shp"], name="shape")]
    halves, rests = [], []
    for i, d in ((2, "h"), (3, "w")):
        c[f"i{d}"] = np.array(i, np.int64)
        nodes += [oh.make_node("Gather", ["shp", f"i{d}"], [f"{d}0"], axis=0, name=f"{d}_dim"),
                  oh.make_node("Cast", [f"{d}0"], [f"{d}f"], to=T.FLOAT, name=f"{d}_float"),
                  oh.make_node("Div", [f"{d}f", "s_f"], [f"{d}q"], name=f"{d}_div"),
                  oh.make_node("Ceil", [f"{d}q"], [f"{d}c"], name=f"{d}_ceil"),
                  oh.make_node("Sub", [f"{d}c", "one_f"], [f"{d}c1"], name=f"{d}_sub1"),
                  oh.make_node("Mul", [f"{d}c1", "s_f"], [f"{d}m"], name=f"{d}_mul"),
                  oh.make_node("Add", [f"{d}m", "kd_f"], [f"{d}a"], name=f"{d}_add"),
                  oh.make_node("Sub", [f"{d}a", f"{d}f"], [f"{d}p"], name=f"{d}_sub"),
                  oh.make_node("Max", [f"{d}p", "zero_f"], [f"{d}pm"], name=f"{d}_max"),
                  oh.make_node("Cast", [f"{d}pm"], [f"{d}pi"], to=T.INT64, name=f"{d}_int"),
                  oh.make_node("Div", [f"{d}pi", "two"], [f"{d}half"], name=f"{d}_half"),
                  oh.make_node("Sub", [f"{d}pi", f"{d}half"], [f"{d}rest"], name=f"{d}_rest"),
                  oh.make_node("Unsqueeze", [f"{d}half", "ax0"], [f"{d}h1"], name=f"{d}_uh"),
                  oh.make_node("Unsqueeze", [f"{d}rest", "ax0"], [f"{d}r1"], name=f"{d}_ur")]
        halves.append(f"{d}h1")
        rests.append(f"{d}r1")
    nodes += [oh.make_node("Concat", ["z2", *halves, "z2", *rests], ["pads"], axis=0, name="pads"),
              oh.make_node("Pad", ["x", "pads", "val"], ["xp"], mode="constant", name="pad"),
              oh.make_node("Conv", ["xp", "w"], ["y"], strides=[2, 2], name="conv")]
    return make_model(nodes, [("x", [1, 3, h, w])], [("y", None)], c, opset=13)


def test_run_time_same_padding_folds_on_static_dims_and_stays_on_dynamic_ones(tmp_path):
    """EfficientNet's Conv2dSame computes TF 'same' padding from x.shape at run time: on a static input every
    step folds and the Pad reads constant pads ([0, 0, 1, 0, 0, 0, 1, 1] at 17 x 18: 2 rows, 1 column); with
    dynamic height and width the chain stays and is right at other sizes."""
    r, got = _run(tmp_path, _conv2d_same(17, 18))
    assert sorted(op_types(got)) == ["Constant", "Conv", "Pad"], op_types(got)
    pads = next(n for n in got.graph.node if n.op_type == "Constant")
    assert onnx.numpy_helper.to_array(pads.attribute[0].t).tolist() == [0, 0, 1, 0, 0, 0, 1, 1]
    x = np.random.default_rng(1).standard_normal((1, 3, 17, 18)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(_conv2d_same(17, 18), {"x": x})[0], rtol=1e-6)
    dyn = _conv2d_same("h", "w")
    r, got = _run(tmp_path, dyn)
    assert {"Shape", "Ceil", "Pad"} <= set(op_types(got)) and r.cleanups.get("constant-fold", 0) == 0
    for hw in ((17, 18), (20, 7)):
        x = np.random.default_rng(2).standard_normal((1, 3, *hw)).astype(np.float32)
        np.testing.assert_allclose(ort_run(got, {"x": x})[0], ort_run(dyn, {"x": x})[0], rtol=1e-6)


def _if_model(cond_value: bool, nested: bool = False):
    """y = If(c) then Add(x, one) else Identity(x)."""
    then_nodes = [oh.make_node("Add", ["x", "one"], ["t_out"], name="t_add")]
    if nested:
        inner = oh.make_graph([oh.make_node("Neg", ["t_out"], ["n_out"], name="neg")], "inner_then", [],
                              [oh.make_tensor_value_info("n_out", onnx.TensorProto.FLOAT, [2, 3])])
        inner_else = oh.make_graph([oh.make_node("Identity", ["t_out"], ["i_out"], name="ident")], "inner_else", [],
                                   [oh.make_tensor_value_info("i_out", onnx.TensorProto.FLOAT, [2, 3])])
        then_nodes.append(oh.make_node("If", ["flag"], ["t_final"], name="inner_if", then_branch=inner,
                                       else_branch=inner_else))
    then_out = "t_final" if nested else "t_out"
    then_g = oh.make_graph(then_nodes, "then", [], [oh.make_tensor_value_info(then_out, onnx.TensorProto.FLOAT, [2, 3])])
    else_g = oh.make_graph([oh.make_node("Identity", ["x"], ["e_out"], name="e_id")], "else", [],
                           [oh.make_tensor_value_info("e_out", onnx.TensorProto.FLOAT, [2, 3])])
    nodes = [
        oh.make_node("Equal", ["k", "k2"], ["c"], name="eq"),
        oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    inits = {"k": np.array(3, np.int64), "k2": np.array(3 if cond_value else 4, np.int64),
             "one": np.array(1.0, np.float32)}
    inputs = [("x", [2, 3])] + ([("flag", [])] if nested else [])
    m = make_model(nodes, inputs, [("y", [2, 3])], inits)
    if nested:
        m.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    return m


def test_if_with_constant_condition_takes_the_then_branch(tmp_path):
    r, got = _run(tmp_path, _if_model(True))
    assert r.cleanups == {"constant-fold": 1, "if-inline": 1}
    assert op_types(got) == ["Add"] and got.graph.node[0].output[0] == "y"
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], x + 1)


def test_if_with_constant_condition_takes_the_else_branch(tmp_path):
    r, got = _run(tmp_path, _if_model(False))
    assert r.cleanups == {"constant-fold": 1, "if-inline": 1}
    assert op_types(got) == ["Identity"] and list(got.graph.node[0].input) == ["x"]


def test_nested_if_with_a_runtime_condition_moves_up_intact(tmp_path):
    r, got = _run(tmp_path, _if_model(True, nested=True))
    assert r.cleanups["if-inline"] == 1
    assert op_types(got) == ["Add", "If"]  # the inner If reads the (moved) Add output and a real input
    x = np.full((2, 3), 2.0, np.float32)
    for flag in (True, False):
        want = -(x + 1) if flag else x + 1
        np.testing.assert_array_equal(ort_run(got, {"x": x, "flag": np.array(flag)})[0], want)


def test_if_with_runtime_condition_is_kept(tmp_path):
    m = _if_model(True)
    m.graph.node[0].input[1] = "kin"  # Equal(k, kin) with kin a graph input
    m.graph.input.append(oh.make_tensor_value_info("kin", onnx.TensorProto.INT64, []))
    del m.graph.initializer[1]
    r, got = _run(tmp_path, m)
    assert r.fired == {} and op_types(got) == ["Equal", "If"]


def test_random_and_large_results_are_not_folded(tmp_path):
    nodes = [
        oh.make_node("RandomUniform", [], ["r"], name="rand", shape=[2, 3], dtype=1),
        oh.make_node("ConstantOfShape", ["big_shape"], ["big"], name="big",
                     value=onnx.numpy_helper.from_array(np.array([1.0], np.float32))),
        oh.make_node("ReduceSum", ["big"], ["s"], name="sum", keepdims=0),
        oh.make_node("Add", ["r", "s"], ["y"], name="add"),
    ]
    m = make_model(nodes, [], [("y", [2, 3])], {"big_shape": np.array([512, 512], np.int64)})
    r, got = _run(tmp_path, m)
    assert r.fired == {}  # RandomUniform never; ConstantOfShape would be 262144 elements
    assert op_types(got) == ["RandomUniform", "ConstantOfShape", "ReduceSum", "Add"]


def test_no_fold_flag(tmp_path, cli):
    src = save(_if_model(True), tmp_path / "in.onnx")
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--no-builtin", "--no-fold", "--no-measure")
    assert code == 0, stderr
    assert op_types(onnx.load(str(out))) == ["Equal", "If"]


def test_duplicate_nodes_merge_but_random_ones_do_not(tmp_path):
    nodes = [
        oh.make_node("Sigmoid", ["x"], ["a"], name="sig_a"),
        oh.make_node("Sigmoid", ["x"], ["b"], name="sig_b"),  # same op, input, attributes: merged into sig_a
        oh.make_node("RandomUniformLike", ["x"], ["r1"], name="rand1"),
        oh.make_node("RandomUniformLike", ["x"], ["r2"], name="rand2"),  # never merged: two draws
        oh.make_node("Add", ["a", "b"], ["s"], name="add"),
        oh.make_node("Sub", ["r1", "r2"], ["d"], name="sub"),
        oh.make_node("Mul", ["s", "d"], ["y"], name="mul"),
    ]
    m = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])
    r, got = _run(tmp_path, m, OptimizeOptions(builtin=False, measure=False, validate=False))
    assert r.cleanups == {"merge-duplicates": 1}
    assert op_types(got).count("Sigmoid") == 1 and op_types(got).count("RandomUniformLike") == 2
    add = next(n for n in got.graph.node if n.op_type == "Add")
    assert list(add.input) == ["a", "a"]


def _shape_if_model():
    """y = If(Shape(x)[1] == 8) then Relu(x) else Neg(x), with x [batch, n]: the condition is dynamic."""
    then_g = oh.make_graph([oh.make_node("Relu", ["x"], ["t"], name="relu")], "then", [],
                           [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
                           [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, None)])
    nodes = [oh.make_node("Shape", ["x"], ["s"], name="shape"),
             oh.make_node("Gather", ["s", "one"], ["n"], name="gather", axis=0),
             oh.make_node("Equal", ["n", "eight"], ["c"], name="eq"),
             oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [("x", ["batch", "n"])], [("y", ["batch", "n"])],
                      {"one": np.array(1, np.int64), "eight": np.array(8, np.int64)})


def test_static_fixes_input_dims_and_lets_shape_tests_fold(tmp_path, cli):
    src = save(_shape_if_model(), tmp_path / "in.onnx")
    r, got = _run(tmp_path, _shape_if_model())
    assert "if-inline" not in r.cleanups and "If" in op_types(got)  # dynamic: the If must stay
    out = tmp_path / "static.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--no-builtin", "--no-measure", "--static", "--shape", "x:2x8")
    assert code == 0, stderr
    got = onnx.load(str(out))
    assert op_types(got) == ["Relu"]
    assert [d.dim_value for d in got.graph.input[0].type.tensor_type.shape.dim] == [2, 8]
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], np.maximum(x, 0))


@pytest.mark.parametrize("shapes", [["batch=2", "n=8"], ["x:2x8"], ["batch=2", "x:2x8"]],
                         ids=["dims", "tensor", "both"])
def test_static_takes_named_dims_and_tensor_shapes(tmp_path, cli, shapes):
    """--static with --shape DIM=V (the dims the model names) as with NAME:DIMS: the same fixed output."""
    src = save(_shape_if_model(), tmp_path / "in.onnx")
    out = tmp_path / "static.onnx"
    flags = [a for s in shapes for a in ("--shape", s)]
    code, stdout, stderr = cli("optimize", src, out, "--no-builtin", "--no-measure", "--static", *flags)
    assert code == 0, stderr
    got = onnx.load(str(out))
    assert op_types(got) == ["Relu"]
    assert [d.dim_value for d in got.graph.input[0].type.tensor_type.shape.dim] == [2, 8]
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], np.maximum(x, 0))


def test_static_named_dims_through_the_api(tmp_path):
    r, got = _run(tmp_path, _shape_if_model(), replace(OPTS, static=True, shapes=["batch=3", "n=8"]))
    assert op_types(got) == ["Relu"] and r.cleanups.get("if-inline") == 1
    assert [d.dim_value for d in got.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    assert r.inputs is not None and r.validation.startswith("passed")


def test_static_with_a_mistyped_dim_names_the_typo(tmp_path, cli):
    src = save(_shape_if_model(), tmp_path / "in.onnx")
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx", "--static", "--shape", "bach=2",
                               "--shape", "n=8")
    assert code == 1 and "unknown dim 'bach'; the model's dims are: batch, n" in stderr
    assert "Traceback" not in stderr


def test_static_without_every_dim_is_a_clear_error(tmp_path, cli):
    src = save(_shape_if_model(), tmp_path / "in.onnx")
    out = tmp_path / "static.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--static", "--shape", "batch=2")
    assert code == 1 and not out.exists()
    assert "fixing the input shapes (static) needs a value for every dynamic input dim; missing: x[1] (n)" in stderr
    assert "Traceback" not in stderr


def test_identity_readers_read_its_input_but_a_graph_output_identity_stays(tmp_path):
    nodes = [oh.make_node("Identity", ["x"], ["a"], name="id_inner"),
             oh.make_node("Relu", ["a"], ["r"], name="relu"),
             oh.make_node("Identity", ["r"], ["y"], name="id_out")]
    m = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])
    r, got = _run(tmp_path, m)
    assert r.cleanups == {"identity-drop": 1}
    assert [(n.op_type, list(n.input)) for n in got.graph.node] == [("Relu", ["x"]), ("Identity", ["r"])]


def test_outer_constants_fold_inside_a_branch(tmp_path):
    """A branch reading constants of the enclosing graph folds like the enclosing graph would."""
    then_g = oh.make_graph([oh.make_node("Add", ["k", "k"], ["kk"], name="add_k"),
                            oh.make_node("Mul", ["x", "kk"], ["t"], name="mul")], "then", [],
                           [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 3])])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
                           [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2, 3])])
    nodes = [oh.make_node("Constant", [], ["k"], name="k", value=onnx.numpy_helper.from_array(np.float32(1.5))),
             oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [("x", [2, 3]), ("c", [], onnx.TensorProto.BOOL)], [("y", [2, 3])])
    r, got = _run(tmp_path, m)
    assert r.cleanups == {"constant-fold": 1}
    branch = next(a.g for a in got.graph.node[-1].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Constant", "Mul"]
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x, "c": np.array(True)})[0], x * 3)


def test_cleanup_steps_are_reported_apart_from_rules(cli, tmp_path):
    """Folding and merging are not rules: `fired` counts rules only, `cleanups` the exact steps; --skip and
    patterns show refuse a step's name with the flag that does turn it off."""
    nodes = [
        oh.make_node("Relu", ["x"], ["r1"], name="relu1"),
        oh.make_node("Relu", ["x"], ["r2"], name="relu2"),  # merged
        oh.make_node("Add", ["r1", "r2"], ["b"], name="add_r"),
        oh.make_node("Add", ["c1", "c2"], ["c"], name="fold_me"),  # folded
        oh.make_node("Sigmoid", ["x"], ["a"], name="sig"),
        oh.make_node("Mul", ["x", "a"], ["xa"], name="silu"),  # the built-in silu rule
        oh.make_node("Add", ["xa", "b"], ["s"], name="add"),
        oh.make_node("Add", ["s", "c"], ["y"], name="out"),
    ]
    m = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])],
                   {"c1": np.ones(3, "float32"), "c2": np.ones(3, "float32")})
    path = save(m, tmp_path / "m.onnx")
    code, stdout, stderr = cli("optimize", path, tmp_path / "o.onnx", "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["cleanups"] == {"merge-duplicates": 1, "constant-fold": 1}
    assert data["fired"] == {"silu": 1}
    code, stdout, _ = cli("optimize", path, tmp_path / "o.onnx", "--details")
    assert "cleanups (exact steps, not rules; --no-fold turns them off): constant-fold x1, merge-duplicates x1" \
        in stdout
    rules_table = stdout.split("rules fired")[1].split("cleanups")[0]
    assert "silu" in rules_table and "merge-duplicates" not in rules_table and "constant-fold" not in rules_table
    code, _, stderr = cli("optimize", path, tmp_path / "o.onnx", "--skip", "constant-fold")
    assert code == 1 and "--skip constant-fold: 'constant-fold' is an exact cleanup step, not a rule" in stderr
    assert "hint: turning folding off (--no-fold, fold=False) turns off every cleanup step" in stderr
    code, _, stderr = cli("patterns", "show", "merge-duplicates")
    assert code == 1 and "is an exact cleanup step, not a rule" in stderr
    code, stdout, _ = cli("optimize", path, tmp_path / "o.onnx", "--json", "--no-fold")
    assert json.loads(stdout)["cleanups"] == {} and json.loads(stdout)["fired"] == {"silu": 1}
