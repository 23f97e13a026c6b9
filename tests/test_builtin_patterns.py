"""Every built-in rule passes the self-tests generated from the rule itself (patterns test)."""

import pytest

from onnxfuse.api import builtin_patterns_dir, load_rules
from onnxfuse.patterns.parser import load_path
from onnxfuse.selftest import check_rule

RULES = load_path(builtin_patterns_dir(), builtin=True) + load_path(f"{builtin_patterns_dir()}/optional", builtin=True)


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_selftest(rule):
    report = check_rule(rule)
    assert report.ok, "\n".join(report.problems)
    assert report.instances >= 1


def test_builtin_rule_ids_unique_and_documented():
    rules = load_rules()
    assert len({r.id for r in rules}) == len(rules)
    assert all(r.doc.strip() for r in rules), [r.id for r in rules if not r.doc.strip()]


def test_selftest_catches_a_wrong_rule(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""rules:
- id: relu-is-not-sigmoid
  doc: wrong on purpose
  match:
    Y: Relu(X)
  rewrite:
    Y: Sigmoid(X)
""")
    report = check_rule(load_path(str(bad))[0])
    assert not report.ok
    assert any("outputs differ" in p for p in report.problems)


def test_selftest_catches_a_rule_that_ignores_its_constant(tmp_path):
    # The rewrite drops the constant, so a mutant with a different constant must not fire -- but this rule
    # has no const constraint, so the mutant list is empty and numerics catch it instead.
    bad = tmp_path / "bad.yaml"
    bad.write_text("""rules:
- id: add-one-is-identity
  doc: wrong on purpose
  match:
    Y: Add(X, ONE)
  where:
    ONE: {constant: true, shape: []}
  rewrite:
    Y: Identity(X)
""")
    report = check_rule(load_path(str(bad))[0])
    assert not report.ok
