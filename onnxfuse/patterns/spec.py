"""The pattern vocabulary in one place: the tables of keys (parser.py, each key with its parse function) and of
compute functions and fields (compute.py, with their implementations). The JSON Schema (for editor completion:
`onnxfuse patterns schema`, onnxfuse/patterns/schema.json) and docs/patterns.md (docs.py) are generated from
these tables; regenerate both with `python -m onnxfuse.patterns.docs`."""

from __future__ import annotations

import json
from typing import Any

from .compute import FUNCTIONS, NODE_FIELDS, VALUE_FIELDS
from .parse_match import CONSTRAINT_KEYS
from .parse_rewrite import TARGET_KEYS
from .parser import FILE_KEYS, RULE_KEYS
from .rules import TARGETS
from .vocab import DTYPES, Field, Function, Key, Table
from .yaml_nodes import EXPECTS, MEASURES, PATTERN_DOMAINS, STAGES

__all__ = ["CONSTRAINT_KEYS", "DTYPES", "EXPECTS", "FILE_KEYS", "FUNCTIONS", "MEASURES", "NODE_FIELDS", "PATTERN_DOMAINS",
           "RULE_KEYS", "STAGES", "TARGETS", "TARGET_KEYS", "VALUE_FIELDS", "KEY_TABLES", "FIELD_TABLES", "Field", "Function",
           "Key", "Table", "json_schema", "json_schema_text"]

# In the order the reference lists them.
KEY_TABLES: list[Table[Key]] = [FILE_KEYS, RULE_KEYS, CONSTRAINT_KEYS, TARGET_KEYS]
FIELD_TABLES: list[Table[Field]] = [VALUE_FIELDS, NODE_FIELDS]


def json_schema() -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "onnxfuse pattern file",
        **FILE_KEYS.json_schema(),
        "definitions": {
            "rule": RULE_KEYS.json_schema(),
            "constraint": CONSTRAINT_KEYS.json_schema(),
            "target": TARGET_KEYS.json_schema(),
        },
    }


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"
