"""The YAML side of pattern files: positioned diagnostics (file:line:col), plain values of YAML nodes, the
names and numbers the pattern language accepts, and the JSON-schema fragments its key tables share."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .rules import Diagnostic, Span

IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# Operator domains a pattern line may name ('' is the ONNX domain): not the domains a model may use.
PATTERN_DOMAINS = ("", "com.microsoft")
STAGES = ("early", "main")
# How measured selection by region decides a rule's rewrites: each region timed alone, or on the whole model.
MEASURES = ("region", "model")
# What a rule expects its rewrites do to latency: the prior where measuring cannot decide.
EXPECTS = ("faster", "neutral", "unknown")



class Collector:
    def __init__(self, file: str, builtin: bool = False) -> None:
        self.file = file
        self.diags: list[Diagnostic] = []
        # built-in files only: operators the installed onnx or onnxruntime does not define are not errors but
        # make their rule unavailable (Rule.unavailable), so an older supported version still loads the rest
        self.builtin = builtin
        self.missing_ops: list[str] = []
        self.subpatterns: dict = {}  # the file's named sub-patterns (subpatterns.py), which its match lines call

    def span(self, node: yaml.Node, content: bool = False) -> Span:
        m = node.start_mark
        col = m.column + 1
        if content and isinstance(node, yaml.ScalarNode) and node.style in ('"', "'"):
            col += 1
        return Span(self.file, m.line + 1, col)

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(span, message, hint))


_constructor = yaml.constructor.SafeConstructor()


def plain(node: yaml.Node) -> object:
    return _constructor.construct_object(node, deep=True)


def mapping(node: yaml.Node, c: Collector, what: str) -> list[tuple[str, yaml.Node, yaml.Node]] | None:
    if not isinstance(node, yaml.MappingNode):
        c.error(c.span(node), f"{what} must be a mapping")
        return None
    seen: dict[str, Span] = {}
    out = []
    for k, v in node.value:
        key = str(plain(k)) if isinstance(k, yaml.ScalarNode) else None
        if key is None:
            c.error(c.span(k), f"keys of {what} must be plain names")
            continue
        if key in seen:
            c.error(c.span(k), f"duplicate key {key!r} in {what} (first at line {seen[key].line})")
            continue
        seen[key] = c.span(k)
        out.append((key, k, v))
    return out


def string_node(node: yaml.Node, c: Collector, what: str) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        c.error(c.span(node), f"{what} must be a string")
        return None
    return str(plain(node))


def is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def numbers(v: object) -> object:
    """YAML 1.1 reads `1e-3` as a string; take such strings as the numbers they spell."""
    if isinstance(v, str) and FLOAT_TEXT.match(v.strip()):
        return float(v)
    if isinstance(v, list):
        return [numbers(x) for x in v]
    return v


class Invalid(Exception):
    """A constraint value that does not fit its key."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


# Constraint parse functions: (the plain YAML value, whether it constrains a match line) -> the Constraint
# field of the same name, or Invalid.


# ----- the vocabulary: one entry per key ---------------------------------------------------------------------
# Each key: its parse function, JSON-schema fragment, doc line and a YAML example. The examples of rule,
# constraint and target keys are written for the worked example of docs/patterns.md (the built-in rule
# conv-bn-fold), and the tests check each one parses in its place there.
EXPR_SCHEMA = {"type": "string", "description": "An operator expression, e.g. Add(Erf(s), ONE) | Mul(X, Y)"}
# YAML 1.1 reads 1e-3 as a string; the parser takes such strings as numbers (numbers), and so does the schema.
NUMBER_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "number"}, {"type": "string", "pattern": FLOAT_TEXT.pattern}]}
NUMBERS_SCHEMA: dict[str, Any] = {"anyOf": [NUMBER_SCHEMA, {"type": "array", "items": NUMBER_SCHEMA}]}
TOLERANCE_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": FLOAT_TEXT.pattern}]}
DIM_SCHEMA = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
# A condition is an expression, or {check: expression, reason: why the rule does not apply when it is false}
# (the reason explain gives, in the rule's own words: "the mask is multiplicative", not the expression).
CONDITIONS_SCHEMA = {"type": "array", "items": {"oneOf": [
    {"type": "string"},
    {"type": "object", "properties": {"check": {"type": "string"}, "reason": {"type": "string"}},
     "required": ["check", "reason"], "additionalProperties": False}]}}
