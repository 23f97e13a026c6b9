"""The example rule in docs/writing-patterns.md loads and passes its self-test, as the page says it does."""

from __future__ import annotations

import os
import re

import onnxfuse

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "writing-patterns.md")


def test_complete_example_rule_checks_and_self_tests(tmp_path):
    text = open(DOC, encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "id: conv-channel-scale" in b]
    assert len(blocks) == 1
    for key in ("require:", "compute:", "example:", "c.pads"):
        assert key in blocks[0]
    path = tmp_path / "scale.yaml"
    path.write_text(blocks[0])
    rules = onnxfuse.load_rules([str(path)], builtin=False)
    assert [r.id for r in rules] == ["conv-channel-scale"]
    (report,) = list(onnxfuse.self_test(rules))
    assert report.ok, report.problems
    assert report.summary == "float32: 2 models fired once with equal outputs; 1 mutant did not fire"
