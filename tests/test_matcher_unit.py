"""Unit tests of the matcher (onnxfuse/match/matcher.py) and of applying rewrites (rewrite/apply.py through
rewrite/engine.py) on tiny graphs, with rules written inline: no files, no onnxruntime session (an autouse
fixture makes creating one fail)."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model
from onnx import TensorProto

from onnxfuse.ir import Model
from onnxfuse.match.matcher import Matcher
from onnxfuse.patterns.parser import parse_text
from onnxfuse.rewrite.engine import EngineOptions, near_misses, rules_in_order, run


@pytest.fixture(autouse=True)
def _no_onnxruntime_session(monkeypatch):
    import onnxruntime

    def refuse(*args, **kwargs):
        raise AssertionError("an onnxruntime session was created in a matcher unit test")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)


def rules(text: str):
    return parse_text("rules:\n" + textwrap.indent(textwrap.dedent(text).strip("\n"), "") + "\n", "unit.yaml")


def rule(body: str):
    (r,) = rules(body)
    return r


def model(nodes, inputs, outputs, inits=None, opset=17) -> Model:
    """An onnxfuse Model of the graph, value types from ONNX shape inference (as the loader does)."""
    proto = make_model(nodes, inputs, outputs, inits or {}, opset=opset)
    return Model(onnx.shape_inference.infer_shapes(proto), ".")


def node(m: Model, name: str):
    return next(n for n in m.graph.nodes if n.name == name)


def match(r, m: Model, root: str):
    """(binding or None, the matcher's best failure)."""
    matcher = Matcher(r, m.graph)
    b = matcher.match(node(m, root))
    return b, matcher.best


def names(nodes) -> set[str]:
    return {n.name for n in nodes}


def ops(proto: onnx.ModelProto) -> list[str]:
    return [(n.domain + "." if n.domain else "") + n.op_type for n in proto.graph.node]


F32 = np.float32


# ----- commutative operands ------------------------------------------------------------------------------------
EXP_TIMES_EXP = """
- id: exp-times-exp
  doc: test
  match:
    Y: Mul(Exp(X), Exp(C))
  where:
    C: {const: 2.0}
  rewrite:
    Y: Exp(X)
"""


def _exp_exp(op="Mul"):
    nodes = [oh.make_node("Exp", ["two"], ["ec"], name="exp_c"), oh.make_node("Exp", ["x"], ["ex"], name="exp_x"),
             oh.make_node(op, ["ec", "ex"], ["y"], name="root")]
    return model(nodes, [("x", [3])], [("y", [3])], {"two": F32(2.0)})


def test_commutative_operands_are_tried_in_both_orders_with_backtracking():
    # first order: X = 'two' and then Exp(C) reads x, not a constant -> back to the other order
    b, _ = match(rule(EXP_TIMES_EXP), _exp_exp(), "root")
    assert b is not None
    assert b.values["X"] == "x" and b.values["C"] == "two"
    assert names(b.matched) == {"root", "exp_x", "exp_c"}


def test_non_commutative_operands_keep_their_order():
    r = rule(EXP_TIMES_EXP.replace("Mul(", "Sub("))
    b, best = match(r, _exp_exp("Sub"), "root")
    assert b is None
    assert best.reason == "C ('x') is not a constant, rule needs 2"


# ----- alternatives --------------------------------------------------------------------------------------------
ALTERNATIVES = """
- id: alt
  doc: test
  match:
    s: Mul(X, TWO) | Mul(X, THREE)
    Y: Neg(s)
  where:
    TWO: {const: 2.0}
    THREE: {const: 3.0}
  rewrite:
    Y: X
"""


@pytest.mark.parametrize(("k", "bound", "unbound"), [(2.0, "TWO", "THREE"), (3.0, "THREE", "TWO")])
def test_alternatives_are_tried_in_order_with_backtracking(k, bound, unbound):
    nodes = [oh.make_node("Mul", ["x", "k"], ["s"], name="mul"), oh.make_node("Neg", ["s"], ["y"], name="neg")]
    b, _ = match(rule(ALTERNATIVES), model(nodes, [("x", [3])], [("y", [3])], {"k": F32(k)}), "neg")
    assert b is not None and b.values[bound] == "k" and unbound not in b.values and b.values["X"] == "x"


def test_no_alternative_matches():
    nodes = [oh.make_node("Mul", ["x", "k"], ["s"], name="mul"), oh.make_node("Neg", ["s"], ["y"], name="neg")]
    b, _ = match(rule(ALTERNATIVES), model(nodes, [("x", [3])], [("y", [3])], {"k": F32(4.0)}), "neg")
    assert b is None


def test_alternative_root_ops():
    r = rule("""
- id: act
  doc: test
  match:
    Y: Relu(X) | Sigmoid(X)
  rewrite:
    Y: X
""")
    assert r.root_ops() == {("", "Relu"), ("", "Sigmoid")}
    for op in ("Relu", "Sigmoid"):
        b, _ = match(r, model([oh.make_node(op, ["x"], ["y"], name="a")], [("x", [3])], [("y", [3])]), "a")
        assert b is not None and b.values == {"X": "x", "Y": "y"}
    b, best = match(r, model([oh.make_node("Tanh", ["x"], ["y"], name="a")], [("x", [3])], [("y", [3])]), "a")
    assert b is None


# ----- a name used twice ---------------------------------------------------------------------------------------
SAME_X = """
- id: same-x
  doc: test
  match:
    Y: Add(Relu(X), Neg(X))
  rewrite:
    Y: X
"""


def _relu_plus_neg(other: str):
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Neg", [other], ["n"], name="neg"),
             oh.make_node("Add", ["r", "n"], ["y"], name="add")]
    return model(nodes, [("x", [3]), ("z", [3])], [("y", [3])])


