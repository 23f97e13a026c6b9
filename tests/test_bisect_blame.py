"""When validation fails, the rollback names the rewrite whose node fails: the rule that created the node
onnxruntime names, else the one bisection finds, and never constant folding for a rule's node (a grouped-KV
Llama once had `constant-fold` blamed for a MultiHeadAttention the CPU kernel rejects)."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, load_rules, optimize
from onnxfuse.load.loader import load_model
from onnxfuse.rewrite.engine import EngineOptions, run
from onnxfuse.validate import validate
from onnxfuse.validate.runtime import failing_node

BAD_MHA = """rules:
- id: my-mha
  doc: wrong on purpose (3 heads do not divide the hidden size 64; the CPU kernel rejects it at run time)
  match:
    m: Mul(Q, K)
    Y: Add(m, V)
  rewrite:
    Y: com.microsoft.MultiHeadAttention(Q, K, V, num_heads=3)
"""

WRONG_NUMBERS = """rules:
- id: sigmoid-is-not-tanh
  doc: numerically wrong on purpose (onnxruntime runs it; the outputs differ)
  match:
    Y: Sigmoid(X)
  rewrite:
    Y: Tanh(X)
"""


def _mha_model(tmp_path) -> str:
    """q * k + v, scaled by a constant computed in the graph (1 + 2: folding makes it one Constant)."""
    nodes = [oh.make_node("Mul", ["q", "k"], ["m"], name="mul"), oh.make_node("Add", ["m", "v"], ["a"], name="add"),
             oh.make_node("Add", ["c1", "c2"], ["c"], name="const_add"),
             oh.make_node("Mul", ["a", "c"], ["y"], name="scale")]
    m = make_model(nodes, [(n, ["batch", 8, 64]) for n in "qkv"], [("y", ["batch", 8, 64])],
                   {"c1": np.float32(1.0), "c2": np.float32(2.0)})
    return save(m, tmp_path / "mha.onnx")


def _feeds(shape=(2, 8, 64), names="qkv"):
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(shape).astype(np.float32) for n in names}


def _optimize(tmp_path, src, rule_text):
    rules = tmp_path / "rules.yaml"
    rules.write_text(rule_text)
    out = tmp_path / "out.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False, patterns=[str(rules)], builtin=False))
    return r, out


def test_a_kernel_rejection_names_the_rule_that_created_the_node(tmp_path):
    src = _mha_model(tmp_path)
    r, out = _optimize(tmp_path, src, BAD_MHA)
    assert [rb.rule for rb in r.rolled_back] == ["my-mha"]
    rb = r.rolled_back[0]
    assert rb.node == "add/my-mha" and rb.root == "a"
    assert "the failure names node 'add/my-mha', created by this rewrite" in rb.reason
    assert "MultiHeadAttention node. Name:'add/my-mha'" in rb.reason  # onnxruntime's own message
    assert r.cleanups == {"constant-fold": 1}  # folding is kept: it was never the culprit
    assert r.validation == "passed after rolling back 1 rewrite(s)"
    got = onnx.load(str(out))
    assert "com.microsoft.MultiHeadAttention" not in op_types(got) and "Constant" in op_types(got)
    feeds = _feeds()
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-6)
    assert r.to_json()["rolled_back"][0]["node"] == "add/my-mha"


def test_bisection_finds_the_rule_when_no_node_is_named(tmp_path, monkeypatch):
    """The same failure without a node name (as when onnxruntime renamed the node in its own fusions):
    bisection over the rules' rewrites, folding in place around every prefix, finds the same rule."""
    monkeypatch.setattr(validate, "failing_node", lambda message: "")
    src = _mha_model(tmp_path)
    r, out = _optimize(tmp_path, src, BAD_MHA)
    assert [(rb.rule, rb.node) for rb in r.rolled_back] == [("my-mha", "")]
    assert "constant-fold" in r.cleanups
    feeds = _feeds()
    np.testing.assert_allclose(ort_run(onnx.load(str(out)), feeds)[0], ort_run(onnx.load(src), feeds)[0],
                               rtol=1e-6)


def test_wrong_numbers_blame_the_rule_not_the_folding_before_it(tmp_path):
    """A wrong output names no node: bisection. The folding that ran before the rule is not a prefix of its own
    (it runs in every prefix), so it cannot take the blame."""
    nodes = [oh.make_node("Add", ["c1", "c2"], ["c"], name="const_add"),
             oh.make_node("Mul", ["x", "c"], ["s"], name="scale"),
             oh.make_node("Sigmoid", ["s"], ["g"], name="sig"),
             oh.make_node("Relu", ["g"], ["y"], name="relu")]
    src = save(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])], {"c1": np.float32(1.0), "c2": np.float32(2.0)}),
               tmp_path / "m.onnx")
    r, out = _optimize(tmp_path, src, WRONG_NUMBERS)
    assert [rb.rule for rb in r.rolled_back] == ["sigmoid-is-not-tanh"]
    assert "differs" in r.rolled_back[0].reason and r.rolled_back[0].node == ""
    assert r.cleanups == {"constant-fold": 1}
    got = onnx.load(str(out))
    assert "Sigmoid" in op_types(got) and "Tanh" not in op_types(got)


