"""Pattern files: `compute`, `rewrite`, `require`, `example`, `targets` (the TARGET_KEYS table) and `opset`, and the
checks that every name a rule uses is defined."""

from __future__ import annotations

import ast
from typing import Any

import yaml

from ..opschema import op_spec
from .compute import VALUE_FIELDS, CompiledExpr, compile_ast, compile_expr
from .parse_match import check_op
from .rules import TARGETS, RewriteNode, Rule, Span
from .syntax import Call, Expr, Ref, SyntaxProblem, parse_expr
from .vocab import Key, Table, closest
from .yaml_nodes import CONDITIONS_SCHEMA, IDENT, Collector, mapping, plain, string_node

Require = list[tuple[tuple[CompiledExpr, str], Span]]  # (compiled condition, its text), where it is written


def parse_compute(node: yaml.Node, c: Collector) -> dict[str, CompiledExpr]:
    out: dict[str, CompiledExpr] = {}
    for name, kn, vn in mapping(node, c, "'compute'") or []:
        if not IDENT.match(name):
            c.error(c.span(kn), f"compute name {name!r} must be an identifier")
            continue
        raw = plain(vn)
        span = c.span(vn, content=True)
        if not isinstance(raw, str | int | float | list):
            c.error(span, f"compute {name!r} must be an expression")
            continue
        try:
            out[name] = compile_expr(raw)
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
    return out


def parse_rewrite(node: yaml.Node, c: Collector) -> list[RewriteNode]:
    out: list[RewriteNode] = []
    for key, kn, vn in mapping(node, c, "'rewrite'") or []:
        outs = [o.strip() for o in key.split(",")]
        if not all(o == "_" or IDENT.match(o) for o in outs) or all(o == "_" for o in outs):
            c.error(c.span(kn), f"rewrite outputs {key!r} must be names separated by commas ('_' skips one)")
            continue
        text = string_node(vn, c, f"rewrite of {key!r}")
        if text is None:
            continue
        span = c.span(vn, content=True)
        try:
            expr = parse_expr(text)
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
            continue
        if isinstance(expr, Ref) and len(outs) == 1 and not expr.optional:
            out.append(RewriteNode(outs, None, {}, None, span, alias=expr.name))
            continue
        if not isinstance(expr, Call):
            c.error(span, "a rewrite line must be one operator call or a single name (alias)",
                    "alternatives ('|') only exist in 'match'")
            continue
        bad_arg = next((a for a in expr.args if not isinstance(a, Ref)), None)
        if bad_arg is not None:
            c.error(span.shifted(bad_arg.off), "rewrite inputs must be names",
                    "build nested nodes as separate rewrite lines; constants go in 'compute'")
            continue
        check_op(expr, c, span, match_side=False)
        s = op_spec(expr.domain, expr.op)
        if s is not None and len(outs) > s.max_outputs:
            c.error(c.span(kn), f"{expr.qualified} has at most {s.max_outputs} outputs, got {len(outs)}")
        attrs: dict[str, CompiledExpr] = {}
        copy_attrs = None
        for k, v in expr.kwargs.items():
            if k == "copy_attrs":
                if not isinstance(v, ast.Name):
                    c.error(span.shifted(expr.kw_offs[k]), "copy_attrs takes the name of a match line")
                else:
                    copy_attrs = v.id
                continue
            try:
                attrs[k] = compile_ast(v, text.replace("?", "ʔ"))
            except SyntaxProblem as e:
                c.error(span.shifted(e.offset), e.message, e.hint)
        out.append(RewriteNode(outs, expr, attrs, copy_attrs, span))
    if not out and not c.diags:
        c.error(c.span(node), "'rewrite' has no lines")
    return out


def parse_require(node: yaml.Node, c: Collector) -> Require:
    if not isinstance(node, yaml.SequenceNode):
        c.error(c.span(node), "'require' must be a list of conditions")
        return []
    out = []
    for item in node.value:
        reason = None
        if isinstance(item, yaml.MappingNode):  # {check: expression, reason: text}
            keys = {k: v for k, _, v in mapping(item, c, "a 'require' condition") or []}
            for k in keys.keys() - {"check", "reason"}:
                c.error(c.span(item), f"unknown key {k!r} in a 'require' condition", "it takes: check, reason")
            if "check" not in keys or "reason" not in keys:
                c.error(c.span(item), "a 'require' condition as a mapping needs 'check' and 'reason'")
                continue
            reason = string_node(keys["reason"], c, "a condition's reason")
            item = keys["check"]
        text = string_node(item, c, "a 'require' condition")
        if text is None:
            continue
        span = c.span(item, content=True)
        try:
            out.append(((compile_expr(text), f"{reason} ({text})" if reason else text), span))
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
    return out