def test_a_name_used_twice_must_be_the_same_value():
    b, _ = match(rule(SAME_X), _relu_plus_neg("x"), "add")
    assert b is not None and b.values["X"] == "x"
    b, best = match(rule(SAME_X), _relu_plus_neg("z"), "add")
    assert b is None
    assert best.reason == "X must be the same value in both places ('x' vs 'z')"
    assert best.progress == 3 and best.node == "z"


# ----- constraints ---------------------------------------------------------------------------------------------
def _div(k, x_shape=(2, 3), x_type=TensorProto.FLOAT):
    nodes = [oh.make_node("Div", ["x", "k"], ["y"], name="div")]
    return model(nodes, [("x", list(x_shape), x_type)], [("y", list(x_shape), x_type)], {"k": np.asarray(k)})


DIV_BY_ONE = """
- id: div-one
  doc: test
  match:
    Y: Div(X, K)
  where:
    K: {const: 1.0, rtol: 1e-3}
  rewrite:
    Y: X
"""


def test_const_within_tolerance():
    r = rule(DIV_BY_ONE)
    assert match(r, _div(F32(1.0005)), "div")[0] is not None
    assert match(r, _div(np.full((2, 3), 0.9995, F32)), "div")[0] is not None  # every element of a tensor
    b, best = match(r, _div(F32(1.002)), "div")
    assert b is None and best.reason == "K: const 1.002 not within tolerance of 1 (rtol 0.001, atol 1e-06)"
    b, best = match(r, _div(np.array([1.0, 1.0, 1.5], F32)), "div")
    assert b is None and "K: const [1, 1, 1.5] not within tolerance of 1" in best.reason


def test_a_scalar_const_does_not_match_a_tensor_that_could_change_the_rank():
    b, best = match(rule(DIV_BY_ONE), _div(np.ones((1, 1, 1), F32)), "div")
    assert b is None
    assert best.reason == "K: constant of shape [1, 1, 1] could change the output's rank (2)"


def test_dtype_and_rank_constraints():
    r = rule("""
- id: relu
  doc: test
  match:
    Y: Relu(X)
  where:
    X: {dtype: [float16, float64], rank: [3]}
  rewrite:
    Y: X
""")

    def relu(shape, t):
        return model([oh.make_node("Relu", ["x"], ["y"], name="relu")], [("x", shape, t)], [("y", shape, t)])

    assert match(r, relu([1, 2, 3], TensorProto.FLOAT16), "relu")[0] is not None
    b, best = match(r, relu([1, 2, 3], TensorProto.FLOAT), "relu")
    assert b is None and best.reason == "X has dtype float, rule allows float16, double"
    b, best = match(r, relu([2, 3], TensorProto.DOUBLE), "relu")
    assert b is None and best.reason == "X has rank 2, rule allows 3"


