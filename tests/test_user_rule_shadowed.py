"""`onnxfuse patterns check FILE` warns when a built-in rule takes the nodes a user's rule matches (on the user
rule's own example model): a user `my-swish` is the built-in `silu`, which fires first."""

from __future__ import annotations

SWISH = """rules:
- id: my-swish
  doc: x * sigmoid(x) -> QuickGelu with alpha 1
  match:
    Y: Mul(X, Sigmoid(X))
  where:
    X: {dtype: [float32]}
  rewrite:
    Y: com.microsoft.QuickGelu(X, alpha=1.0)
"""

OWN = """rules:
- id: my-abs-abs
  doc: abs(abs(x)) is abs(x), a rule no built-in has
  match:
    Y: Abs(Abs(X))
  rewrite:
    Y: Abs(X)
"""


def test_a_rule_a_builtin_shadows_is_named(cli, tmp_path):
    path = tmp_path / "swish.yaml"
    path.write_text(SWISH)
    code, stdout, stderr = cli("patterns", "check", path)
    assert code == 0
    assert f"{path}: 1 rule, 1 warning" in stdout
    assert f"{path}:2:7: warning: rule 'my-swish' loses to built-in rule 'silu' (" in stderr
    assert "'silu' fires first on the same nodes (n1_Sigmoid, n2_Mul) and 'my-swish' never fires" in stderr
    assert "`--skip silu` lets yours fire" in stderr


def test_a_rule_no_builtin_takes_is_not_warned(cli, tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(OWN)
    code, stdout, stderr = cli("patterns", "check", path)
    assert code == 0
    assert "loses to" not in stderr and f"{path}: ok (1 rule)" in stdout


def test_the_builtin_files_themselves_check_clean(cli):
    code, stdout, stderr = cli("patterns", "check", "patterns/activation.yaml")
    assert code == 0 and "loses to" not in stderr and "ok (" in stdout