def parse_example(node: yaml.Node, c: Collector, values: set[str], lines: dict[str, Expr],
                  atoms: frozenset[str] = frozenset()
                  ) -> tuple[dict[str, list[list[int]]], dict[tuple[str, str], object]]:
    """Shapes of input values (a shape, or a list of alternative shapes), constant values of input values
    (`{value: [...]}`, e.g. a Reshape's target shape), sizes of layout axes (`n: 4`) and `line.attr` attribute
    values for the models `patterns test` builds. Constant values are returned under the key ('', name) of
    the attribute map, axis sizes under ('axis', name)."""
    shapes: dict[str, list[list[int]]] = {}
    attrs: dict[tuple[str, str], object] = {}

    def dims_ok(v: object) -> bool:
        return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)

    for name, kn, vn in mapping(node, c, "'example'") or []:
        v = plain(vn)
        line, dot, attr = name.partition(".")
        if dot:
            if line not in lines:
                c.error(c.span(kn), f"'example' sets an attribute of {line!r}, which is not a match line")
            else:
                attrs[(line, attr)] = v
        elif name in atoms and name not in lines:
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                c.error(c.span(vn), f"example of layout axis {name!r} must be a positive integer (its size)")
            else:
                attrs[("axis", name)] = v
        elif name not in values:
            c.error(c.span(kn), f"'example' names {name!r}, which is not an input value of the match",
                    closest(name, values))
        elif isinstance(v, dict) and set(v) == {"value"} and isinstance(v["value"], int | float | list):
            attrs[("", name)] = v["value"]
        elif dims_ok(v):
            shapes[name] = [v]
        elif isinstance(v, list) and v and all(dims_ok(x) for x in v):
            shapes[name] = v
        else:
            c.error(c.span(vn), f"example of {name!r} must be a shape (list of positive integers), a list of "
                    "shapes, or {value: <number or list>}")
    return shapes, attrs


def parse_targets(node: yaml.Node, c: Collector) -> tuple[tuple[str, ...], dict[str, Require]]:
    """`targets: [cpu, cuda]`, or a mapping with conditions per target: `{cpu: {}, cuda: {require: [...]}}`
    (the keys are the targets; an empty value means no condition beyond the rule's own)."""
    conditions: dict[str, Require] = {}
    if isinstance(node, yaml.MappingNode):
        targets: list[str] = []
        for name, kn, vn in mapping(node, c, "'targets'") or []:
            if name not in TARGETS:
                c.error(c.span(kn), f"unknown target {name!r}", f"targets are: {', '.join(TARGETS)}")
                continue
            targets.append(name)
            if isinstance(vn, yaml.ScalarNode) and plain(vn) is None:
                continue
            conf: dict[str, Any] = {}
            for key, ckn, cvn in mapping(vn, c, f"conditions for {name!r}") or []:
                entry = TARGET_KEYS.get(key)
                if entry is None:
                    c.error(c.span(ckn), *TARGET_KEYS.unknown_error(key, target=name))
                    continue
                conf[key] = entry.parse(cvn, c)
            if "require" in conf:
                conditions[name] = conf["require"]
        if not targets and not c.diags:
            c.error(c.span(node), "'targets' names no target", f"targets are: {', '.join(TARGETS)}")
        return tuple(targets) or TARGETS, conditions
    v = plain(node)
    vals = v if isinstance(v, list) else [v]
    bad = [t for t in vals if t not in TARGETS]
    if bad or not vals:
        c.error(c.span(node), f"unknown target {bad[0] if bad else v!r}", f"targets are: {', '.join(TARGETS)}")
        return TARGETS, conditions
    return tuple(vals), conditions


def parse_opset(node: yaml.Node, c: Collector) -> tuple[int, int]:
    v = plain(node)
    if isinstance(v, dict) and set(v) <= {"min", "max"} and all(isinstance(x, int) for x in v.values()):
        return int(v.get("min", 1)), int(v.get("max", 10_000))
    c.error(c.span(node), "'opset' must be a mapping like {min: 13, max: 17}")
    return 1, 10_000


def check_names(rule: Rule, values: set[str], compute_spans: dict[str, Span], c: Collector,
                 require_spans: list[Span], conditions: list[tuple[CompiledExpr, Span, str]] | None = None) -> None:
    """Every name a rule's compute, require, conditions and rewrite use is defined and used as what it is;
    every output of the match is re-created, and nothing computed or created goes unused."""
    chk = _Names(rule, values, c)
    known: set[str] = set()
    for name, expr in rule.compute.items():
        if name in chk.defined:
            c.error(compute_spans.get(name, rule.span), f"compute name {name!r} is already used in the match")
        chk.expr(expr, compute_spans.get(name, rule.span), known, f"compute {name!r}")
        known.add(name)
    for (expr, _), span in zip(rule.require, require_spans, strict=True):
        chk.expr(expr, span, known, "require")
    for expr, span, what in conditions or []:
        chk.expr(expr, span, known, what)
    produced, temps = chk.rewrites(known)
    for o in rule.lines:
        if (o[0].isupper() or o == rule.root) and o not in produced:
            c.error(rule.line_spans[o], f"rewrite does not produce {o!r}, an output of the match",
                    f"add a rewrite line for {o!r}" if o == rule.root else
                    "UPPERCASE match lines are outputs: the rewrite must re-create them (or rename to lowercase)")
    for name, span in temps.items():
        if name not in {o for rn in rule.rewrite for o in rn.outputs if o in rule.lines}:
            c.error(span, f"rewrite value {name!r} is never used")
    for name in rule.compute:
        if name not in chk.used_compute:
            c.error(compute_spans.get(name, rule.span), f"compute value {name!r} is never used")