MATMUL_DIMS = """
- id: mm
  doc: test
  match:
    Y: MatMul(A, B)
  where:
    A: {shape: [n, k]}
    B: {shape: [k, m]}
  rewrite:
    Y: A
"""


def _mm(a, b):
    return model([oh.make_node("MatMul", ["a", "b"], ["y"], name="mm")], [("a", a), ("b", b)], [("y", None)])


def test_shape_dims_unify_across_values():
    b, _ = match(rule(MATMUL_DIMS), _mm([2, 3], [3, 4]), "mm")
    assert b is not None and b.dims == {"n": 2, "k": 3, "m": 4}
    b, _ = match(rule(MATMUL_DIMS), _mm(["batch", 3], [3, "batch"]), "mm")
    assert b is not None and b.dims == {"n": "batch", "k": 3, "m": "batch"}
    b, best = match(rule(MATMUL_DIMS), _mm([2, 3], [5, 4]), "mm")
    assert b is None and best.reason == "B has shape [5, 4], rule needs ['k', 'm']: k is 5 here, 3 where it was bound first"
    b, best = match(rule(MATMUL_DIMS), _mm([2, "k"], [3, 4]), "mm")  # a symbol never equals a literal
    assert b is None and best.reason == ("B has shape [3, 4], rule needs ['k', 'm']: k is 3 here, 'k' where it was bound "
                                         "first (a dim shape inference named is not proved equal to a number)")


def test_shape_alternatives_and_literal_dims():
    r = rule("""
- id: bias
  doc: test
  match:
    Y: Add(X, C)
  where:
    X: {shape: [_, _, k]}
    C: {constant: true, shape: [[k], [1, 1, k]]}
  rewrite:
    Y: X
""")

    def add(c_shape):
        nodes = [oh.make_node("Add", ["x", "c"], ["y"], name="add")]
        return model(nodes, [("x", [2, 4, 8])], [("y", [2, 4, 8])], {"c": np.ones(c_shape, F32)})

    assert match(r, add([8]), "add")[0] is not None
    assert match(r, add([1, 1, 8]), "add")[0] is not None
    assert match(r, add([4, 8]), "add")[0] is None


# ----- interior values -----------------------------------------------------------------------------------------
NEG_RELU = """
- id: neg-relu
  doc: test
  match:
    r: Relu(X)
    Y: Neg(r)
  rewrite:
    Y: X
"""


def test_an_interior_value_with_an_outside_reader_blocks_the_match():
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Neg", ["r"], ["y"], name="neg"),
             oh.make_node("Sigmoid", ["r"], ["z"], name="sig")]
    b, best = match(rule(NEG_RELU), model(nodes, [("x", [3])], [("y", [3]), ("z", [3])]), "neg")
    assert b is None
    assert best.node == "relu" and best.progress == 2
    assert best.reason == "Relu 'relu' (line r) has 1 consumer(s) outside the match (Sigmoid 'sig')"


def test_an_interior_value_that_is_a_graph_output_blocks_the_match():
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Neg", ["r"], ["y"], name="neg")]
    b, best = match(rule(NEG_RELU), model(nodes, [("x", [3])], [("y", [3]), ("r", [3])]), "neg")
    assert b is None
    assert best.reason == "Relu 'relu' (line r): its output 'r' is a graph output"


def test_a_shared_line_may_have_outside_readers_and_is_kept():
    r = rule(NEG_RELU.replace("  rewrite:", "  where:\n    r: {shared: true}\n  rewrite:"))
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Neg", ["r"], ["y"], name="neg"),
             oh.make_node("Sigmoid", ["r"], ["z"], name="sig")]
    b, _ = match(r, model(nodes, [("x", [3])], [("y", [3]), ("z", [3])]), "neg")
    assert b is not None and names(b.matched) == {"neg"} and names(b.kept) == {"relu"}


