"""A user's rule that can never be used is said so before any model is optimized: `patterns check` warns (a
fused op with no kernel on any of the rule's targets, an id that collides with a built-in rule's) and
`patterns test` says why a rule fired 0 times and marks a rule it could not validate here as such."""

from __future__ import annotations

from onnxfuse.inspect.selftest import check_rule
from onnxfuse.inspect.selftest_report import NOT_VALIDATED
from onnxfuse.kernels.applicable import rule_issue
from onnxfuse.patterns.parser import load_path

MISH = """rules:
- id: my-mish
  doc: x * tanh(softplus(x)) -> Mish (no CPU kernel in onnxruntime)
  targets: [cpu]
  match:
    Y: Mul(X, Tanh(Softplus(X)))
  rewrite:
    Y: Mish(X)
"""
SILU = """rules:
- id: silu
  match:
    Y: Mul(X, Sigmoid(X))
  rewrite:
    Y: com.microsoft.QuickGelu(X, alpha=1.0)
"""
REQUIRE = """rules:
- id: add-relu-seven
  match:
    a: Add(X, B)
    Y: Relu(a)
  where:
    B: {constant: true}
  require: ['B.shape[0] == 7']
  compute:
    NB: 0.0 - B
  rewrite:
    a2: Sub(X, NB)
    Y: Relu(a2)
"""


def _file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_check_warns_for_a_rule_with_no_kernel_on_its_targets(cli, tmp_path):
    path = _file(tmp_path, "mish.yaml", MISH)
    rule = load_path(path)[0]
    issue = rule_issue(rule, "cpu", None)  # the kernel registry's own words, not a hard-coded list
    assert issue and "Mish" in issue
    code, stdout, stderr = cli("patterns", "check", path)
    assert code == 0
    assert "ok" not in stdout and f"{path}: 1 rule, 1 warning" in stdout
    assert f"{path}:2:7: warning: rule 'my-mish' can never be used on its targets (cpu: {issue})" in stderr


def test_check_warns_for_a_builtin_id_and_optimize_hints_the_way_out(cli, tmp_path):
    path = _file(tmp_path, "silu.yaml", SILU)
    code, stdout, stderr = cli("patterns", "check", path)
    assert code == 0 and "1 warning" in stdout
    assert f"{path}:2:7: warning: rule id 'silu' is also a built-in rule's" in stderr
    assert "--no-builtin" in stderr
    code, _, stderr = cli("optimize", "models/cnn_small.onnx", tmp_path / "o.onnx", "--patterns", path)
    assert code == 1 and len(stderr.strip().splitlines()) == 1
    assert "rule id 'silu' is already defined" in stderr and "(a built-in rule)" in stderr
    assert "hint: rule ids are global: rename yours (e.g. 'my-silu'), or pass --no-builtin" in stderr
    code, _, stderr = cli("optimize", "models/cnn_small.onnx", tmp_path / "o.onnx", "--patterns", path,
                          "--no-builtin")
    assert code == 0, stderr


def test_check_of_the_builtin_files_is_clean(cli):
    code, stdout, stderr = cli("patterns", "check", "patterns")
    assert code == 0 and "patterns: ok (" in stdout and "warning" not in stderr


def test_selftest_says_why_a_rule_never_fired_and_points_to_example(tmp_path):
    rep = check_rule(load_path(_file(tmp_path, "r.yaml", REQUIRE))[0])
    assert rep.status == "FAIL" and rep.problems
    assert all("fired 0 times on target cpu, expected once: at " in p for p in rep.problems), rep.problems
    assert "require failed: B.shape[0] == 7" in rep.problems[0]
    assert "give the rule an `example:`" in rep.problems[0]
    # with an example that satisfies the require, the same rule passes
    fixed = REQUIRE.replace("  rewrite:", "  example:\n    X: [2, 7]\n    B: [7]\n  rewrite:")
    rep = check_rule(load_path(_file(tmp_path, "fixed.yaml", fixed))[0])
    assert rep.status == "ok", rep.problems


