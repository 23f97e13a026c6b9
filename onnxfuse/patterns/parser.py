"""Pattern files (YAML) -> checked Rules, with `file:line:col: error: ...` diagnostics and hints.

The keys a pattern file may use are the tables FILE_KEYS, RULE_KEYS, CONSTRAINT_KEYS and TARGET_KEYS below:
each entry names its parse function, JSON-schema fragment, doc line and example. The parser dispatches through
them (an unknown key and its 'did you mean' come from the table), and `spec.json_schema()` and
docs/patterns.md are generated from them. Adding a key is one table entry plus its parse function."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import yaml

from ..errors import PatternError
from ..files import NotRegularFile, TooLarge, read_regular
from ..opschema import installed_versions
from .compute import CompiledExpr
from .parse_match import check_match_names, parse_match, parse_subpatterns, parse_where, value_names
from .parse_rewrite import (
    Require,
    check_names,
    parse_compute,
    parse_example,
    parse_opset,
    parse_require,
    parse_rewrite,
    parse_targets,
)
from .rules import TARGETS, Constraint, Diagnostic, RewriteNode, Rule, Span
from .syntax import Expr, iter_refs, layout_atoms
from .vocab import Key, Table
from .yaml_nodes import (
    CONDITIONS_SCHEMA,
    EXPECTS,
    EXPR_SCHEMA,
    ID_PATTERN,
    MEASURES,
    STAGES,
    Collector,
    mapping,
    plain,
    string_node,
)

# libyaml's loader when PyYAML was built with it: the same nodes and marks (file:line:col), 10x faster
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_hint(text: str, mark) -> str | None:
    """What a YAML syntax error usually means, where PyYAML's words do not say it: a tab where it stopped."""
    if mark is None:
        return None
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    if "\t" in line[max(0, mark.column - 1):mark.column + 1] or "\t" in line[:len(line) - len(line.lstrip())]:
        return "a tab character: YAML does not allow tabs in indentation; indent with spaces"
    return None


def parse_text(text: str, file: str, builtin: bool = False, order_base: int = 0) -> list[Rule]:
    c = Collector(file, builtin)
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        span = Span(file, mark.line + 1, mark.column + 1) if mark else Span(file, 1, 1)
        raise PatternError(str(Diagnostic(span, f"YAML syntax: {e.problem or e.context}", _yaml_hint(text, mark))),
                           ) from None
    except yaml.YAMLError as e:
        raise PatternError(f"{file}:1:1: error: YAML: {e}") from None
    if root is None:
        raise PatternError(f"{file}:1:1: error: empty pattern file", hint="expected 'rules:' with a list of rules")
    _check_tags(root, c)
    if c.diags:
        raise PatternError(str(c.diags[0]))
    f = _FileDraft(c, builtin, order_base)
    top = mapping(root, c, "a pattern file")
    if top is not None:
        given = {}
        for key, knode, vnode in top:
            if FILE_KEYS.get(key) is None:
                c.error(c.span(knode), *FILE_KEYS.unknown_error(key))
            else:
                given[key] = vnode
        for entry in FILE_KEYS.entries:  # in the table's order: the sub-patterns before the rules that call them
            if entry.name in given:
                entry.parse(given[entry.name], f)
        present = {k for k, _, _ in top}
        for key in FILE_KEYS.required():
            if key not in present:
                c.error(c.span(root), FILE_KEYS.missing_error(key))
    rules = f.rules
    ids: dict[str, Span] = {}
    for r in rules:
        if r.id in ids:
            c.error(r.span, f"duplicate rule id {r.id!r} (first at line {ids[r.id].line})")
        ids[r.id] = r.span
    if c.diags:
        err = PatternError(str(c.diags[0]))
        err.diagnostics = c.diags  # type: ignore[attr-defined]
        raise err
    return rules


_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}


def _check_tags(node: yaml.Node, c: Collector) -> None:
    """Only plain YAML data: explicit tags such as !!python/object are refused, never constructed."""
    if node.tag not in _PLAIN_TAGS:
        c.error(c.span(node), f"YAML tag {node.tag!r} is not allowed in pattern files")
        return
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _check_tags(k, c)
            _check_tags(v, c)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _check_tags(v, c)


