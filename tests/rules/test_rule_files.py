"""tests/rules mirrors patterns/: every built-in pattern file has its test file here, and every rule of the file
is named in it (a new rule without a test fails here)."""

import os

from .conftest import rule_ids_by_file

HERE = os.path.dirname(os.path.abspath(__file__))


def test_every_rule_file_and_rule_has_tests():
    missing = []
    for stem, ids in sorted(rule_ids_by_file().items()):
        path = os.path.join(HERE, f"test_{stem}.py")
        if not os.path.exists(path):
            missing.append(f"tests/rules/test_{stem}.py (for patterns/{stem}.yaml)")
            continue
        text = open(path, encoding="utf-8").read()
        missing += [f"{rid} (patterns/{stem}.yaml) in tests/rules/test_{stem}.py" for rid in ids
                    if f'"{rid}"' not in text]  # named literally: an f-string family would hide a missing rule
    assert not missing, "no tests for: " + "; ".join(missing)


def test_the_rule_index_sees_every_builtin_file():
    by_file = rule_ids_by_file()
    assert {"activation", "attention", "conv", "gelu", "matmul", "noop", "norm", "rotary", "shape",
            "transpose"} <= set(by_file)
    assert sum(map(len, by_file.values())) >= 89
