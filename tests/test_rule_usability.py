"""A user's rule that can never be used is said so before any model is optimized: `patterns check` warns (a
fused op with no kernel on any of the rule's targets, an id that collides with a built-in rule's) and
`patterns test` says why a rule fired 0 times and marks a rule it could not validate here as such."""

from __future__ import annotations

from onnxfuse.inspect.selftest import NOT_VALIDATED, check_rule
from onnxfuse.patterns.parser import load_path
from onnxfuse.rewrite.engine import rule_issue

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
    assert "ok" not in stdout and f"{path}: 1 rules, 1 warning(s)" in stdout
    assert f"{path}:2:7: warning: rule 'my-mish' can never be used on its targets (cpu: {issue})" in stderr


def test_check_warns_for_a_builtin_id_and_optimize_hints_the_way_out(cli, tmp_path):
    path = _file(tmp_path, "silu.yaml", SILU)
    code, stdout, stderr = cli("patterns", "check", path)
    assert code == 0 and "1 warning(s)" in stdout
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
    assert "1 rule(s): 0 ok, 1 not validated here, 0 FAIL" in stdout
