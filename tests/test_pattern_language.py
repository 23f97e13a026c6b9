"""Pattern-language features that transformer blocks need: multi-output match lines (Split), interior values
read only by shape arithmetic that dies with the match, absent inputs in a rewrite, a line's output fields."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.errors import OnnxfuseError
from onnxfuse.patterns.parser import parse_text

SPLIT_RULES = """
rules:
- id: split-add
  doc: Split in two, add the halves -> one ReduceSum over a reshaped view... here simply Add of two Slices.
  match:
    a, b: Split(X, SP, axis=1)
    Y: Add(a, b)
  where:
    X: {shape: [n, c]}
    a: {shape: [n, h]}
  compute:
    S0: int64([0])
    E0: int64([a.dims[1]])
    E1: int64([2 * a.dims[1]])
    AX: int64([1])
  rewrite:
    l: Slice(X, S0, E0, AX)
    r: Slice(X, E0, E1, AX)
    Y: Add(l, r)
"""


def _split_model(tmp_path, sizes=(3, 3), extra_reader=False):
    nodes = [oh.make_node("Split", ["x", "sp"], ["a", "b"], name="split", axis=1),
             oh.make_node("Add", ["a", "b"], ["y"], name="add")]
    outputs = [("y", [2, sizes[0]])]
    if extra_reader:
        nodes.append(oh.make_node("Neg", ["b"], ["z"], name="neg"))
        outputs.append(("z", [2, sizes[1]]))
    m = make_model(nodes, [("x", [2, sum(sizes)])], outputs, {"sp": np.array(sizes, np.int64)})
    return save(m, tmp_path / "split.onnx")


def _rules(tmp_path, text):
    p = tmp_path / "rules.yaml"
    p.write_text(text)
    return [str(p)]


def test_multi_output_line_matches_every_output_of_one_node(tmp_path):
    src = _split_model(tmp_path)
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(patterns=_rules(tmp_path, SPLIT_RULES), builtin=False, measure=False))
    assert r.fired == {"split-add": 1}
    got = onnx.load(out)
    assert sorted(op_types(got)) == ["Add", "Slice", "Slice"]
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_allclose(ort_run(got, {"x": x})[0], x[:, :3] + x[:, 3:], rtol=1e-6)


def test_multi_output_line_respects_outside_readers_of_other_outputs(tmp_path):
    src = _split_model(tmp_path, extra_reader=True)
    r = optimize(src, str(tmp_path / "out.onnx"),
                 OptimizeOptions(patterns=_rules(tmp_path, SPLIT_RULES), builtin=False, measure=False))
    assert r.fired == {}


def test_multi_output_line_checks_constraints_per_output(tmp_path):
    src = _split_model(tmp_path, sizes=(3, 3))
    rules = SPLIT_RULES.replace("a: {shape: [n, h]}", "a: {shape: [n, h]}\n    b: {shape: [n, 4]}")
    r = optimize(src, str(tmp_path / "out.onnx"),
                 OptimizeOptions(patterns=_rules(tmp_path, rules), builtin=False, measure=False))
    assert r.fired == {}


def test_multi_output_line_must_be_one_call():
    with pytest.raises(OnnxfuseError) as e:
        parse_text("rules:\n- id: r\n  match:\n    a, b: Split(X) | Split(X, S)\n    Y: Add(a, b)\n"
                   "  rewrite:\n    Y: X\n", "f.yaml")
    assert "f.yaml:4:11: error: a multi-output match line ('a, b') must be one operator call" in str(e.value)


SHAPE_SIDE_RULES = """
rules:
- id: reshape-roundtrip
  doc: Reshape to a shape computed from the value itself and back is the value.
  match:
    r: Reshape(X, _)
    Y: Reshape(r, S)
  where:
    X: {shape: [n, c]}
    Y: {shape: [n, c]}
  rewrite:
    Y: X
"""


def _shape_side_model(tmp_path, shape_escapes: bool):
    """r = Reshape(x, [-1]); the way back reshapes r to Shape(x) * (Shape(r) / Shape(r)): Shape(r) reads the
    interior value r. With shape_escapes, Shape(r) also feeds a graph output."""
    nodes = [
        oh.make_node("Reshape", ["x", "flat"], ["r"], name="r"),
        oh.make_node("Shape", ["x"], ["sx"], name="shape_x"),
        oh.make_node("Shape", ["r"], ["sr"], name="shape_r"),
        oh.make_node("Div", ["sr", "sr"], ["one"], name="div"),
        oh.make_node("Mul", ["sx", "one"], ["target"], name="mul"),
        oh.make_node("Reshape", ["r", "target"], ["y"], name="back"),
    ]
    outputs = [("y", [2, 3])]
    if shape_escapes:
        nodes.append(oh.make_node("Identity", ["sr"], ["sr_out"], name="escape"))
        outputs.append(("sr_out", [1]))
    m = make_model(nodes, [("x", [2, 3])], outputs, {"flat": np.array([-1], np.int64)})
    if shape_escapes:
        m.graph.output[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    return save(m, tmp_path / "side.onnx")


def test_interior_value_read_only_by_dying_shape_arithmetic(tmp_path):
    src = _shape_side_model(tmp_path, shape_escapes=False)
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(patterns=_rules(tmp_path, SHAPE_SIDE_RULES), builtin=False,
                                           measure=False, fold=False))
    assert r.fired == {"reshape-roundtrip": 1}, r.fired
    got = onnx.load(out)
    assert op_types(got) == ["Identity"]  # y (a graph output) keeps its name; the shape arithmetic is gone


def test_interior_value_read_by_shape_arithmetic_that_survives_blocks(tmp_path):
    src = _shape_side_model(tmp_path, shape_escapes=True)
    r = optimize(src, str(tmp_path / "out.onnx"),
                 OptimizeOptions(patterns=_rules(tmp_path, SHAPE_SIDE_RULES), builtin=False, measure=False,
                                 fold=False))
    assert r.fired == {}


def test_absent_input_in_the_middle_of_a_rewrite(tmp_path):
    rules = """
