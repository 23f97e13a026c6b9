"""The pattern vocabulary is one set of tables (spec.py): the parser dispatches through them, and schema.json
and docs/patterns.md are generated from them. Every entry has a doc line and an example that parses."""

import ast
import copy
import dataclasses
import json
import os

import numpy as np
import pytest
import yaml

from onnxfuse.errors import PatternError
from onnxfuse.patterns import docs, parse_match, parser, spec, yaml_nodes
from onnxfuse.patterns.compute import Env, compile_expr, evaluate
from onnxfuse.patterns.parser import load_path, parse_text
from onnxfuse.patterns.rules import Constraint
from onnxfuse.patterns.vocab import Key, Table

REGENERATE = "regenerate with: python -m onnxfuse.patterns.docs"
BASE = yaml.safe_load(docs.WORKED_EXAMPLE)


def _parse_rule(rule: dict):
    """Parse the worked example with `rule` as its one rule."""
    (parsed,) = parse_text(yaml.safe_dump({"rules": [rule]}, sort_keys=False), "example.yaml")
    return parsed


def _base_rule() -> dict:
    return copy.deepcopy(BASE["rules"][0])


def _entries():
    for table in [*spec.KEY_TABLES, *spec.FIELD_TABLES, spec.FUNCTIONS]:
        for entry in table.entries:
            yield pytest.param(entry, id=f"{table.title}:{entry.name}")


# ----- generated files -------------------------------------------------------------------------------------
def test_generated_files_are_current():
    assert docs.stale() == [], REGENERATE


def test_docs_list_every_word():
    text = docs.markdown()
    for table in [*spec.KEY_TABLES, *spec.FIELD_TABLES, spec.FUNCTIONS]:
        for entry in table.entries:
            assert f"`{getattr(entry, 'signature', entry.name)}`" in text, entry.name
            assert entry.doc.replace("|", "\\|") in text, entry.name


def test_schema_is_generated_from_the_tables():
    schema = json.loads(spec.json_schema_text())
    defs = schema["definitions"]
    assert list(schema["properties"]) == spec.FILE_KEYS.names() and schema["required"] == ["rules"]
    assert list(defs["rule"]["properties"]) == spec.RULE_KEYS.names()
    assert defs["rule"]["required"] == ["id", "match", "rewrite"]
    assert list(defs["constraint"]["properties"]) == spec.CONSTRAINT_KEYS.names()
    assert list(defs["target"]["properties"]) == spec.TARGET_KEYS.names()
    for props, table in [(defs["rule"]["properties"], spec.RULE_KEYS), (defs["constraint"]["properties"],
                                                                         spec.CONSTRAINT_KEYS)]:
        for name, prop in props.items():
            assert prop["description"] == table[name].doc and prop["examples"] == [table[name].example_value()]
    assert defs["constraint"]["properties"]["dtype"]["oneOf"][0]["enum"] == list(spec.DTYPES)
    assert defs["rule"]["properties"]["stage"]["enum"] == list(spec.STAGES)
    assert defs["rule"]["properties"]["measure"]["enum"] == list(spec.MEASURES) == ["region", "model"]


# ----- doc lines and examples ------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", list(_entries()))
def test_every_entry_has_a_doc_line_and_an_example(entry):
    assert entry.doc.strip() and "\n" not in entry.doc and entry.doc.endswith("."), entry.doc
    assert entry.example.strip()


@pytest.mark.parametrize("key", spec.FILE_KEYS.entries, ids=spec.FILE_KEYS.names())
def test_file_key_example_parses(key):
    assert key.name in yaml.safe_load(key.example)
    assert parse_text(key.example, "example.yaml")


@pytest.mark.parametrize("key", spec.RULE_KEYS.entries, ids=spec.RULE_KEYS.names())
def test_rule_key_example_parses_in_the_worked_example(key):
    example = yaml.safe_load(key.example)
    assert list(example) == [key.name]
    rule = _base_rule()
    rule.update(example)
    _parse_rule(rule)


@pytest.mark.parametrize("key", spec.CONSTRAINT_KEYS.entries, ids=spec.CONSTRAINT_KEYS.names())
def test_constraint_example_parses_in_the_worked_example(key):
    ((name, constraints),) = yaml.safe_load(key.example).items()
    assert key.name in constraints
    rule = _base_rule()
    rule["where"].setdefault(name, {}).update(constraints)
    got, default = getattr(_parse_rule(rule).where[name], key.name), getattr(Constraint(), key.name)
    assert got is not None if default is None else got != default  # the example sets the field


@pytest.mark.parametrize("key", spec.TARGET_KEYS.entries, ids=spec.TARGET_KEYS.names())
def test_target_key_example_parses_in_the_worked_example(key):
    ((target, conf),) = yaml.safe_load(key.example).items()
    assert key.name in conf
    rule = _base_rule()
    rule["targets"] = {"cpu": None, target: conf}
    parsed = _parse_rule(rule)
    assert parsed.targets == ("cpu", target) and parsed.conditions[target]


