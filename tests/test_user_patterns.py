"""Patterns written by a user in their own YAML file apply through --patterns; wrong ones are rolled back."""

import numpy as np
import onnx
import onnx.helper as oh
from conftest import make_model, op_types, ort_run, save

from onnxfuse import OptimizeOptions, optimize

USER_RULES = """# my own fusions
rules:
- id: double-neg
  doc: -(-x) is x.
  match:
    n: Neg(X)
    Y: Neg(n)
  rewrite:
    Y: X
- id: mul-add-to-fma-free
  doc: (x * a) + b with scalar constants folds into one Mul and one Add constant... here into Affine-free form.
  match:
    m: Mul(X, A)
    Y: Add(m, B)
  where:
    A: {constant: true, shape: []}
    B: {constant: true, shape: []}
  compute:
    B2: B / A
  rewrite:
    s: Add(X, B2)
    Y: Mul(s, A)
"""


def _model(tmp_path):
    nodes = [
        oh.make_node("Neg", ["x"], ["n1"], name="neg1"),
        oh.make_node("Neg", ["n1"], ["n2"], name="neg2"),
        oh.make_node("Mul", ["n2", "a"], ["m"], name="mul"),
        oh.make_node("Add", ["m", "b"], ["y"], name="add"),
    ]
    m = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])],
                   {"a": np.array(4.0, np.float32), "b": np.array(2.0, np.float32)})
    return save(m, tmp_path / "user.onnx")


def test_user_pattern_file_applies(tmp_path, cli):
    src = _model(tmp_path)
    rules = tmp_path / "mine.yaml"
    rules.write_text(USER_RULES)
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", src, out, "--patterns", rules, "--no-builtin")
    assert code == 0, stderr
    assert "double-neg" in stdout and "mul-add-to-fma-free" in stdout
    got = onnx.load(str(out))
    assert op_types(got) == ["Add", "Mul"]
    add = got.graph.node[0]
    assert add.input[0] == "x"  # the Neg pair is gone: the Add reads x directly
    b2 = {t.name: onnx.numpy_helper.to_array(t) for t in got.graph.initializer}[add.input[1]]
    assert b2.dtype == np.float32 and float(b2) == 0.5
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-6)


def test_user_patterns_from_a_folder(tmp_path):
    src = _model(tmp_path)
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "a.yaml").write_text(USER_RULES)
    r = optimize(src, str(tmp_path / "o.onnx"), OptimizeOptions(measure=False, patterns=[str(folder)]))
    assert r.fired == {"double-neg": 1, "mul-add-to-fma-free": 1}


WRONG_RULE = """rules:
- id: sigmoid-is-not-tanh
  doc: numerically wrong on purpose
  match:
    Y: Sigmoid(X)
  rewrite:
    Y: Tanh(X)
"""


def test_wrong_rewrite_is_rolled_back(tmp_path):
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("Sigmoid", ["r"], ["s"], name="sig"),
        oh.make_node("Neg", ["s"], ["n1"], name="neg1"),
        oh.make_node("Neg", ["n1"], ["y"], name="neg2"),
    ]
    src = save(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])]), tmp_path / "m.onnx")
    rules = tmp_path / "r.yaml"
    rules.write_text(WRONG_RULE + USER_RULES.split("rules:\n", 1)[1])
    out = tmp_path / "out.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False, patterns=[str(rules)], builtin=False))
    assert [rb.rule for rb in r.rolled_back] == ["sigmoid-is-not-tanh"]
    assert "differs" in r.rolled_back[0].reason
    assert r.fired == {"double-neg": 1}  # the good rewrite stays
    assert r.validation == "passed after rolling back 1 rewrite(s)"
    got = onnx.load(str(out))
    assert "Sigmoid" in op_types(got) and "Tanh" not in op_types(got)
    feeds = {"x": np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-6)