def test_a_line_the_rewrite_recreates_may_have_outside_readers():
    r = rule("""
- id: residual
  doc: test
  match:
    s: Add(A, B)
    Y: Neg(s)
  rewrite:
    s: Add(A, B)
    Y: Sub(B, s)
""")
    nodes = [oh.make_node("Add", ["a", "b"], ["s"], name="add"), oh.make_node("Neg", ["s"], ["y"], name="neg"),
             oh.make_node("Sigmoid", ["s"], ["z"], name="sig")]
    b, _ = match(r, model(nodes, [("a", [3]), ("b", [3])], [("y", [3]), ("z", [3])]), "neg")
    assert b is not None and names(b.matched) == {"neg", "add"}


RESHAPE_BACK = """
- id: reshape-relu
  doc: test
  match:
    Y: Reshape(Relu(X), S)
  rewrite:
    Y: REWRITE
"""


def _reshape_of_own_shape():
    """y = Reshape(Relu(x), Shape(Relu(x))): the interior Relu is also read by the Shape computing the target."""
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Shape", ["r"], ["s"], name="shape"),
             oh.make_node("Reshape", ["r", "s"], ["y"], name="reshape")]
    return model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def test_interior_value_read_only_by_shape_arithmetic_of_the_match():
    b, _ = match(rule(RESHAPE_BACK.replace("REWRITE", "Relu(X)")), _reshape_of_own_shape(), "reshape")
    assert b is not None and names(b.matched) == {"reshape", "relu"} and names(b.side) == {"shape"}
    # the rewrite reads S, the Shape's output: the chain cannot die with the match
    b, best = match(rule(RESHAPE_BACK.replace("REWRITE", "Reshape(X, S)")), _reshape_of_own_shape(), "reshape")
    assert b is None and best.reason == "Relu 'relu' has 1 consumer(s) outside the match (Shape 'shape')"


# ----- applying ------------------------------------------------------------------------------------------------
DOUBLE_NEG = """
- id: double-neg
  doc: test
  match:
    Y: Neg(Neg(X))
  rewrite:
    Y: X
"""


def _double_neg(as_output=False):
    """relu -> neg1 -> neg2 -> (exp, sig); relu -> abs."""
    nodes = [oh.make_node("Relu", ["x"], ["a"], name="relu"), oh.make_node("Neg", ["a"], ["n1"], name="neg1"),
             oh.make_node("Neg", ["n1"], ["n2"], name="neg2"), oh.make_node("Exp", ["n2"], ["e"], name="exp"),
             oh.make_node("Sigmoid", ["n2"], ["s"], name="sig"), oh.make_node("Abs", ["a"], ["z"], name="abs")]
    outputs = [("e", [3]), ("s", [3]), ("z", [3])] + ([("n2", [3])] if as_output else [])
    return model(nodes, [("x", [3])], outputs)


def test_apply_removes_exactly_the_matched_nodes_and_rewires_their_readers():
    m = _double_neg()
    before = {n.name: n.proto.SerializeToString() for n in m.graph.nodes}
    res = run(m, rules(DOUBLE_NEG), EngineOptions(fold=False))
    (app,) = res.applications
    assert (app.rule, app.root, set(app.replaced), app.created, app.ops) == ("double-neg", "n2", {"neg1", "neg2"}, (), ())
    out = m.export()
    assert [n.name for n in out.graph.node] == ["relu", "exp", "sig", "abs"]
    assert {n.name: list(n.input) for n in out.graph.node} == {"relu": ["x"], "exp": ["a"], "sig": ["a"], "abs": ["a"]}
    untouched = {n.name: n.SerializeToString() for n in out.graph.node if n.name in ("relu", "abs")}
    assert untouched == {k: before[k] for k in ("relu", "abs")}