def test_selftest_names_the_missing_kernel(cli, tmp_path):
    path = _file(tmp_path, "mish.yaml", MISH)
    code, stdout, _ = cli("patterns", "test", path)
    assert code == 1
    assert "FAIL my-mish" in stdout and "the rule can never be used: cpu: no CPU kernel for Mish" in stdout


def test_a_rule_held_back_for_lack_of_a_kernel_is_not_validated_here(cli):
    rep = check_rule(load_path("patterns/conv.yaml")[[r.id for r in load_path("patterns/conv.yaml")].index(
        "conv-nhwc")])
    # NhwcConv has no kernel in the CPU-only onnxruntime: it fires, but its outputs cannot be compared here
    assert rep.ok and rep.status == NOT_VALIDATED
    assert all(d.held_back and "NhwcConv" in d.held_back for d in rep.dtypes)
    code, stdout, _ = cli("patterns", "test", "--rule", "conv-nhwc")
    assert code == 0
    assert "not validated here conv-nhwc" in stdout and "ok conv-nhwc" not in stdout
    assert "1 rule: 0 ok, 1 not validated here, 0 FAIL" in stdout


ERF_GELU = """rules:
- id: my-gelu
  doc: 0.5 * x * (1 + erf(x / sqrt(2))) -> Gelu (an ONNX op from opset 20 only)
  match:
    Y: Mul(Mul(X, Add(Erf(Div(X, S2)), ONE)), HALF)
  where:
    S2: {constant: true}
    ONE: {constant: true}
    HALF: {constant: true}
  rewrite:
    Y: Gelu(X)
"""


def _erf_gelu(opset):
    import numpy as np
    import onnx.helper as oh
    from conftest import make_model

    nodes = [oh.make_node("Div", ["x", "s2"], ["d"], name="d"), oh.make_node("Erf", ["d"], ["e"], name="e"),
             oh.make_node("Add", ["e", "one"], ["a"], name="a"), oh.make_node("Mul", ["x", "a"], ["m"], name="m"),
             oh.make_node("Mul", ["m", "half"], ["y"], name="y")]
    return make_model(nodes, [("x", [2, 8])], [("y", [2, 8])],
                      {"s2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0), "half": np.float32(0.5)}, opset=opset)


def test_a_rule_emitting_an_onnx_op_the_models_opset_does_not_define_is_held_back(cli, tmp_path):
    """The engine's one check (rule_issue) for every rule, built-in or not: Gelu is ONNX's from opset 20, so on an
    opset-18 model the rule is held back with the reason, which explain and optimize show; at opset 20 it fires
    and the output passes the full onnx.checker."""
    import json

    import onnx
    from conftest import op_types, save

    rule = load_path(_file(tmp_path, "gelu.yaml", ERF_GELU))[0]
    why = ("Gelu is not an ONNX op at the model's opset 18 (ONNX defines it from opset 20): onnx.checker would "
           "reject the output")
    assert rule_issue(rule, "cpu", 18) == why and rule_issue(rule, "cpu", 20) is None
    path = str(tmp_path / "gelu.yaml")
    src18 = save(_erf_gelu(18), tmp_path / "g18.onnx")
    code, stdout, stderr = cli("explain", src18, "--patterns", path, "--json")
    assert code == 0, stderr
    assert {"rule": "my-gelu", "reason": why} in json.loads(stdout)["skipped_rules"]
    code, stdout, stderr = cli("optimize", src18, str(tmp_path / "o18.onnx"), "--patterns", path, "--only", "my-gelu")
    assert code == 0, stderr
    assert f"my-gelu ({why})" in " ".join(stdout.split())
    assert op_types(onnx.load(str(tmp_path / "o18.onnx"))) == op_types(_erf_gelu(18))
    src20 = save(_erf_gelu(20), tmp_path / "g20.onnx")
    code, stdout, stderr = cli("optimize", src20, str(tmp_path / "o20.onnx"), "--patterns", path, "--only", "my-gelu")
    assert code == 0, stderr
    got = onnx.load(str(tmp_path / "o20.onnx"))
    assert op_types(got) == ["Gelu"]
    onnx.checker.check_model(got, full_check=True)
