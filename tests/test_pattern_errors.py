"""A bad pattern file gives one `file:line:col: error: ...` line pointing at the mistake, with a hint."""

import pytest

from onnxfuse.errors import PatternError
from onnxfuse.patterns.parser import load_file

GOOD = """rules:
- id: conv-relu-user
  doc: test
  match:
    c: Conv(X, W, B?)
    Y: Relu(c)
  where:
    W: {constant: true}
  rewrite:
    Y: com.microsoft.FusedConv(X, W, B?, activation="Relu", copy_attrs=c)
"""

SUB = "patterns:\n  act(x): Relu(x) | Clip(x)\n" + GOOD.replace("Y: Relu(c)", "Y: act(c)")

CASES = [
    # (name, text, line, col, message fragment)
    ("sub-pattern called with too many arguments", SUB.replace("Y: act(c)", "Y: act(c, X)"), 8, 8,
     "sub-pattern 'act' takes 1 argument(s) (x), got 2"),
    ("sub-pattern with an unknown operator", SUB.replace("Clip(x)", "Clipp(x)"), 2, 21, "unknown operator 'Clipp'"),
    ("sub-pattern that does not use its parameter", SUB.replace("act(x):", "act(x, y):"), 2, 3,
     "sub-pattern 'act' does not use its parameter 'y'"),
    ("sub-pattern name not a signature", SUB.replace("act(x):", "Act:"), 2, 3,
     "must be a lowercase name with its parameters"),
    ("sub-pattern named as a concept", SUB.replace("act(x):", "layout(x):"), 2, 3, "is a concept's name"),
    ("yaml syntax", "rules:\n- id: x\n  match: {a: b\n", 4, 1, "YAML syntax"),
    ("unknown top key", "rule:\n- id: x\n", 1, 1, "unknown key 'rule' at top level"),
    ("unknown rule key", GOOD.replace("  doc: test", "  dok: test"), 3, 3, "unknown key 'dok' in rule"),
    ("unknown op", GOOD.replace("Relu(c)", "Relux(c)"), 6, 8, "unknown operator 'Relux'"),
    ("unknown contrib op", GOOD.replace("com.microsoft.FusedConv", "com.microsoft.FusedConf"), 10, 8,
     "unknown operator 'com.microsoft.FusedConf'"),
    ("wrong arity", GOOD.replace("Relu(c)", "Relu(c, X)"), 6, 8, "Relu takes 1 inputs, got 2"),
    ("undefined name in match", GOOD.replace("Relu(c)", "Relu(cc)"), 6, 13, "undefined name 'cc'"),
    ("undefined name in rewrite", GOOD.replace("FusedConv(X, W,", "FusedConv(X, V,"), 10, 35,
     "undefined name 'V' in rewrite"),
    ("rewrite misses output", GOOD.replace("    Y: com.microsoft", "    Z: com.microsoft"), 6, 8,
     "rewrite does not produce 'Y'"),
    ("bad constraint value", GOOD.replace("{constant: true}", "{constant: yes please}"), 8, 19,
     "'constant' must be true or false"),
    ("unknown constraint", GOOD.replace("{constant: true}", "{constnt: true}"), 8, 9, "unknown constraint 'constnt'"),
    ("bad dtype", GOOD.replace("{constant: true}", "{dtype: float33}"), 8, 16, "unknown dtype 'float33'"),
    ("unknown attribute", GOOD.replace('activation="Relu"', 'activaton="Relu"'), 10, 42,
     "has no attribute 'activaton'"),
    ("where names unknown value", GOOD.replace("    W: {constant: true}", "    Q: {constant: true}"), 8, 5,
     "'where' names 'Q', which the match does not use"),
    ("unused line", GOOD.replace("    Y: Relu(c)", "    d: Relu(X)\n    Y: Relu(c)"), 6, 8,
     "match line 'd' is not used by the root line 'Y'"),
    ("compute unused", GOOD.replace("  rewrite:", "  compute:\n    K: W * 2\n  rewrite:"), 10, 8,
     "compute value 'K' is never used"),
    ("compute reads non-constant", GOOD.replace("  rewrite:", "  compute:\n    K: X * 2\n  rewrite:")
     .replace("FusedConv(X, W,", "FusedConv(X, K,"), 10, 8, "may not be constant"),
    ("unsafe compute", GOOD.replace("  rewrite:", "  compute:\n    K: __import__('os')\n  rewrite:"), 10, 8,
     "unknown function '__import__'"),
    ("dunder field", GOOD.replace("  rewrite:", "  compute:\n    K: W.__class__\n  rewrite:"), 10, 8,
     "field '__class__' is not allowed"),
    ("bad expression", GOOD.replace("Relu(c)", "Relu(c"), 6, 12, "syntax error"),
    ("duplicate id", GOOD + GOOD.split("rules:\n", 1)[1], 11, 7, "duplicate rule id 'conv-relu-user'"),
    ("bad target", GOOD + "  targets: [tpu]\n", 11, 12, "unknown target 'tpu'"),
    ("empty file", "", 1, 1, "empty pattern file"),
    # messages that come from the vocabulary tables (onnxfuse/patterns/parser.py)
    ("missing rule key", GOOD.replace("  match:\n    c: Conv(X, W, B?)\n    Y: Relu(c)\n", ""), 2, 3,
     "rule is missing 'match'"),
    ("unknown target key", GOOD + "  targets: {cuda: {foo: 1}}\n", 11, 20,
     "unknown key 'foo' for target 'cuda' (hint: a target takes: require)"),
    ("misspelt target key", GOOD + "  targets: {cuda: {requre: []}}\n", 11, 20, "did you mean 'require'?"),
    ("unknown stage", GOOD + "  stage: late\n", 11, 10, "unknown stage 'late' (hint: stages are: early, main)"),
    ("unknown measure", GOOD + "  measure: whole\n", 11, 12,
     "unknown measure 'whole' (hint: measure is one of: region, model)"),
    ("unknown expect", GOOD + "  expect: sometimes\n", 11, 11,
     "unknown expect 'sometimes' (hint: expect is one of: faster, neutral, unknown)"),
    ("unknown value field", GOOD + "  require: ['X.shapes[0] > 1']\n", 11, 14,
     "values have no field 'shapes' (hint: fields: value, shape, dims, rank, dtype, size, constant)"),
    ("condition without reason", GOOD + "  require: [{check: 'W.rank == 4'}]\n", 11, 13,
     "a 'require' condition as a mapping needs 'check' and 'reason'"),
    ("condition key misspelt", GOOD + "  require: [{check: 'W.rank == 4', reson: x}]\n", 11, 13,
     "unknown key 'reson' in a 'require' condition"),
]


