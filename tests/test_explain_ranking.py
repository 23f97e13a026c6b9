"""`onnxfuse explain`: near misses closest first, the rows of rules that cannot apply on the model and target
hidden unless --all (counted, and how to see them), every row in --json with why it is hidden; "would fire"
labelled as what rewriting alone fires."""

from __future__ import annotations

import json

import numpy as np
import onnx.helper as oh
from conftest import make_model, save

# Rules that get part way into the same x * 0.5 * (1 + erf(x / 1.3)): one usable at opset 17 (all of its 5 nodes,
# refused on a constant), one that finds Erf where it needs Tanh, and one declared from opset 23 only (2 of its 2).
RULES = """rules:
- id: far-gelu
  match:
    Y: Mul(Mul(X, HALF), Add(Erf(Div(X, SQRT2)), ONE))
  where:
    SQRT2: {const: 1.4142135, rtol: 1e-3}
    HALF: {const: 0.5}
    ONE: {const: 7.0}
  rewrite:
    Y: com.microsoft.Gelu(X)
- id: tanh-not-erf
  match:
    Y: Mul(Mul(X, HALF), Add(Tanh(X), ONE))
  where:
    HALF: {const: 0.5}
  rewrite:
    Y: com.microsoft.FastGelu(X)
- id: late-rule
  opset: {min: 23}
  match:
    Y: Mul(Mul(X, HALF), P)
  where:
    HALF: {const: 0.25}
  rewrite:
    Y: Mul(X, P)
"""


def _model(tmp_path) -> str:
    nodes = [oh.make_node("Div", ["x", "sqrt2"], ["d"], name="div"), oh.make_node("Erf", ["d"], ["e"], name="erf"),
             oh.make_node("Add", ["e", "one"], ["p"], name="add"),
             oh.make_node("Mul", ["x", "half"], ["xh"], name="mul_half"),
             oh.make_node("Mul", ["xh", "p"], ["y"], name="gelu_out")]
    consts = {"sqrt2": np.array(1.3, "float32"), "one": np.array(1.0, "float32"), "half": np.array(0.5, "float32")}
    return save(make_model(nodes, [("x", [2, 8])], [("y", [2, 8])], consts), tmp_path / "g.onnx")


def _files(tmp_path) -> tuple[str, str]:
    (tmp_path / "r.yaml").write_text(RULES)
    return _model(tmp_path), str(tmp_path / "r.yaml")


def test_rows_of_rules_that_cannot_apply_are_hidden_and_counted(cli, tmp_path):
    model, rules = _files(tmp_path)
    code, stdout, stderr = cli("explain", model, "--patterns", rules)
    assert code == 0, stderr
    text = " ".join(stdout.split())
    assert "late-rule" not in text
    rows = json.loads(cli("explain", model, "--patterns", rules, "--json")[1])["near_misses"]
    hidden = sum(1 for r in rows if r["hidden"])
    assert hidden >= 1 and f"near misses ({len(rows) - hidden}, closest first)" in text
    assert "cannot apply on this model and cpu" in text
    assert f"{hidden} near miss{'es' if hidden > 1 else ''} of theirs hidden: --all shows them" in text
    code, stdout, _ = cli("explain", model, "--patterns", rules, "--all")
    text = " ".join(stdout.split())
    assert code == 0 and "late-rule" in text
    assert "rule late-rule not used for cpu: model opset 17 outside the rule's range 23..10000" in text
    (row,) = [ln for ln in stdout.splitlines() if ln.startswith("│ late-rule ")]  # piped: one line per row
    assert row.rstrip(" │").endswith("(rule cannot apply here: model opset 17 outside the rule's range 23..10000)")
    code, stdout, _ = cli("explain", model, "--patterns", rules, "--rule", "late-rule")  # asked for by name
    asked = [" ".join(ln.split()) for ln in stdout.splitlines() if ln.startswith("│ late-rule ")]
    assert code == 0 and " ".join(row.split()) in asked  # with every attempt of that rule (--rule)


def test_near_misses_closest_first_and_json_complete(cli, tmp_path):
    model, rules = _files(tmp_path)
    code, stdout, _ = cli("explain", model, "--patterns", rules, "--json")
    assert code == 0
    data = json.loads(stdout)
    rows, cannot = data["near_misses"], {s["rule"]: s["reason"] for s in data["skipped_rules"]}
    fractions = [r["fraction"] for r in rows]
    assert fractions == sorted(fractions, reverse=True) and len(set(fractions)) > 1
    late = [r for r in rows if r["rule"] == "late-rule"]
    assert late and all(r["hidden"].startswith("rule cannot apply here: model opset 17") for r in late)
    assert all(r["hidden"] == (f"rule cannot apply here: {cannot[r['rule']]}" if r["rule"] in cannot else "")
               for r in rows)
    # the table: the same order, with how much of each pattern matched
    code, stdout, _ = cli("explain", model, "--patterns", rules)
    shown = [r for r in rows if not r["hidden"]]
    lines = [ln for ln in stdout.splitlines() if ln.startswith("│ ") and ln.split("│")[1].strip()]
    assert [ln.split("│")[1].strip() for ln in lines] == [r["rule"] for r in shown]
    assert [ln.split("│")[2].strip() for ln in lines] == [f"{r['progress']}/{r['size']}" for r in shown]


def test_would_fire_says_it_is_rewriting_alone(cli, tmp_path):
    code, stdout, _ = cli("explain", save(make_model(
        [oh.make_node("Add", ["x", "z"], ["y"], name="a")], [("x", [2, 3])], [("y", [2, 3])],
        {"z": np.zeros(3, "float32")}), tmp_path / "z.onnx"))
    assert code == 0
    assert "would fire (rewriting alone, before validation and measured selection; optimize reports what it " \
           "keeps): add-zero x1" in " ".join(stdout.split())