MAX_PATTERN_BYTES = 16 << 20  # a pattern file holding more is refused (it is read only up to this bound)


def load_file(path: str, builtin: bool = False, order_base: int = 0) -> list[Rule]:
    """The rules of one pattern file: a regular file (a FIFO or a device is refused before it is read) of at
    most MAX_PATTERN_BYTES."""
    try:
        text = read_regular(path, MAX_PATTERN_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise PatternError(f"{path}: no such pattern file") from None
    except IsADirectoryError:
        raise PatternError(f"{path}: is a directory (use load_path for folders)") from None
    except NotRegularFile as e:
        if e.kind == "a directory":
            raise PatternError(f"{path}: is a directory (use load_path for folders)") from None
        raise PatternError(f"{path}: is {e.kind}, not a pattern file (a pattern file must be a regular file)") from None
    except TooLarge:
        raise PatternError(f"{path}: larger than {MAX_PATTERN_BYTES >> 20} MB, the most a pattern file may "
                           "hold (refused)") from None
    except PermissionError:
        raise PatternError(f"{path}: permission denied") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PatternError(f"{path}: cannot read ({e})") from None
    return parse_text(text, path, builtin, order_base)


def load_path(path: str, builtin: bool = False, order_base: int = 0) -> list[Rule]:
    """A pattern file, or every *.yaml / *.yml in a folder (sorted by name)."""
    if os.path.isdir(path):
        rules: list[Rule] = []
        for name in sorted(os.listdir(path)):
            if name.endswith((".yaml", ".yml")):
                rules.extend(load_file(os.path.join(path, name), builtin, order_base + len(rules)))
        return rules
    return load_file(path, builtin, order_base)


# ----- the file -----------------------------------------------------------------------------------------------
@dataclass
class _FileDraft:
    """A pattern file while its keys are parsed: each FILE_KEYS parse function adds to it."""

    c: Collector
    builtin: bool
    order_base: int
    rules: list[Rule] = field(default_factory=list)


def _parse_rules(node: yaml.Node, f: _FileDraft) -> None:
    if not isinstance(node, yaml.SequenceNode):
        f.c.error(f.c.span(node), "'rules' must be a list of rules")
        return
    for i, rnode in enumerate(node.value):
        rule = _parse_rule(rnode, f.c, f.builtin, f.order_base + len(f.rules) + i)
        if rule is not None:
            f.rules.append(rule)


# ----- one rule ----------------------------------------------------------------------------------------------


@dataclass
class _RuleDraft:
    """A rule while its keys are parsed in RULE_KEYS order: each key's parse function fills its fields and may
    read those of the keys before it (`where` reads the match lines, `example` the values)."""

    c: Collector
    id: str = "?"
    span: Span | None = None
    doc: str = ""
    lines: dict[str, Expr] = field(default_factory=dict)
    line_spans: dict[str, Span] = field(default_factory=dict)
    outputs_of: dict[str, tuple[str, int]] = field(default_factory=dict)
    values: set[str] = field(default_factory=set)  # names of the values entering the match
    where: dict[str, Constraint] = field(default_factory=dict)
    compute: dict[str, CompiledExpr] = field(default_factory=dict)
    compute_spans: dict[str, Span] = field(default_factory=dict)
    rewrite: list[RewriteNode] = field(default_factory=list)
    require: Require = field(default_factory=list)
    example: dict[str, list[list[int]]] = field(default_factory=dict)
    example_attrs: dict[tuple[str, str], object] = field(default_factory=dict)
    targets: tuple[str, ...] = TARGETS
    declared: bool = False
    conditions: dict[str, Require] = field(default_factory=dict)
    early: bool = False
    opset: tuple[int, int] = (1, 10_000)
    measure: str = "region"
    expect: str = "unknown"


def _parse_rule(node: yaml.Node, c: Collector, builtin: bool, order: int) -> Rule | None:
    items = mapping(node, c, "a rule")
    if items is None:
        return None
    fields = {k: vn for k, _, vn in items}
    for k, kn, _ in items:
        if k not in RULE_KEYS:
            c.error(c.span(kn), *RULE_KEYS.unknown_error(k))
    missing = [k for k in RULE_KEYS.required() if k not in fields]
    for k in missing:
        c.error(c.span(node), RULE_KEYS.missing_error(k))
    if missing:
        return None
    n_before, missing_before = len(c.diags), len(c.missing_ops)
    r = _RuleDraft(c)
    for key in RULE_KEYS.entries:
        if key.name in fields:
            key.parse(fields[key.name], r)
        if key.then is not None and not key.then(r):
            return None
    assert r.span is not None  # 'id' is required
    rule = Rule(
        id=r.id, doc=r.doc, file=c.file, span=r.span, lines=r.lines,
        line_spans=r.line_spans, where=r.where, compute=r.compute, rewrite=r.rewrite, targets=r.targets,
        declared=r.declared,
        conditions={t: [e for e, _ in conds] for t, conds in r.conditions.items()}, opset_min=r.opset[0],
        opset_max=r.opset[1], order=order, builtin=builtin, require=[e for e, _ in r.require],
        example=r.example, example_attrs=r.example_attrs, outputs_of=r.outputs_of, early=r.early,
        measure=r.measure, expect=r.expect, unavailable=_unavailable(c.missing_ops[missing_before:]),
    )
    rule_require_spans = [sp for _, sp in r.require]
    condition_spans = [(expr, sp, f"the {t} condition") for t, conds in r.conditions.items() for (expr, _), sp in conds]
    if len(c.diags) == n_before:
        check_names(rule, r.values, r.compute_spans, c, rule_require_spans, condition_spans)
    return rule if len(c.diags) == n_before else None


def _unavailable(missing: list[str]) -> str:
    """Why a built-in rule cannot be used with the installed onnx/onnxruntime ('' when it can)."""
    if not missing:
        return ""
    ops = ", ".join(dict.fromkeys(missing))
    return f"{ops} unknown to the installed {installed_versions()}: needs newer versions"


def _parse_id(node: yaml.Node, r: _RuleDraft) -> None:
    r.id = string_node(node, r.c, "'id'") or "?"
    r.span = r.c.span(node)
    if not re.match(ID_PATTERN, r.id):
        r.c.error(r.span, f"rule id {r.id!r} must be letters, digits, '-', '_' or '.'")


def _parse_doc(node: yaml.Node, r: _RuleDraft) -> None:
    r.doc = string_node(node, r.c, "'doc'") or ""


def _parse_match_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.lines, r.line_spans, r.outputs_of = parse_match(node, r.c)


def _parse_where_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.where = parse_where(node, r.c, r.lines)


def _check_match_and_where(r: _RuleDraft) -> bool:
    """Once `match` and `where` are read: the names of the match, and what shared lines read. False when the
    match has no lines (the rest of the rule cannot be checked)."""
    if not r.lines:
        return False
    r.values = value_names(r.lines)
    check_match_names(r.lines, r.line_spans, r.c, r.where)
    for name, con in r.where.items():
        if con.shared:
            for ref in iter_refs(r.lines[name]):
                if ref.name in r.lines and not (r.where.get(ref.name) and r.where[ref.name].shared):
                    r.c.error(r.line_spans[name].shifted(ref.off), f"shared line {name!r} reads line {ref.name!r}, "
                              "which is not shared", f"mark {ref.name!r} shared too: a kept node cannot read a removed one")
    return True


def _parse_compute_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.compute = parse_compute(node, r.c)
    r.compute_spans = {k: r.c.span(vn, content=True) for k, _, vn in mapping(node, r.c, "'compute'") or []}


def _parse_rewrite_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.rewrite = parse_rewrite(node, r.c)


def _parse_require_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.require = parse_require(node, r.c)


def _parse_example_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.example, r.example_attrs = parse_example(node, r.c, r.values, r.lines, layout_atoms(r.lines))


def _parse_targets_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.targets, r.conditions = parse_targets(node, r.c)
    r.declared = True


def _parse_stage(node: yaml.Node, r: _RuleDraft) -> None:
    stage = plain(node)
    if stage not in STAGES:
        r.c.error(r.c.span(node), f"unknown stage {stage!r}", f"stages are: {', '.join(STAGES)}")
    r.early = stage == "early"


def _parse_opset_key(node: yaml.Node, r: _RuleDraft) -> None:
    r.opset = parse_opset(node, r.c)


def _one_of(key: str, values: tuple[str, ...]):
    """The parse function of a rule key whose value is one word of `values`, stored in the draft's field `key`."""
    def parse(node: yaml.Node, r: _RuleDraft) -> None:
        word = plain(node)
        if word not in values:
            r.c.error(r.c.span(node), f"unknown {key} {word!r}", f"{key} is one of: {', '.join(values)}")
            return
        setattr(r, key, str(word))
    return parse


_parse_measure = _one_of("measure", MEASURES)
_parse_expect = _one_of("expect", EXPECTS)


FILE_KEYS: Table[Key] = Table(
    "File keys", "The top level of a pattern file.", [
        Key("patterns", lambda node, f: parse_subpatterns(node, f.c), {"type": "object", "additionalProperties": {"type": "string"}},
            "Named sub-patterns the file's match lines call by name: `name(param, ...)` maps to a match expression "
            "using its parameters (names in it that are not parameters are the calling rule's own). A call is the "
            "expression with the parameters replaced by its arguments; sub-patterns may call the ones before them.",
            "patterns:\n"
            "  weights(p): Where(IsNaN(p), ZERO, p) | p\n"
            "rules:\n"
            "- id: probs-times-values\n"
            "  doc: The attention weights times the values.\n"
            "  match:\n"
            "    p: Softmax(S, axis=-1)\n"
            "    Y: MatMul(weights(p), V)\n"
            "  where:\n"
            "    ZERO: {const: 0.0}\n"
            "  rewrite:\n"
            "    Y: MatMul(p, V)\n"),
        Key("rules", _parse_rules, {"type": "array", "items": {"$ref": "#/definitions/rule"}},
            "The rules of this file: a list of mappings with the rule keys.",
            "rules:\n- id: relu-relu\n  doc: Relu of a Relu is one Relu.\n"
            "  match:\n    r: Relu(X)\n    Y: Relu(r)\n  rewrite:\n    Y: Relu(X)\n", required=True),
    ], unknown="unknown key {key!r} at top level", missing="pattern file has no {key!r} list")


RULE_KEYS: Table[Key] = Table(
    "Rule keys", "One rule: an item of the `rules` list. Parsed in this order; `id`, `match` and `rewrite` are "
    "required.", [
        Key("id", _parse_id, {"type": "string", "pattern": ID_PATTERN},
            "Unique rule id: letters, digits, '-', '_' or '.' (reports, `--only`, `--skip` and `--rule` use it).",
            "id: conv-bn-fold", required=True),
        Key("doc", _parse_doc, {"type": "string"}, "What the rule fuses and why the rewrite is exact.",
            "doc: Inference BatchNormalization after Conv folds into the Conv's weights and bias."),
        Key("match", _parse_match_key, {"type": "object", "additionalProperties": EXPR_SCHEMA},
            "Lines 'name: expression', one node each; the last line is the root. UPPERCASE names that are not lines "
            "are values entering the match; lowercase lines are interior nodes.",
            "match:\n"
            "  c: Conv(X, W, B?)\n"
            "  Y: BatchNormalization(c, SCALE, BIAS, MEAN, VAR)\n", required=True),
        Key("where", _parse_where_key,
            {"type": "object", "additionalProperties": {"$ref": "#/definitions/constraint"}},
            "Constraints per value or line name (the constraint keys).",
            "where:\n"
            "  W: {constant: true}\n"
            "  B: {constant: true}\n"
            "  SCALE: {constant: true, rank: 1}\n"
            "  BIAS: {constant: true, rank: 1}\n"
            "  MEAN: {constant: true, rank: 1}\n"
            "  VAR: {constant: true, rank: 1}\n"
            "  Y: {attrs: {training_mode: 0}}\n", then=_check_match_and_where),
        Key("compute", _parse_compute_key,
            {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}]}},
            "New constant tensors, 'name: expression' in the compute language; each may read the ones before it.",
            "compute:\n"
            "  s: SCALE / sqrt(VAR + Y.epsilon)\n"
            "  W2: W * reshape(s, [-1] + [1] * (W.rank - 1))\n"
            "  B2: (default(B, 0) - MEAN) * s + BIAS\n"),
        Key("rewrite", _parse_rewrite_key, {"type": "object", "additionalProperties": EXPR_SCHEMA},
            "Lines 'OUT[, OUT2]: domain.Op(inputs..., attr=expr, copy_attrs=line)' that replace the match; "
            "'Y: X' makes readers of Y read X; '_' leaves an input absent or skips an output; an attribute whose "
            "expression gives None is left out (its schema default applies).",
            "rewrite:\n"
            "  Y: Conv(X, W2, B2, copy_attrs=c)\n", required=True),
        Key("require", _parse_require_key, CONDITIONS_SCHEMA,
            "Conditions (compute expressions) that must all be true for the rule to apply; a condition written "
            "`{check: EXPR, reason: TEXT}` is reported by its reason (the concept that failed) where it is false.",
            "require: ['W.rank == 4', 'X.dtype == W.dtype']"),
        Key("example", _parse_example_key,
            {"type": "object", "patternProperties": {"\\.": {}},  # line.attr: any attribute value
             "additionalProperties": {"oneOf": [
                 {"type": "array"}, {"type": "object", "properties": {"value": {}}, "required": ["value"]}]}},
            "Shapes (or a list of alternative shapes) of input values, constant input values ({value: ...}) and "
            "'line.attr' values for the models 'onnxfuse patterns test' builds.",
            "example: {X: [1, 4, 8, 8], W: [4, 4, 3, 3], B: [4], SCALE: [4], BIAS: [4], MEAN: [4], VAR: [4]}"),
        Key("targets", _parse_targets_key,
            {"oneOf": [{"type": "array", "items": {"enum": list(TARGETS)}},
                       {"type": "object", "additionalProperties": False, "minProperties": 1,
                        "properties": {t: {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/target"}]}
                                       for t in TARGETS}}]},
            "Execution providers the rewrite's output can run on (default: all); a mapping gives conditions per "
            "target (the target keys): {cpu: {}, cuda: {require: [...]}}.",
            "targets: [cpu, cuda]"),
        Key("stage", _parse_stage, {"enum": list(STAGES)},
            "early: a canonicalisation that runs to its fixed point before the fusion rules (so they see one "
            "form); default main.", "stage: main"),
        Key("opset", _parse_opset_key,
            {"type": "object", "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
             "additionalProperties": False},
            "Model opset range where the rule applies, both ends included.", "opset: {min: 9}"),
        Key("measure", _parse_measure, {"enum": list(MEASURES)},
            "How measured selection by region decides the rule's rewrites: region (default), each region timed "
            "alone; model, on the whole model, with them against without them, after the region decisions: for "
            "a rewrite whose benefit is non-local (it pays through its neighbours, e.g. keeping onnxruntime's "
            "NCHWc layout across a chain of convolutions, and costs alone).", "measure: model"),
        Key("expect", _parse_expect, {"enum": list(EXPECTS)},
            "What the rule's rewrites are expected to do to latency, the prior where measuring cannot decide (no "
            "change beyond the noise floor either way, the budget ended with the interval across the line, a "
            "region not reached or that cannot run alone) and no class of the same rewrite was measured faster or "
            "slower: faster keeps them, neutral leaves the original, unknown (default) leaves it to the op-cost "
            "prior (fewer kernel calls, no more bytes or FLOPs, into standard ops). One measured slower is dropped "
            "whatever the rule expects; the report says which decided.", "expect: faster"),
    ], unknown="unknown key {key!r} in rule", missing="rule is missing {key!r}")