def test_invalid_graph_rewrite_never_written(tmp_path):
    """A rewrite whose output model cannot load in onnxruntime is rolled back before anything is written."""
    rules = tmp_path / "r.yaml"
    rules.write_text("""rules:
- id: relu-to-fusedconv
  doc: nonsense on purpose (FusedConv on a 2-D tensor)
  match:
    Y: Relu(X)
  rewrite:
    Y: com.microsoft.FusedConv(X, X, activation="Relu")
""")
    src = save(make_model([oh.make_node("Relu", ["x"], ["y"], name="relu")], [("x", [2, 3])], [("y", [2, 3])]),
               tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    r = optimize(src, str(out), OptimizeOptions(measure=False, patterns=[str(rules)], builtin=False))
    assert [rb.rule for rb in r.rolled_back] == ["relu-to-fusedconv"]
    assert op_types(onnx.load(str(out))) == ["Relu"]


GROWING = """rules:
- id: neg-grow
  doc: A rule whose rewrite contains its own pattern three times.
  match:
    Y: Neg(X)
  rewrite:
    n: Neg(X)
    m: Neg(n)
    Y: Neg(m)
"""


def test_a_rule_that_matches_its_own_output_is_named(tmp_path, cli):
    """Each sweep would triple the graph (3^32 nodes by the sweep limit: memory ran out first); the run stops
    with one line naming the rule once the graph has grown past 4x."""
    m = make_model([oh.make_node("Neg", ["x"], ["y"], name="neg")], [("x", [2])], [("y", [2])])
    rules = tmp_path / "grow.yaml"
    rules.write_text(GROWING)
    code, stdout, stderr = cli("optimize", save(m, tmp_path / "neg.onnx"), tmp_path / "o.onnx", "--patterns", rules)
    assert code == 1 and stdout == ""
    assert stderr.startswith("onnxfuse: error: rule 'neg-grow' keeps matching its own output") and "\n" == stderr[-1:]
    assert not (tmp_path / "o.onnx").exists()


SAME = """rules:
- id: relu-same
  match:
    Y: Relu(X)
  rewrite:
    Y: Relu(X)
"""
UNDOING = """rules:
- id: relu-to-abs
  match:
    Y: Relu(X)
  rewrite:
    Y: Abs(X)
- id: abs-to-relu
  match:
    Y: Abs(X)
  rewrite:
    Y: Relu(X)
"""
LIMIT = ("onnxfuse: warning: the rules reached no fixed point: the graph still changed after 32 sweeps (stopped "
         "there); still firing: {} (a rule whose rewrite is its own match, or rules that undo each other; --skip "
         "one of them)")


def _relu_model(tmp_path):
    return save(make_model([oh.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("y", [2])]),
                tmp_path / "relu.onnx")


def test_a_rule_whose_rewrite_is_its_match_is_warned_about_at_the_sweep_limit(tmp_path, cli):
    rules = tmp_path / "same.yaml"
    rules.write_text(SAME)
    code, stdout, stderr = cli("optimize", _relu_model(tmp_path), tmp_path / "o.onnx", "--no-builtin",
                               "--patterns", rules, "--json")
    assert code == 0, stderr
    assert stderr.strip().splitlines() == [LIMIT.format("relu-same")]
    import json
    assert json.loads(stdout)["warnings"] == [LIMIT.format("relu-same").removeprefix("onnxfuse: warning: ")]
    assert (tmp_path / "o.onnx").exists()


SAME3 = """rules:
- id: chain-same
  match:
    Y: Softmax(Add(Relu(S), M), axis=-1)
  rewrite:
    r: Relu(S)
    a: Add(r, M)
    Y: Softmax(a, axis=-1)
"""


def test_a_self_matching_rule_of_several_nodes_stops_at_the_limit_in_bounded_memory(tmp_path, cli):
    """Each rewrite records the original nodes it replaced; three nodes each carrying the whole list tripled it
    every sweep (3^32 entries: the command was killed for memory). Each original is listed once."""
    m = make_model([oh.make_node("Relu", ["s"], ["r"]), oh.make_node("Add", ["r", "m"], ["a"]),
                    oh.make_node("Softmax", ["a"], ["y"], axis=-1)], [("s", [2, 4]), ("m", [2, 4])], [("y", [2, 4])])
    (tmp_path / "same3.yaml").write_text(SAME3)
    code, _, stderr = cli("optimize", save(m, tmp_path / "m.onnx"), tmp_path / "o.onnx", "--no-builtin",
                          "--patterns", tmp_path / "same3.yaml", "--no-measure")
    assert code == 0, stderr
    assert stderr.strip().splitlines() == [LIMIT.format("chain-same")]


def test_two_rules_that_undo_each_other_are_both_named(tmp_path, cli):
    rules = tmp_path / "undo.yaml"
    rules.write_text(UNDOING)
    code, stdout, stderr = cli("optimize", _relu_model(tmp_path), tmp_path / "o.onnx", "--no-builtin",
                               "--patterns", rules)
    assert code == 0, stderr
    assert stderr.strip().splitlines() == [LIMIT.format("abs-to-relu, relu-to-abs")]
    assert "32 sweeps" in stdout


def test_a_fixed_point_gives_no_warning(tmp_path, cli):
    rules = tmp_path / "user.yaml"
    rules.write_text(USER_RULES)
    code, _, stderr = cli("optimize", _model(tmp_path), tmp_path / "o.onnx", "--patterns", rules)
    assert code == 0 and "warning" not in stderr, stderr


def test_patterns_check_names_a_rule_whose_rewrite_is_its_match(tmp_path, cli):
    (tmp_path / "same.yaml").write_text(SAME)
    (tmp_path / "undo.yaml").write_text(UNDOING)
    code, stdout, stderr = cli("patterns", "check", tmp_path / "same.yaml", tmp_path / "undo.yaml")
    assert code == 0
    assert stderr.strip().splitlines() == [
        f"{tmp_path / 'same.yaml'}:2:7: warning: rule 'relu-same' rewrites its match into the same nodes: it fires "
        "again on its own output every sweep, until the limit of 32 sweeps (hint: rewrite into something else, or "
        "delete the rule)"]
    assert "same.yaml: 1 rule, 1 warning" in stdout and "undo.yaml: ok (2 rules)" in stdout


def test_a_batch_names_the_model_of_each_warning(tmp_path, cli):
    rules = tmp_path / "same.yaml"
    rules.write_text(SAME)
    src = tmp_path / "in"
    src.mkdir()
    paths = [_relu_model(src), save(make_model([oh.make_node("Relu", ["x"], ["y"], name="r")], [("x", [3])],
                                               [("y", [3])]), src / "relu3.onnx")]
    (tmp_path / "out").mkdir()
    code, _, stderr = cli("optimize", *paths, tmp_path / "out", "--no-builtin", "--patterns", rules, "--jobs", "1")
    assert code == 0, stderr
    for p in paths:
        assert LIMIT.format("relu-same").replace("warning: ", f"warning: {p}: ", 1) in stderr.splitlines(), stderr
