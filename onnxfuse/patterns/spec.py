"""The keys of a pattern file, described once: the parser checks against them and the JSON Schema
(for editor completion) is generated from them (`onnxfuse patterns schema`)."""

from __future__ import annotations

import json
from typing import Any

from .rules import TARGETS

_EXPR = {"type": "string", "description": "An operator expression, e.g. Add(Erf(s), ONE) | Mul(X, Y)"}
_NUM_OR_LIST: dict[str, Any] = {"oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}]}
_DIM = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
_DTYPES = ["float32", "float", "float16", "bfloat16", "float64", "double", "int8", "uint8", "int16", "int32",
           "int64", "bool"]

FILE_KEYS: dict[str, dict[str, Any]] = {
    "rules": {"type": "array", "items": {"$ref": "#/definitions/rule"}, "description": "The rules of this file."},
}

CONSTRAINT_KEYS: dict[str, dict[str, Any]] = {
    "const": {**_NUM_OR_LIST, "description": "Must be a constant equal to this (scalar: every element)."},
    "rtol": {"type": "number", "minimum": 0, "description": "Relative tolerance for 'const' (default 1e-5)."},
    "atol": {"type": "number", "minimum": 0, "description": "Absolute tolerance for 'const' (default 1e-6)."},
    "constant": {"type": "boolean", "description": "Must be an initializer or a Constant node's output."},
    "shared": {"type": "boolean", "description": "Match line only: the node is checked but kept (it may have "
               "readers outside the match, e.g. rotary cos/sin computed once for all layers)."},
    "dtype": {"oneOf": [{"enum": _DTYPES}, {"type": "array", "items": {"enum": _DTYPES}}],
              "description": "Allowed element types."},
    "rank": {"oneOf": [{"type": "integer", "minimum": 0},
                       {"type": "array", "items": {"type": "integer", "minimum": 0}}],
             "description": "Allowed ranks."},
    "shape": {"type": "array",
              "description": "Dims: integers, names (unify across values) or '_'; or a list of alternative shapes.",
              "items": {"oneOf": [_DIM, {"type": "array", "items": _DIM}]}},
    "attrs": {"type": "object", "description": "Attribute values a match line's node must have."},
}

_REQUIRE = {"type": "array", "items": {"type": "string"},
            "description": "Conditions (compute expressions) that must all be true for the rule to apply."}

# `targets: {cuda: {...}}`: what a rule needs on one target beyond its own match, where and require.
TARGET_KEYS: dict[str, dict[str, Any]] = {
    "require": {**_REQUIRE, "description": "Conditions (compute expressions) that must also be true on this "
                "target, e.g. ['Y.op_type == \"Relu\"'] where its kernel takes fewer attribute values."},
}
_TARGET = {"oneOf": [{"type": "null"}, {"type": "object", "additionalProperties": False, "properties": TARGET_KEYS}]}

RULE_KEYS: dict[str, dict[str, Any]] = {
    "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.\\-]*$", "description": "Unique rule id."},
    "doc": {"type": "string", "description": "What the rule fuses and why it is exact."},
    "match": {"type": "object", "additionalProperties": _EXPR,
              "description": "SSA lines name: expression; the last line is the root. UPPERCASE values enter the "
                             "match; lowercase lines are interior nodes."},
    "where": {"type": "object",
              "additionalProperties": {"type": "object", "additionalProperties": False,
                                       "properties": CONSTRAINT_KEYS},
              "description": "Constraints per value or line name."},
    "compute": {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}]},
                "description": "New constant tensors from a safe expression language (sqrt, reshape, ...)."},
    "require": _REQUIRE,
    "rewrite": {"type": "object", "additionalProperties": _EXPR,
                "description": "Lines 'OUT[, OUT2]: domain.Op(inputs..., attr=expr, copy_attrs=line)'."},
    "example": {"type": "object", "additionalProperties": {"oneOf": [
                    {"type": "array"}, {"type": "object", "properties": {"value": {}}, "required": ["value"]}]},
                "description": "Shapes (or {value: ...} constants) of input values, and line.attr values, for the "
                               "generated self-test models (patterns test)."},
    "stage": {"enum": ["early", "main"], "description": "early: a canonicalisation that runs to its fixed point "
              "before the fusion rules (so they see one form); default main."},
    "targets": {"oneOf": [
                    {"type": "array", "items": {"enum": list(TARGETS)}},
                    {"type": "object", "additionalProperties": False, "minProperties": 1,
                     "properties": {t: _TARGET for t in TARGETS}}],
                "description": "Execution providers the rewrite's output can run on (default: all). A mapping "
                               "gives conditions per target: {cpu: {}, cuda: {require: [...]}}."},
    "opset": {"type": "object", "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
              "additionalProperties": False, "description": "Model opset range where the rule applies."},
}


def json_schema() -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "onnxfuse pattern file",
        "type": "object",
        "properties": FILE_KEYS,
        "required": ["rules"],
        "additionalProperties": False,
        "definitions": {
            "rule": {"type": "object", "properties": RULE_KEYS, "required": ["id", "match", "rewrite"],
                     "additionalProperties": False},
        },
    }


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"