def test_worked_example_is_the_builtin_rule():
    (worked,) = parse_text(docs.WORKED_EXAMPLE, "example.yaml")
    (builtin,) = [r for r in load_path(os.path.join(docs.ROOT, "patterns", "conv.yaml")) if r.id == worked.id]
    assert worked.lines == builtin.lines
    assert [dataclasses.replace(c, span=None) for c in worked.where.values()] == \
           [dataclasses.replace(c, span=None) for c in builtin.where.values()]
    assert {k: e.text for k, e in worked.compute.items()} == {k: e.text for k, e in builtin.compute.items()}
    def rewrite(rule):
        return [(rn.outputs, rn.call.qualified, [a.name for a in rn.call.args], rn.copy_attrs) for rn in rule.rewrite]
    assert rewrite(worked) == rewrite(builtin)
    assert worked.example == builtin.example


# ----- functions and fields --------------------------------------------------------------------------------
def _no_names() -> Env:
    def fail(*args):
        raise AssertionError(f"a function example reads {args}")
    return Env(fail, fail)


@pytest.mark.parametrize("fn", spec.FUNCTIONS.entries, ids=spec.FUNCTIONS.names())
def test_function_example_parses_and_gives_its_result(fn):
    expr = compile_expr(fn.example)
    calls = [n for n in ast.walk(expr.node) if isinstance(n, ast.Call) and n.func.id == fn.name]
    assert calls, f"the example of {fn.name} does not call it"
    lo, hi = fn.arity
    assert lo <= len(calls[0].args) + len(calls[0].keywords) and (hi is None or len(calls[0].args) <= hi)
    if fn.impl_arity() is not None:
        assert fn.arity == fn.impl_arity(), f"{fn.signature} does not match its implementation"
    if fn.result is None:  # reads names of a rule: it must parse as a condition of the worked example
        rule = _base_rule()
        rule["require"] = [fn.example]
        _parse_rule(rule)
    else:
        got = evaluate(expr, _no_names())
        np.testing.assert_equal(np.asarray(got), np.asarray(fn.result))


@pytest.mark.parametrize("fld", [*spec.VALUE_FIELDS.entries, *spec.NODE_FIELDS.entries],
                         ids=[*spec.VALUE_FIELDS.names(), *spec.NODE_FIELDS.names()])
def test_field_example_parses_in_the_worked_example(fld):
    names = compile_expr(fld.example).names
    assert any(f == fld.name or fld.name == "<attribute>" and f for _, f, _ in names), names
    rule = _base_rule()
    rule["require"] = [fld.example]
    _parse_rule(rule)


# ----- the parser dispatches through the tables ------------------------------------------------------------
def _misspelt(name: str) -> str:
    return name + name[-1]


@pytest.mark.parametrize("table,place", [(spec.RULE_KEYS, "rule"), (spec.CONSTRAINT_KEYS, "where"),
                                         (spec.TARGET_KEYS, "target"), (spec.FILE_KEYS, "file")],
                         ids=["rule", "constraint", "target", "file"])
def test_unknown_key_hint_comes_from_the_table(table, place):
    for name in table:
        rule = _base_rule()
        if place == "rule":
            rule[_misspelt(name)] = 1
        elif place == "where":
            rule["where"]["W"][_misspelt(name)] = 1
        elif place == "target":
            rule["targets"] = {"cuda": {_misspelt(name): 1}}
        doc = {"rules": [rule]} if place != "file" else {_misspelt(name): [], "rules": [rule]}
        with pytest.raises(PatternError) as info:
            parse_text(yaml.safe_dump(doc, sort_keys=False), "p.yaml")
        message, hint = table.unknown_error(_misspelt(name), target="cuda")
        assert hint == f"did you mean {name!r}?"
        assert f"error: {message} (hint: {hint})" in str(info.value)


def test_a_new_rule_key_is_one_table_entry(monkeypatch):
    seen = []

    def parse_notes(node, r):
        seen.append((yaml_nodes.plain(node), r.id))

    notes = Key("notes", parse_notes, {"type": "string"}, "Free text.", "notes: kept for the record")
    table = Table(spec.RULE_KEYS.title, spec.RULE_KEYS.doc, [*spec.RULE_KEYS.entries, notes],
                  unknown=spec.RULE_KEYS.unknown, missing=spec.RULE_KEYS.missing)
    monkeypatch.setattr(parser, "RULE_KEYS", table)
    rule = _base_rule()
    rule["notes"] = "kept for the record"
    _parse_rule(rule)
    assert seen == [("kept for the record", "conv-bn-fold")]
    rule["note"] = rule.pop("notes")
    with pytest.raises(PatternError, match=r"unknown key 'note' in rule \(hint: did you mean 'notes'\?\)"):
        _parse_rule(rule)
    assert "notes" in table.json_schema()["properties"]


def test_pattern_domains_and_dtypes_are_one_list():
    assert yaml_nodes.PATTERN_DOMAINS == ("", "com.microsoft")
    assert not hasattr(parser, "KNOWN_DOMAINS") and not hasattr(spec, "_DTYPES")
    assert parse_match.DTYPES is spec.DTYPES


def test_measure_says_how_measured_selection_decides_a_rule():
    """`measure: model` (a rewrite whose benefit is non-local) parses onto the rule; the default is region."""
    text = ("rules:\n- id: r\n  match:\n    r: Relu(X)\n    Y: Relu(r)\n  rewrite:\n    Y: Relu(X)\n")
    assert parse_text(text, "p.yaml")[0].measure == "region"
    assert parse_text(text + "  measure: model\n", "p.yaml")[0].measure == "model"
    assert parse_text(text + "  measure: region\n", "p.yaml")[0].measure == "region"