@pytest.mark.parametrize("name,text,line,col,fragment", CASES, ids=[c[0] for c in CASES])
def test_error_points_at_the_mistake(tmp_path, name, text, line, col, fragment):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PatternError) as info:
        load_file(str(path))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{line}:{col}: error: "), msg
    assert fragment in msg, msg


def test_good_file_loads(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    (rule,) = load_file(str(path))
    assert rule.id == "conv-relu-user" and rule.root == "Y" and rule.size == 2


def test_condition_reason_is_the_message(tmp_path):
    """A condition with a reason reports the reason (the concept), then the expression it checks."""
    path = tmp_path / "p.yaml"
    path.write_text(GOOD + "  require:\n  - check: W.rank == 5\n    reason: the kernel is not 3-D\n")
    (rule,) = load_file(str(path))
    assert [text for _, text in rule.require] == ["the kernel is not 3-D (W.rank == 5)"]


def test_hint_offers_closest_op(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("Relu(c)", "Rleu(c)"))
    with pytest.raises(PatternError, match=r"did you mean 'Relu'\?"):
        load_file(str(path))


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("rules: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(PatternError, match="YAML tag 'tag:yaml.org,2002:python/object/apply:os.system'"):
        load_file(str(path))


def test_all_errors_are_collected(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("Relu(c)", "Relux(c)").replace("  doc: test", "  dok: test"))
    with pytest.raises(PatternError) as info:
        load_file(str(path))
    assert len(info.value.diagnostics) == 2