class _Names:
    """The names one rule defines, and the checks of each place that reads them."""

    def __init__(self, rule: Rule, values: set[str], c: Collector) -> None:
        self.rule, self.values, self.c = rule, values, c
        self.lines = rule.lines
        self.constant_ok = {n for n, con in rule.where.items() if con.needs_constant}
        self.defined = set(values) | set(rule.lines) | rule.facts | rule.atoms
        self.used_compute: set[str] = set()

    def expr(self, expr: CompiledExpr, span: Span, known_compute: set[str], what: str) -> None:
        c = self.c
        # an expression that asks `X.constant` reads X's value only where it is one (`not B.constant or
        # any(B.value != 0)`); a read it did not guard fails the match at run time, never the output
        asked = {name for name, fld, _ in expr.names if fld == "constant"}
        for name, fld, off in expr.names:
            if name in known_compute:
                self.used_compute.add(name)
                if fld is not None:
                    c.error(span.shifted(off), f"{name!r} is a computed value; it has no field {fld!r}")
            elif name in self.rule.facts or (name in self.rule.atoms and name not in self.lines):
                if fld is not None:
                    c.error(span.shifted(off), f"{name!r} is a number a concept of the match binds; it has no "
                                               f"field {fld!r}")
            elif name in self.lines:
                if fld is None:
                    c.error(span.shifted(off), f"{name!r} is a node; read an attribute like {name}.<attr>")
            elif name in self.values:
                if fld is not None and fld not in VALUE_FIELDS:
                    c.error(span.shifted(off), f"values have no field {fld!r}", f"fields: {', '.join(VALUE_FIELDS)}")
                elif fld in (None, "value") and name not in self.constant_ok and name not in asked:
                    c.error(span.shifted(off), f"{what} reads the value of {name!r}, which may not be constant",
                            f"add '{name}: {{constant: true}}' under 'where'")
            else:
                c.error(span.shifted(off), f"undefined name {name!r} in {what}", closest(name, self.defined))

    def rewrites(self, known: set[str]) -> tuple[set[str], dict[str, Span]]:
        """Check the rewrite lines; returns the names they produce and the temporaries not yet read."""
        temps: dict[str, Span] = {}
        produced: set[str] = set()
        for rn in self.rule.rewrite:
            self._inputs(rn, known, temps, produced)
            for k, expr in rn.attrs.items():
                assert rn.call is not None
                self.expr(expr, rn.span.shifted(rn.call.kw_offs.get(k, 0)), known, f"attribute {k!r}")
            if rn.copy_attrs is not None and rn.copy_attrs not in self.lines and rn.call is not None:
                self.c.error(rn.span.shifted(rn.call.kw_offs["copy_attrs"]),
                             f"copy_attrs names {rn.copy_attrs!r}, which is not a match line")
            for k, o in enumerate(rn.outputs):
                if o == "_":
                    continue
                if o in produced:
                    self.c.error(rn.span, f"rewrite defines {o!r} twice")
                produced.add(o)
                if o not in self.lines:
                    if o in self.values or o in known:
                        self.c.error(rn.span, f"rewrite output {o!r} is an input value of the match, not a node")
                    elif k == 0:
                        temps[o] = rn.span  # a later output may be named only because the op needs it present
        return produced, temps

    def _inputs(self, rn: RewriteNode, known: set[str], temps: dict[str, Span], produced: set[str]) -> None:
        args = rn.call.args if rn.call is not None else [Ref(rn.alias or "", False, 0)]
        for a in args:
            assert isinstance(a, Ref)
            if a.name == "_":
                if rn.call is None:
                    self.c.error(rn.span.shifted(a.off), "'_' cannot be aliased", "name the value the output becomes")
            elif a.name in known:
                self.used_compute.add(a.name)
            elif a.name in temps:
                temps.pop(a.name)
            elif a.name not in self.defined and a.name not in produced:
                self.c.error(rn.span.shifted(a.off), f"undefined name {a.name!r} in rewrite",
                             closest(a.name, self.defined | known | produced))


TARGET_KEYS: Table[Key] = Table(
    "Target keys", "Under `targets:` in its mapping form, per target: `cuda: {key: value}`.", [
        Key("require", parse_require, CONDITIONS_SCHEMA,
            "Conditions (compute expressions) that must also be true on this target, e.g. where its kernel takes "
            "less than the rule matches.", "cuda: {require: ['X.dtype == \"float\"']}"),
    ], unknown="unknown key {key!r} for target {target!r}", fallback_hint="a target takes: {names}")