rules:
- id: clip-max-only
  doc: Min(x, C) -> Clip(x, <no min>, C).
  match:
    Y: Min(X, C)
  where:
    C: {constant: true, shape: []}
  rewrite:
    Y: Clip(X, _, C)
"""
    m = make_model([oh.make_node("Min", ["x", "c"], ["y"], name="min")], [("x", [4])], [("y", [4])],
                   {"c": np.array(0.5, np.float32)})
    src = save(m, tmp_path / "min.onnx")
    out = str(tmp_path / "out.onnx")
    optimize(src, out, OptimizeOptions(patterns=_rules(tmp_path, rules), builtin=False, measure=False))
    got = onnx.load(out)
    assert op_types(got) == ["Clip"] and list(got.graph.node[0].input) == ["x", "", "c"]
    x = np.array([-1, 0.2, 0.7, 3], np.float32)
    np.testing.assert_array_equal(ort_run(got, {"x": x})[0], np.minimum(x, 0.5))


STAGE_RULES = """
rules:
- id: big
  doc: Relu(Abs(Exp(x))) = Exp(x).
  match:
    Y: Relu(Abs(Exp(X)))
  rewrite:
    Y: Exp(X)
- id: small
  doc: Abs(Exp(x)) = Exp(x).
  match:
    Y: Abs(Exp(X))
  rewrite:
    Y: Exp(X)
- id: drop-identity
  doc: Identity(x) = x.
  match:
    Y: Identity(X)
  rewrite:
    Y: X
  STAGE
"""


def test_early_stage_canonicalises_before_fusion_rules(tmp_path):
    """x -> Exp -> Abs -> Identity -> Relu. With the Identity removal in the early stage, the biggest rule sees
    Relu(Abs(Exp)) and leaves a single Exp; in the main stage, the smaller rule would fire first."""
    nodes = [oh.make_node("Exp", ["x"], ["e"], name="exp"), oh.make_node("Abs", ["e"], ["a"], name="abs"),
             oh.make_node("Identity", ["a"], ["i"], name="id"), oh.make_node("Relu", ["i"], ["y"], name="relu")]
    src = save(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])]), tmp_path / "s.onnx")
    results = {}
    for stage in ("stage: early", "stage: main"):
        out = str(tmp_path / f"{stage[7:]}.onnx")
        rules = _rules(tmp_path, STAGE_RULES.replace("STAGE", stage))
        optimize(src, out, OptimizeOptions(patterns=rules, builtin=False, measure=False, fold=False))
        results[stage] = sorted(op_types(onnx.load(out)))
    assert results["stage: early"] == ["Exp"]
    assert results["stage: main"] == ["Exp", "Relu"]


def test_a_named_sub_pattern_is_its_expression_with_the_arguments_in_place():
    """`patterns:` names a match expression with parameters; a call is that expression with the arguments bound
    (the calling rule's own names, ZERO here, stay its own), and sub-patterns may call earlier ones."""
    inline = parse_text("""rules:
- id: r
  doc: d
  match:
    p: Softmax(S, axis=-1)
    Y: MatMul(Where(IsNaN(p), ZERO, p) | p, V)
  where:
    ZERO: {const: 0.0}
  rewrite:
    Y: MatMul(p, V)
""", "a.yaml")[0]
    named = parse_text("""patterns:
  guarded(p): Where(IsNaN(p), ZERO, p)
  weights(p): guarded(p) | p
rules:
- id: r
  doc: d
  match:
    p: Softmax(S, axis=-1)
    Y: MatMul(weights(p), V)
  where:
    ZERO: {const: 0.0}
  rewrite:
    Y: MatMul(p, V)
""", "b.yaml")[0]

    def shape(e):  # the tree without column offsets
        if hasattr(e, "options"):
            return ("|", [shape(o) for o in e.options])
        if hasattr(e, "args"):
            return (e.qualified, [shape(a) for a in e.args])
        return e.name

    assert shape(named.lines["Y"]) == shape(inline.lines["Y"])


def test_a_sub_pattern_that_calls_itself_is_one_error_line():
    from onnxfuse.errors import PatternError

    with pytest.raises(PatternError, match="unknown operator 'loop'"):  # not yet defined inside its own body
        parse_text("patterns:\n  loop(x): Relu(loop(x))\nrules:\n- id: r\n  doc: d\n  match:\n    Y: loop(X)\n"
                   "  rewrite:\n    Y: Relu(X)\n", "c.yaml")