def test_every_layer_named_is_rolled_back(tmp_path):
    """Many failing rewrites of one rule (one per layer): each named directly, one validation each, past the
    cap that bounds bisections."""
    from onnxfuse.validate.rollback import MAX_ROLLBACKS

    layers = MAX_ROLLBACKS + 2
    nodes, prev = [], "q"
    for i in range(layers):
        nodes += [oh.make_node("Mul", [prev, "k"], [f"m{i}"], name=f"mul{i}"),
                  oh.make_node("Add", [f"m{i}", "v"], [f"a{i}"], name=f"add{i}")]
        prev = f"a{i}"
    src = save(make_model(nodes, [(n, [2, 8, 64]) for n in "qkv"], [(prev, [2, 8, 64])]), tmp_path / "deep.onnx")
    r, out = _optimize(tmp_path, src, BAD_MHA)
    assert len(r.rolled_back) == layers and {rb.rule for rb in r.rolled_back} == {"my-mha"}
    assert all(rb.node for rb in r.rolled_back)
    assert r.fired == {}
    feeds = _feeds()
    np.testing.assert_allclose(ort_run(onnx.load(str(out)), feeds)[0], ort_run(onnx.load(src), feeds)[0],
                               rtol=1e-6)


@pytest.mark.parametrize("message, node", [
    ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MultiHeadAttention node. "
     "Name:'/layers.0/attn/mha' Status Message: num_heads", "/layers.0/attn/mha"),
    ("[ONNXRuntimeError] : 1 : FAIL : Node (fc/n) Op (FusedConv) [ShapeInferenceError] Input tensor must have at "
     "least 3 dimensions", "fc/n"),
    ("[ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model. Type Error: Type 'tensor(int64)' of input "
     "parameter (x) of operator (Gelu) in node (gelu/n) is invalid.", "gelu/n"),
    ("Could not find an implementation for Gelu(1) node with name 'gelu/n'", "gelu/n"),
    ("Unrecognized attribute: alpha for operator Relu\n\n==> Context: Bad node spec for node. Name: relu/c "
     "OpType: Relu", "relu/c"),
    ("onnxruntime failed to run the model: out of memory", ""),
])
def test_failing_node_in_messages(message, node):
    assert failing_node(message) == node


def _fold_after_rule_model(tmp_path) -> str:
    """x - x becomes a constant zero only through the rule; then folding can evaluate what reads it."""
    nodes = [oh.make_node("Sub", ["x", "x"], ["z"], name="sub"),
             oh.make_node("Add", ["c1", "c2"], ["c"], name="const_add"),
             oh.make_node("Mul", ["z", "c"], ["zc"], name="zc"),
             oh.make_node("Add", ["x", "zc"], ["y"], name="out")]
    return save(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])], {"c1": np.float32(1.0), "c2": np.float32(2.0)}),
                tmp_path / "z.onnx")


ZERO_RULE = """rules:
- id: x-minus-x
  doc: x - x is zero (for finite x)
  match:
    Y: Sub(X, X)
  where:
    X: {dtype: float32}
  compute:
    Z: float32(zeros(X.shape))
  rewrite:
    Y: Identity(Z)
"""


def test_a_bisection_prefix_keeps_the_folding_after_its_rewrites(tmp_path):
    """Prefix k of the rewrite sequence (what bisection validates) = folding, the first k rule rewrites, and
    folding again: a fused node sees the inputs folding gives it in the full run."""
    src = _fold_after_rule_model(tmp_path)
    (tmp_path / "z.yaml").write_text(ZERO_RULE)
    rules = load_rules([str(tmp_path / "z.yaml")], builtin=False)
    seqs = {}
    for k in (None, 0, 1):
        model, _ = load_model(src)
        seqs[k] = [a.rule for a in run(model, rules, EngineOptions(max_rewrites=k)).applications]
    assert seqs[0] == ["constant-fold"]  # folding only, no rule rewrite
    assert seqs[1] == seqs[None]  # the one rule rewrite, with the folding after it
    assert seqs[1][0] == "constant-fold" and seqs[1][1] == "x-minus-x" and seqs[1].count("constant-fold") > 1


# ---- grouped KV heads: a MultiHeadAttention the CPU kernel rejects -------------------------------------------
UNGUARDED_MHA = """rules:
- id: unguarded-mha
  doc: >
    wrong on purpose: passes the key as it is, also a 5-D grouped key [b, kv, rep, s, D] (what
    attention-heads-split-matmul, a rule of an earlier version, once did; the CPU kernel reads a 5-D key as packed KV and fails)
  match:
    kt: Reshape(Transpose(Reshape(K, K3), perm=[0, 2, 1]), K4)
    p: Softmax(Add(Div(MatMul(Q, kt), CD), M), axis=-1)
    o: MatMul(p, V)
    Y: Reshape(Transpose(o, perm=[0, 2, 1, 3]), OS)
  compute:
    Q3: int64([0, 0, 16])
  rewrite:
    qt: Transpose(Q, perm=[0, 2, 1, 3])
    q3: Reshape(qt, Q3)
    Y: com.microsoft.MultiHeadAttention(q3, K, V, _, _, M, num_heads=4, scale=0.5)
"""


