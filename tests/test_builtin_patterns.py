"""Every built-in rule passes the self-tests generated from the rule itself (patterns test), in every floating
dtype it claims: validated on the CPU where onnxruntime has a kernel for it, held back (with the kernel registry's
reason) where not."""

import re

import pytest

from onnxfuse import builtin_patterns_dir, load_rules
from onnxfuse.inspect.selftest import check_rule, claimed_dtypes, dtype_label
from onnxfuse.patterns.parser import load_path
from onnxfuse.targets import kernel_issue

RULES = load_path(builtin_patterns_dir(), builtin=True) + load_path(f"{builtin_patterns_dir()}/optional", builtin=True)
CASES = [(r, d) for r in RULES for d in claimed_dtypes(r)]


@pytest.mark.parametrize(("rule", "dtype"), CASES, ids=[f"{r.id}-{dtype_label(d)}" for r, d in CASES])
def test_rule_selftest(rule, dtype):
    report = check_rule(rule, [dtype])
    assert report.ok, "\n".join(report.problems)
    (res,) = report.dtypes
    assert res.dtype == dtype_label(dtype) and res.instances >= 1
    if res.held_back:
        # Held back only where a kernel is missing: the fused op's (confirmed by the kernel registry), or an
        # original op's (onnxruntime's error, when the reference itself cannot run at this dtype).
        m = re.search(r"kernel for (?:(com\.microsoft)\.)?(\w+)", res.held_back)
        assert m or "implementation for" in res.held_back, f"held back without naming a kernel: {res.held_back}"
        if m:
            domain, op = m.group(1) or "", m.group(2)
            assert any(kernel_issue(domain, op, "cpu", dtype, None, i) for i in range(6)), res.held_back


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


def test_every_builtin_rule_has_an_example_its_self_test_runs():
    """A rule's `example:` gives the shapes (and values) its self-test builds: every built-in rule has one, so
    none is tested only on shapes guessed from its `where`."""
    assert not [r.id for r in RULES if not r.example and not r.example_attrs]


def test_no_match_line_is_copied_between_attention_rules():
    """What two attention rules share is a named sub-pattern (`patterns:` in attention.yaml), not a copied match
    line: a spelling learnt once reaches every rule that calls it."""
    import yaml

    data = yaml.safe_load(open(f"{builtin_patterns_dir()}/attention.yaml").read())
    seen: dict[str, str] = {}
    for rule in data["rules"]:
        for name, expr in (rule.get("match") or {}).items():
            line = f"{name}: {' '.join(str(expr).split())}"
            if len(line) > 40:  # a short line (`o: MatMul(weights(p), vh)`) is a name, not a spelling
                assert seen.setdefault(line, rule["id"]) == rule["id"], \
                    f"{rule['id']} copies {seen[line]}'s match line {line!r}: make it a named sub-pattern"
