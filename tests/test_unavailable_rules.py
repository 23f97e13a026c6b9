"""A built-in rule naming an operator the installed onnx or onnxruntime does not define (an older version the
dependency range allows) is unavailable with its reason, never a load error: `patterns list`, `patterns test`
and optimize's report say why, and the other rules work. A user's file naming an unknown operator stays an
error (a typo there is the likelier cause)."""

from __future__ import annotations

import os

import onnx
import pytest
from conftest import MODELS

import onnxfuse
from onnxfuse.patterns import parse_match

CNN = os.path.join(MODELS, "cnn_small.onnx")


@pytest.fixture
def old_onnx(monkeypatch):
    """onnx as an older one is: without RMSNormalization (added in opset 23)."""
    real = parse_match.op_spec
    monkeypatch.setattr(parse_match, "op_spec", lambda d, op, *a: None if op == "RMSNormalization" else real(d, op, *a))


def test_builtin_rule_with_an_unknown_op_is_unavailable_with_a_reason(old_onnx):
    rules = {r.id: r for r in onnxfuse.load_rules()}
    assert rules["rmsnorm"].unavailable == (
        f"RMSNormalization unknown to the installed onnx {onnx.__version__} and onnxruntime "
        f"{__import__('onnxruntime').__version__}: needs newer versions")
    # (and grouped-query-attention where the installed onnxruntime's GroupQueryAttention has no query_seqlens)
    newer_gqa = real_spec("com.microsoft", "GroupQueryAttention").max_inputs < 17
    assert sorted(r.id for r in rules.values() if r.unavailable) == sorted(["rmsnorm"] + (
        ["grouped-query-attention"] if newer_gqa else []))


def real_spec(domain: str, op: str):
    from onnxfuse.opschema import op_spec

    return op_spec(domain, op)


def test_a_builtin_rule_naming_a_newer_input_or_attribute_is_unavailable(monkeypatch):
    """An op the installed onnxruntime defines with fewer inputs or attributes than a built-in rule writes (its
    GroupQueryAttention before query_seqlens) makes the rule unavailable with the reason, not a load error."""
    import dataclasses

    real = parse_match.op_spec

    def older(d, op, *a):
        spec = real(d, op, *a)
        return dataclasses.replace(spec, max_inputs=12) if op == "GroupQueryAttention" and spec else spec
    monkeypatch.setattr(parse_match, "op_spec", older)
    rules = {r.id: r for r in onnxfuse.load_rules()}
    assert rules["grouped-query-attention"].unavailable.startswith(
        "com.microsoft.GroupQueryAttention with 17 inputs unknown to the installed onnx")
    assert rules["grouped-query-attention"].unavailable.endswith("needs newer versions")
    assert not rules["gqa-packed-qkv"].unavailable  # (its 9 inputs are there)


def test_patterns_list_and_test_say_why(old_onnx, cli):
    code, out, err = cli("patterns", "list", "--target", "cpu")
    assert code == 0, err
    row = next(line for line in out.splitlines() if "rmsnorm" in line)
    assert "no" in row and "RMSNormalization unknown to the installed onnx" in out
    code, out, err = cli("patterns", "test", "--rule", "rmsnorm")
    assert code == 0, err
    assert "skipped rmsnorm: RMSNormalization unknown to the installed onnx" in " ".join(out.split())


def test_optimize_still_runs_and_reports_the_rule_as_not_used(old_onnx, cli, tmp_path):
    code, out, err = cli("optimize", CNN, tmp_path / "o.onnx", "--no-validate")
    assert code == 0, err
    assert "rmsnorm (RMSNormalization unknown to the installed onnx" in " ".join(out.split())
    assert os.path.exists(tmp_path / "o.onnx")


def test_a_user_rule_with_an_unknown_op_is_still_an_error(old_onnx, tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("rules:\n- id: mine\n  match:\n    Y: RMSNormalization(X, S)\n  rewrite:\n    Y: Identity(X)\n")
    with pytest.raises(onnxfuse.PatternError, match="unknown operator 'RMSNormalization'"):
        onnxfuse.load_rules([str(f)], builtin=False)