def test_apply_keeps_a_graph_output_name_through_an_identity():
    m = _double_neg(as_output=True)
    (app,) = run(m, rules(DOUBLE_NEG), EngineOptions(fold=False)).applications
    out = m.export()
    assert ops(out) == ["Relu", "Identity", "Exp", "Sigmoid", "Abs"]
    ident = out.graph.node[1]
    assert (list(ident.input), list(ident.output)) == (["a"], ["n2"]) and app.created == (ident.name,)
    assert ident.doc_string in ("onnxfuse: rule=double-neg replaced=neg2,neg1", "onnxfuse: rule=double-neg replaced=neg1,neg2")


def test_apply_builds_the_new_node_in_place_of_the_root():
    r = rules("""
- id: silu
  doc: test
  match:
    Y: Mul(X, Sigmoid(X))
  rewrite:
    Y: com.microsoft.QuickGelu(X, alpha=1.0)
""")
    nodes = [oh.make_node("Sigmoid", ["x"], ["s"], name="sig"), oh.make_node("Mul", ["s", "x"], ["y"], name="gate"),
             oh.make_node("Relu", ["y"], ["out"], name="after")]
    m = model(nodes, [("x", [2, 3])], [("out", [2, 3])])
    (app,) = run(m, r, EngineOptions(fold=False)).applications
    assert app.ops == ("com.microsoft.QuickGelu",) and set(app.replaced) == {"gate", "sig"}
    out = m.export()
    assert ops(out) == ["com.microsoft.QuickGelu", "Relu"]
    fused, after = out.graph.node
    assert (list(fused.input), list(fused.output), list(after.input)) == (["x"], ["y"], ["y"])
    assert [(a.name, a.f) for a in fused.attribute] == [("alpha", 1.0)]
    assert fused.doc_string.startswith("onnxfuse: rule=silu replaced=")
    assert {o.domain: o.version for o in out.opset_import}.get("com.microsoft") == 1


def test_a_second_run_finds_nothing():
    nodes = [oh.make_node("Neg", [f"v{i}"], [f"v{i + 1}"], name=f"neg{i}") for i in range(5)]
    nodes.append(oh.make_node("Relu", ["v5"], ["y"], name="relu"))
    m = model(nodes, [("v0", [3])], [("y", [3])])
    first = run(m, rules(DOUBLE_NEG), EngineOptions(fold=False))
    assert len(first.applications) == 2  # five Negs: two pairs go, one stays
    assert ops(m.export()) == ["Neg", "Relu"]
    again = run(m, rules(DOUBLE_NEG), EngineOptions(fold=False))
    assert again.applications == [] and ops(m.export()) == ["Neg", "Relu"]


def test_a_denied_rewrite_is_not_applied():
    m = _double_neg()
    res = run(m, rules(DOUBLE_NEG), EngineOptions(fold=False, deny={("double-neg", "n2")}))
    assert res.applications == [] and ops(m.export()) == ["Relu", "Neg", "Neg", "Exp", "Sigmoid", "Abs"]


DOUBLE_NEG_ID = DOUBLE_NEG.replace("double-neg", "double-neg-id").replace("Y: X", "Y: Identity(X)")


def test_only_allowed_rewrites_are_applied():
    """`allow` restricts the rewrites that make nodes; one that only removes nodes (an alias, `Y: X`) is exact and
    is made wherever it turns up (measured selection keeps such rewrites without timing them)."""
    nodes = [oh.make_node("Neg", [f"v{i}"], [f"v{i + 1}"], name=f"neg{i}") for i in range(4)]
    nodes.append(oh.make_node("Relu", ["v4"], ["y"], name="relu"))
    m = model(nodes, [("v0", [3])], [("y", [3])])
    first = [a.key for a in run(m, rules(DOUBLE_NEG_ID), EngineOptions(fold=False)).applications]
    assert len(first) == 2
    m = model(nodes, [("v0", [3])], [("y", [3])])
    res = run(m, rules(DOUBLE_NEG_ID), EngineOptions(fold=False, allow={first[1]}))
    assert [a.key for a in res.applications] == [first[1]] and ops(m.export()) == ["Neg", "Neg", "Identity", "Relu"]
    m = model(nodes, [("v0", [3])], [("y", [3])])
    assert run(m, rules(DOUBLE_NEG_ID), EngineOptions(fold=False, allow=set())).applications == []
    m = model(nodes, [("v0", [3])], [("y", [3])])
    assert len(run(m, rules(DOUBLE_NEG), EngineOptions(fold=False, allow=set())).applications) == 2
    assert rules(DOUBLE_NEG)[0].removes_only and not rules(DOUBLE_NEG_ID)[0].removes_only


