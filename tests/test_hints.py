"""Hints that point the right way: an op named in the wrong domain, a misspelt op with its domain, a tab in a
pattern file, an unknown flag (only close options suggested), help that names values as a user writes them, and
counts in the right number."""

from __future__ import annotations

import os
import re

import pytest
from conftest import MODELS

from onnxfuse.words import count

CNN = os.path.join(MODELS, "cnn_small.onnx")


def _rule(tmp_path, match: str, indent: str = "    ") -> str:
    path = tmp_path / "p.yaml"
    path.write_text(f"rules:\n- id: x\n  match:\n{indent}Y: {match}\n  rewrite:\n    Y: Relu(Q)\n")
    return str(path)


@pytest.mark.parametrize(("op", "hint"), [
    ("com.microsoft.Sigmoid", "did you mean 'Sigmoid'? Sigmoid is an ONNX op, written without a domain"),
    ("QuickGelux", "did you mean 'com.microsoft.QuickGelu'?"),
    ("com.microsoft.QuickGelux", "did you mean 'com.microsoft.QuickGelu'?"),
    ("Relux", "did you mean 'Relu'?"),
])
def test_unknown_operator_hints(cli, tmp_path, op, hint):
    path = _rule(tmp_path, f"{op}(Q)")
    code, _, stderr = cli("patterns", "check", path)
    assert code == 1
    assert stderr.strip() == f"{path}:4:8: error: unknown operator {op!r} (hint: {hint})"


def test_nothing_close_means_no_hint(cli, tmp_path):
    path = _rule(tmp_path, "Zzzzq(Q)")
    code, _, stderr = cli("patterns", "check", path)
    assert code == 1 and stderr.strip() == f"{path}:4:8: error: unknown operator 'Zzzzq'"


def test_a_tab_in_yaml_is_named(cli, tmp_path):
    path = _rule(tmp_path, "Relu(Q)", indent="\t")
    code, _, stderr = cli("patterns", "check", path)
    assert code == 1
    assert stderr.strip() == (f"{path}:4:1: error: YAML syntax: found character that cannot start any token (hint: a "
                              "tab character: YAML does not allow tabs in indentation; indent with spaces)")


@pytest.mark.parametrize(("flag", "suggestion"), [("--fast", ""), ("--atoll", " (did you mean --atol or --rtol?)"),
                                                  ("--no-mesure", " (did you mean --no-measure")])
def test_unknown_flags_suggest_only_close_options(cli, tmp_path, flag, suggestion):
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", flag)
    assert code == 2 and "Possible options" not in stderr
    assert stderr.startswith(f"onnxfuse optimize: error: No such option: {flag}{suggestion}")
    if not suggestion:
        assert stderr.strip() == f"onnxfuse optimize: error: No such option: {flag} (see 'onnxfuse optimize --help')"


COMMANDS = [["optimize"], ["explain"], ["inputs"], ["bench"], ["profile"], ["patterns", "list"],
            ["patterns", "show"], ["patterns", "check"], ["patterns", "test"], ["cache", "show"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_values_as_a_user_writes_them(cli, command):
    code, stdout, _ = cli(*command, "--help")
    assert code == 0
    assert not re.search(r"<[a-z|\[\]]+>|\{[a-z_]+\}", stdout), stdout  # no <list[str]>, <str>, {model}


def test_help_metavars(cli):
    stdout = cli("explain", "--help")[1]
    assert "Usage: onnxfuse explain [OPTIONS] MODEL" in stdout and "--rule RULE_ID" in stdout
    stdout = cli("optimize", "--help")[1]
    assert "Usage: onnxfuse optimize [OPTIONS] IN... OUT" in stdout
    assert "--only RULE_ID" in stdout and "--threads N|auto" in stdout and "--target cpu|cuda" in stdout
    code, _, stderr = cli("explain")
    assert code == 2 and "Missing argument 'MODEL'" in stderr


def test_counts_in_the_right_number(cli):
    assert (count(1, "rule"), count(2, "rule"), count(0, "rule")) == ("1 rule", "2 rules", "0 rules")
    assert count(1, "failed try", "failed tries") == "1 failed try"
    assert count(3, "failed try", "failed tries") == "3 failed tries"
    code, stdout, _ = cli("patterns", "test", "--rule", "erf-gelu")
    assert code == 0 and "1 rule: 1 ok" in stdout and "mutants did not fire" in stdout
    assert not re.search(r"\b1 mutants\b", stdout)


def test_one_failed_try_is_singular(cli, tmp_path):
    from conftest import save
    from test_inputs import _tiled_bias_model

    code, stdout, _ = cli("inputs", save(_tiled_bias_model(), tmp_path / "t.onnx"))
    assert code == 0 and "(after 1 failed try)" in stdout and "try(s)" not in stdout
