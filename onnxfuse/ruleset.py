"""The rules a run uses: the built-in pattern files, then the user's, filtered by --only/--skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from .errors import OnnxfuseError
from .patterns.parser import load_path
from .patterns.rules import Rule
from .patterns.spec import json_schema_text
from .rewrite.engine import order_rules
from .selftest import RuleReport, check_rules

__all__ = ["builtin_patterns_dir", "load_rules", "pattern_schema", "rules_in_order", "self_test"]


def builtin_patterns_dir() -> str:
    """The repo's patterns/ in a source checkout; the wheel's onnxfuse.builtin_patterns when installed."""
    here = Path(__file__).resolve().parent
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "patterns").is_dir():
        return str(here.parent / "patterns")
    return str(resources.files("onnxfuse.builtin_patterns"))


def load_rules(patterns: list[str] | None = None, builtin: bool = True, only: list[str] | None = None,
               skip: list[str] | None = None) -> list[Rule]:
    """Built-in rules (unless builtin=False), then the pattern files or folders given, in order; `only` and
    `skip` filter by rule id. Bad files raise PatternError (file:line:col)."""
    rules: list[Rule] = []
    if builtin:
        rules.extend(load_path(builtin_patterns_dir(), builtin=True))
    for p in patterns or []:
        if not os.path.exists(p):
            raise OnnxfuseError(f"{p}: no such pattern file or folder")
        rules.extend(load_path(p, order_base=len(rules)))
    ids = {r.id for r in rules}
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise OnnxfuseError(f"{r.span}: error: rule id {r.id!r} is already defined at {seen[r.id].span}")
        seen[r.id] = r
    for flag, names in (("--only", only), ("--skip", skip)):
        for n in names or []:
            if n not in ids:
                raise OnnxfuseError(f"{flag} {n}: no rule with that id", hint="see `onnxfuse patterns list`")
    if only:
        rules = [r for r in rules if r.id in only]
    if skip:
        rules = [r for r in rules if r.id not in skip]
    return rules


def rules_in_order(rules: list[Rule]) -> list[Rule]:
    """The order the engine tries rules in: early canonicalisations first, then bigger matches, then file order."""
    return order_rules(rules)


def self_test(rules: list[Rule]) -> Iterator[RuleReport]:
    """Each rule's generated self-test (`onnxfuse patterns test`): models built from the rule fire it once with
    equal onnxruntime outputs in every dtype it claims, and its mutants do not fire."""
    return check_rules(rules)


def pattern_schema() -> str:
    """The JSON Schema of pattern files (for editor completion), as text."""
    return json_schema_text()