def test_bigger_rules_are_tried_first():
    rs = rules("""
- id: small
  doc: test
  match:
    Y: Abs(Exp(X))
  rewrite:
    Y: Exp(X)
- id: big
  doc: test
  match:
    Y: Relu(Abs(Exp(X)))
  rewrite:
    Y: Exp(X)
""")
    assert [r.id for r in rules_in_order(rs)] == ["big", "small"]
    nodes = [oh.make_node("Exp", ["x"], ["e"], name="exp"), oh.make_node("Abs", ["e"], ["a"], name="abs"),
             oh.make_node("Relu", ["a"], ["r"], name="relu"), oh.make_node("Neg", ["r"], ["y"], name="neg")]
    m = model(nodes, [("x", [3])], [("y", [3])])
    res = run(m, rs, EngineOptions(fold=False))
    assert [a.rule for a in res.applications] == ["big"] and ops(m.export()) == ["Exp", "Neg"]


# ----- what explain reports ------------------------------------------------------------------------------------
def test_near_misses_name_the_most_advanced_failure():
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Neg", ["r"], ["y"], name="neg"),
             oh.make_node("Sigmoid", ["r"], ["z"], name="sig")]
    m = model(nodes, [("x", [3])], [("y", [3]), ("z", [3])])
    (miss,) = near_misses(m, rules(NEG_RELU), "cpu", min_progress=1)
    assert (miss.rule, miss.node, miss.op, miss.at, miss.progress) == ("neg-relu", "neg", "Neg", "relu", 2)
    assert "has 1 consumer(s) outside the match (Sigmoid 'sig')" in miss.reason


def test_reason_of_a_refused_full_match_survives_a_later_equal_attempt():
    r = rule("""
- id: neg-add
  doc: test
  match:
    s: Add(X, C)
    Y: Neg(s)
  where:
    C: {constant: true}
  rewrite:
    Y: X
""")
    nodes = [oh.make_node("Add", ["x", "c"], ["s"], name="add"), oh.make_node("Neg", ["s"], ["y"], name="neg"),
             oh.make_node("Sigmoid", ["s"], ["z"], name="sig")]
    b, best = match(r, model(nodes, [("x", [3])], [("y", [3]), ("z", [3])], {"c": np.ones(3, F32)}), "neg")
    assert b is None
    assert best.reason == "Add 'add' (line s) has 1 consumer(s) outside the match (Sigmoid 'sig')"


def test_rules_keep_their_order_on_nodes_made_in_the_same_sweep():
    """A Conv a fold makes goes to the earlier rule whose root it is, not to a later rule that reads it from a
    root indexed before the fold (Relu): that match waits for the next sweep, where the order holds."""
    rs = rules("""
        - id: fold
          match:
            c: Conv(X, W)
            Y: Neg(c)
          rewrite:
            Y: Conv(X, W)
        - id: first
          match:
            a: Abs(X)
            Y: Conv(a, W)
          rewrite:
            Y: Sigmoid(X)
        - id: later
          match:
            c: Conv(X, W)
            Y: Relu(c)
          rewrite:
            Y: Tanh(X)
    """)
    m = model([oh.make_node("Abs", ["x"], ["a"], name="abs"), oh.make_node("Conv", ["a", "w"], ["c"], name="conv"),
               oh.make_node("Neg", ["c"], ["n"], name="neg"), oh.make_node("Relu", ["n"], ["y"], name="relu")],
              [("x", [1, 2, 4, 4])], [("y", None)], {"w": np.ones((2, 2, 1, 1), np.float32)})
    res = run(m, rs, EngineOptions(fold=False))
    assert [a.rule for a in res.applications] == ["fold", "first"]
    assert sorted(n.op_type for n in m.graph.live_nodes()) == ["Relu", "Sigmoid"]