def _grouped_kv_model(tmp_path) -> str:
    """4 query heads, 2 KV heads repeated by Unsqueeze + Expand (its shape computed from constants: folding has
    work before any rule), the K-transpose Reshape reading the 5-D Expand directly (as dynamo exports with static
    shapes leave it) and the value's repeat reshaped to 4 heads; scores scaled by Div and a causal additive mask."""
    b, s, d = 2, 8, 4
    nodes = [oh.make_node("Add", ["xs0", "xs1"], ["xs"], name="expand_shape"),  # folds to [2, 2, 2, 8, 4]
             oh.make_node("Unsqueeze", ["k", "ax2"], ["ku"], name="ku"),
             oh.make_node("Expand", ["ku", "xs"], ["kx"], name="kx"),
             oh.make_node("Unsqueeze", ["v", "ax2"], ["vu"], name="vu"),
             oh.make_node("Expand", ["vu", "xs"], ["vx"], name="vx"),
             oh.make_node("Reshape", ["vx", "r4"], ["vr"], name="vr"),
             oh.make_node("Reshape", ["kx", "k3"], ["k3v"], name="k3v"),
             oh.make_node("Transpose", ["k3v"], ["k3t"], perm=[0, 2, 1], name="k3t"),
             oh.make_node("Reshape", ["k3t", "k4"], ["kt"], name="kt"),
             oh.make_node("MatMul", ["q", "kt"], ["qk"], name="scores"),
             oh.make_node("Div", ["qk", "cd"], ["sc"], name="scale"),
             oh.make_node("Add", ["sc", "m"], ["scm"], name="masked"),
             oh.make_node("Softmax", ["scm"], ["p"], axis=-1, name="softmax"),
             oh.make_node("MatMul", ["p", "vr"], ["o"], name="pv"),
             oh.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="ot"),
             oh.make_node("Reshape", ["ot", "os"], ["y"], name="merge")]
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"xs0": i64(1, 1, 1, 4, 2), "xs1": i64(1, 1, 1, 4, 2), "ax2": i64(2), "r4": i64(b, 4, s, d),
             "k3": i64(-1, s, d), "k4": i64(b, 4, d, s), "os": i64(b, s, 16), "cd": np.float32(2.0)}
    m = make_model(nodes, [("q", [b, 4, s, d]), ("k", [b, 2, s, d]), ("v", [b, 2, s, d]), ("m", [b, 1, s, s])],
                   [("y", [b, s, 16])], inits)
    return save(m, tmp_path / "gqa.onnx")


def _gqa_feeds():
    rng = np.random.default_rng(0)
    return {"q": rng.standard_normal((2, 4, 8, 4)).astype(np.float32),
            "k": rng.standard_normal((2, 2, 8, 4)).astype(np.float32),
            "v": rng.standard_normal((2, 2, 8, 4)).astype(np.float32),
            "m": np.where(np.tril(np.ones((8, 8))), 0, -1e4).astype(np.float32)[None, None].repeat(2, 0)}


@pytest.mark.parametrize("named", [True, False])
def test_grouped_kv_heads_blame_the_rule_not_the_folding(tmp_path, monkeypatch, named):
    """The grouped-KV Llama case: the rule's MultiHeadAttention fails in the CPU kernel ("Packed KV not
    implemented for CPU"). The rule is rolled back, named by onnxruntime's message or (no node named) found by
    bisection; the folding before it is kept, never blamed."""
    if not named:
        monkeypatch.setattr(validate, "failing_node", lambda message: "")
    src = _grouped_kv_model(tmp_path)
    r, out = _optimize(tmp_path, src, UNGUARDED_MHA)
    assert [rb.rule for rb in r.rolled_back] == ["unguarded-mha"]
    assert "Packed KV" in r.rolled_back[0].reason
    assert bool(r.rolled_back[0].node) is named
    assert r.cleanups == {"constant-fold": 1}
    got = onnx.load(str(out))
    assert "com.microsoft.MultiHeadAttention" not in op_types(got)
    np.testing.assert_allclose(ort_run(got, _gqa_feeds())[0], ort_run(onnx.load(src), _gqa_feeds())[0], rtol=1e-6)


def test_grouped_kv_heads_fuse_with_the_builtin_rule(tmp_path):
    """The built-in attention-heads-split reshapes the 5-D grouped key to [b, 4, s, D]: the fused node runs in
    the CPU kernel and validates; nothing is rolled back."""
    src = _grouped_kv_model(tmp_path)
    out = tmp_path / "fused.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False, only=["attention-heads-split"]))
    assert r.fired.get("attention-heads-split") == 1 and r.rolled_back == []
    assert r.validation.startswith("passed")
    got = onnx.load(str(out))
    assert "com.microsoft.MultiHeadAttention" in op_types(got)
    np.testing.assert_allclose(ort_run(got, _gqa_feeds())[0], ort_run(onnx.load(src), _gqa_feeds())[0],
                               rtol=1e-4, atol=1e-5)
