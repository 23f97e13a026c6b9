"""Pattern files (YAML) -> checked Rules, with `file:line:col: error: ...` diagnostics and hints."""

from __future__ import annotations

import ast
import difflib
import os
import re
from collections.abc import Iterable

import numpy as np
import onnx
import yaml

from ..errors import PatternError
from ..opschema import all_attr_names, known_ops, op_spec
from . import spec
from .compute import CompiledExpr, compile_ast, compile_expr
from .rules import TARGETS, Constraint, Diagnostic, RewriteNode, Rule, Span
from .syntax import Alt, Call, Expr, Ref, SyntaxProblem, iter_calls, iter_refs, literal, parse_expr

IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
KNOWN_DOMAINS = ("", "com.microsoft")
DTYPES: dict[str, int] = {
    "float32": onnx.TensorProto.FLOAT, "float": onnx.TensorProto.FLOAT,
    "float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16,
    "float64": onnx.TensorProto.DOUBLE, "double": onnx.TensorProto.DOUBLE,
    "int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8, "int16": onnx.TensorProto.INT16,
    "int32": onnx.TensorProto.INT32, "int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL,
}


class _Collector:
    def __init__(self, file: str) -> None:
        self.file = file
        self.diags: list[Diagnostic] = []

    def span(self, node: yaml.Node, content: bool = False) -> Span:
        m = node.start_mark
        col = m.column + 1
        if content and isinstance(node, yaml.ScalarNode) and node.style in ('"', "'"):
            col += 1
        return Span(self.file, m.line + 1, col)

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(span, message, hint))


def _closest(word: str, options: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean {found[0]!r}?" if found else None


_constructor = yaml.constructor.SafeConstructor()


def _plain(node: yaml.Node) -> object:
    return _constructor.construct_object(node, deep=True)


def _mapping(node: yaml.Node, c: _Collector, what: str) -> list[tuple[str, yaml.Node, yaml.Node]] | None:
    if not isinstance(node, yaml.MappingNode):
        c.error(c.span(node), f"{what} must be a mapping")
        return None
    seen: dict[str, Span] = {}
    out = []
    for k, v in node.value:
        key = str(_plain(k)) if isinstance(k, yaml.ScalarNode) else None
        if key is None:
            c.error(c.span(k), f"keys of {what} must be plain names")
            continue
        if key in seen:
            c.error(c.span(k), f"duplicate key {key!r} in {what} (first at line {seen[key].line})")
            continue
        seen[key] = c.span(k)
        out.append((key, k, v))
    return out


def _string(node: yaml.Node, c: _Collector, what: str) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        c.error(c.span(node), f"{what} must be a string")
        return None
    return str(_plain(node))


def parse_text(text: str, file: str, builtin: bool = False, order_base: int = 0) -> list[Rule]:
    c = _Collector(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        span = Span(file, mark.line + 1, mark.column + 1) if mark else Span(file, 1, 1)
        raise PatternError(str(Diagnostic(span, f"YAML syntax: {e.problem or e.context}")),
                           ) from None
    except yaml.YAMLError as e:
        raise PatternError(f"{file}:1:1: error: YAML: {e}") from None
    if root is None:
        raise PatternError(f"{file}:1:1: error: empty pattern file", hint="expected 'rules:' with a list of rules")
    _check_tags(root, c)
    if c.diags:
        raise PatternError(str(c.diags[0]))
    rules: list[Rule] = []
    top = _mapping(root, c, "a pattern file")
    if top is not None:
        for key, knode, vnode in top:
            if key not in spec.FILE_KEYS:
                c.error(c.span(knode), f"unknown key {key!r} at top level", _closest(key, spec.FILE_KEYS))
                continue
            if key == "rules":
                if not isinstance(vnode, yaml.SequenceNode):
                    c.error(c.span(vnode), "'rules' must be a list of rules")
                    continue
                for i, rnode in enumerate(vnode.value):
                    rule = _parse_rule(rnode, c, builtin, order_base + len(rules) + i)
                    if rule is not None:
                        rules.append(rule)
        if "rules" not in {k for k, _, _ in top}:
            c.error(c.span(root), "pattern file has no 'rules' list")
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


def _check_tags(node: yaml.Node, c: _Collector) -> None:
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


def load_file(path: str, builtin: bool = False, order_base: int = 0) -> list[Rule]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PatternError(f"{path}: no such pattern file") from None
    except IsADirectoryError:
        raise PatternError(f"{path}: is a directory (use load_path for folders)") from None
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


# ----- one rule ----------------------------------------------------------------------------------------------
def _parse_rule(node: yaml.Node, c: _Collector, builtin: bool, order: int) -> Rule | None:
    items = _mapping(node, c, "a rule")
    if items is None:
        return None
    fields = {k: (kn, vn) for k, kn, vn in items}
    for k, kn, _ in items:
        if k not in spec.RULE_KEYS:
            c.error(c.span(kn), f"unknown key {k!r} in rule", _closest(k, spec.RULE_KEYS))
    for req in ("id", "match", "rewrite"):
        if req not in fields:
            c.error(c.span(node), f"rule is missing {req!r}")
    if any(r not in fields for r in ("id", "match", "rewrite")):
        return None
    n_before = len(c.diags)
    rule_id = _string(fields["id"][1], c, "'id'") or "?"
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", rule_id):
        c.error(c.span(fields["id"][1]), f"rule id {rule_id!r} must be letters, digits, '-', '_' or '.'")
    doc = _string(fields["doc"][1], c, "'doc'") if "doc" in fields else ""
    lines, line_spans, outputs_of = _parse_match(fields["match"][1], c)
    where = _parse_where(fields["where"][1], c, lines) if "where" in fields else {}
    if not lines:
        return None
    values = _value_names(lines)
    _check_match_names(lines, line_spans, c, where)
    for name, con in where.items():
        if con.shared:
            for r in iter_refs(lines[name]):
                if r.name in lines and not (where.get(r.name) and where[r.name].shared):
                    c.error(line_spans[name].shifted(r.off), f"shared line {name!r} reads line {r.name!r}, which is "
                            "not shared", f"mark {r.name!r} shared too: a kept node cannot read a removed one")
    compute = _parse_compute(fields["compute"][1], c) if "compute" in fields else {}
    compute_spans = ({k: c.span(vn, content=True) for k, _, vn in _mapping(fields["compute"][1], c, "'compute'") or []}
                     if "compute" in fields else {})
    rewrite = _parse_rewrite(fields["rewrite"][1], c)
    require = _parse_require(fields["require"][1], c) if "require" in fields else []
    example, example_attrs = _parse_example(fields["example"][1], c, values, lines) if "example" in fields else ({}, {})
    targets, conditions = _parse_targets(fields["targets"][1], c) if "targets" in fields else (TARGETS, {})
    stage = _plain(fields["stage"][1]) if "stage" in fields else "main"
    if stage not in ("early", "main"):
        c.error(c.span(fields["stage"][1]), f"unknown stage {stage!r}", "stages are: early, main")
    omin, omax = _parse_opset(fields["opset"][1], c) if "opset" in fields else (1, 10_000)
    rule = Rule(
        id=rule_id, doc=doc or "", file=c.file, span=c.span(fields["id"][1]), lines=lines,
        line_spans=line_spans, where=where, compute=compute, rewrite=rewrite, targets=targets,
        conditions={t: [r for r, _ in conds] for t, conds in conditions.items()}, opset_min=omin, opset_max=omax, order=order, builtin=builtin, require=[r for r, _ in require],
        example=example, example_attrs=example_attrs, outputs_of=outputs_of, early=stage == "early",
    )
    rule_require_spans = [sp for _, sp in require]
    condition_spans = [(expr, sp, f"the {t} condition") for t, conds in conditions.items() for (expr, _), sp in conds]
    if len(c.diags) == n_before:
        _check_names(rule, values, compute_spans, c, rule_require_spans, condition_spans)
    return rule if len(c.diags) == n_before else None


def _parse_match(node: yaml.Node, c: _Collector
                 ) -> tuple[dict[str, Expr], dict[str, Span], dict[str, tuple[str, int]]]:
    """Match lines; a line `a, b, c: Split(...)` names the outputs of one multi-output node: `a` holds the
    expression, and `outputs_of` maps every name of such a line to (first name, output index)."""
    lines: dict[str, Expr] = {}
    spans: dict[str, Span] = {}
    outputs_of: dict[str, tuple[str, int]] = {}
    for key, kn, vn in _mapping(node, c, "'match'") or []:
        names = [n.strip() for n in key.split(",")]
        bad = [n for n in names if not IDENT.match(n)]
        if bad:
            c.error(c.span(kn), f"match line name {bad[0]!r} must be an identifier")
            continue
        if len(set(names)) != len(names) or any(n in lines for n in names):
            c.error(c.span(kn), f"match line {key!r} repeats a name")
            continue
        name = names[0]
        text = _string(vn, c, f"match line {name!r}")
        if text is None:
            continue
        span = c.span(vn, content=True)
        try:
            expr = parse_expr(text)
            _check_calls(expr, c, span, match_side=True)
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
            continue
        if isinstance(expr, Ref) or (isinstance(expr, Alt) and any(isinstance(o, Ref) for o in expr.options)):
            c.error(span, f"match line {name!r} must be an operator call (or alternatives of calls)",
                    "a line names a node; values entering the match need no line")
            continue
        if len(names) > 1:
            if not isinstance(expr, Call):
                c.error(span, f"a multi-output match line ({key!r}) must be one operator call")
                continue
            for i, n in enumerate(names):
                outputs_of[n] = (name, i)
        for n in names:
            lines[n] = expr
            spans[n] = span
    if not lines and not c.diags:
        c.error(c.span(node), "'match' has no lines")
    return lines, spans, outputs_of


def _check_calls(expr: Expr, c: _Collector, span: Span, match_side: bool) -> None:
    for call in iter_calls(expr):
        _check_op(call, c, span, match_side)


def _check_op(call: Call, c: _Collector, span: Span, match_side: bool) -> None:
    where = span.shifted(call.off)
    if call.domain not in KNOWN_DOMAINS:
        c.error(where, f"unknown domain {call.domain!r}", "use an ONNX op (Add) or com.microsoft.<Op>")
        return
    s = op_spec(call.domain, call.op)
    if s is None:
        c.error(where, f"unknown operator {call.qualified!r}", _closest(call.op, known_ops(call.domain)))
        return
    n_args = len(call.args)
    n_required = sum(1 for a in call.args if not (isinstance(a, Ref) and a.optional))
    if n_args > s.max_inputs or n_required < s.min_inputs and n_args < s.min_inputs:
        expected = f"{s.min_inputs}" if s.min_inputs == s.max_inputs else f"{s.min_inputs} to {s.max_inputs}"
        c.error(where, f"{call.qualified} takes {expected} inputs, got {n_args}")
    attr_names = all_attr_names(call.domain, call.op)  # a rule's opset range picks the version
    for k, v in call.kwargs.items():
        if k == "copy_attrs" and not match_side:
            continue
        if k not in attr_names:
            c.error(span.shifted(call.kw_offs[k]), f"{call.qualified} has no attribute {k!r}",
                    _closest(k, attr_names) or (f"attributes: {', '.join(sorted(attr_names))}" if attr_names else None))
            continue
        if match_side:
            try:
                call.lits[k] = literal(v, call.kw_offs[k])
            except SyntaxProblem as e:
                c.error(span.shifted(e.offset), e.message)


def _value_names(lines: dict[str, Expr]) -> set[str]:
    return {r.name for e in lines.values() for r in iter_refs(e) if r.name not in lines and r.name != "_"}


def _check_match_names(lines: dict[str, Expr], spans: dict[str, Span], c: _Collector,
                       where: dict[str, Constraint]) -> None:
    for name, expr in lines.items():
        for r in iter_refs(expr):
            if r.name == "_" or r.name in lines:
                if r.name == name:
                    c.error(spans[name].shifted(r.off), f"line {name!r} refers to itself")
                continue
            if not r.name[0].isupper():
                c.error(spans[name].shifted(r.off), f"undefined name {r.name!r}",
                        "interior nodes need their own match line; values entering the match are UPPERCASE")
    root = next(reversed(lines))
    reach: set[str] = set()
    todo = [n for n, e in lines.items() if e is lines[root]]  # every name of a multi-output root line
    while todo:
        n = todo.pop()
        if n in reach:
            continue
        reach.add(n)
        todo.extend(r.name for r in iter_refs(lines[n]) if r.name in lines)
    for name in lines:
        if name not in reach:
            c.error(spans[name], f"match line {name!r} is not used by the root line {root!r}",
                    "the last match line is the root; every other line must feed it")


def _parse_where(node: yaml.Node, c: _Collector, lines: dict[str, Expr]) -> dict[str, Constraint]:
    out: dict[str, Constraint] = {}
    names = _value_names(lines) | set(lines)
    for name, kn, vn in _mapping(node, c, "'where'") or []:
        if name not in names:
            c.error(c.span(kn), f"'where' names {name!r}, which the match does not use", _closest(name, names))
            continue
        items = _mapping(vn, c, f"constraints of {name!r}")
        if items is None:
            continue
        con = Constraint(span=c.span(kn))
        for key, ckn, cvn in items:
            if key not in spec.CONSTRAINT_KEYS:
                c.error(c.span(ckn), f"unknown constraint {key!r}", _closest(key, spec.CONSTRAINT_KEYS))
                continue
            _set_constraint(con, key, _plain(cvn), c, c.span(cvn), name in lines)
        out[name] = con
    return out


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _numbers(v: object) -> object:
    """YAML 1.1 reads `1e-3` as a string; take such strings as the numbers they spell."""
    if isinstance(v, str) and _FLOAT.match(v.strip()):
        return float(v)
    if isinstance(v, list):
        return [_numbers(x) for x in v]
    return v


def _set_constraint(con: Constraint, key: str, v: object, c: _Collector, span: Span, is_line: bool) -> None:
    bad = None
    if key in ("const", "rtol", "atol"):
        v = _numbers(v)
    if key == "const":
        flat = v if isinstance(v, list) else [v]
        if not flat or not all(_is_number(x) for x in flat):
            bad = "'const' must be a number or a list of numbers"
        else:
            con.const = np.asarray(v, dtype=np.float64)
    elif key in ("rtol", "atol"):
        if not _is_number(v) or v < 0:
            bad = f"{key!r} must be a non-negative number"
        else:
            setattr(con, key, float(v))
    elif key == "constant":
        if not isinstance(v, bool):
            bad = "'constant' must be true or false"
        else:
            con.constant = v
    elif key == "shared":
        if not isinstance(v, bool):
            bad = "'shared' must be true or false"
        elif not is_line:
            bad = "'shared' applies to match lines only (a value entering the match is never removed)"
        else:
            con.shared = v
    elif key == "dtype":
        names = v if isinstance(v, list) else [v]
        unknown = [n for n in names if not isinstance(n, str) or n not in DTYPES]
        if unknown or not names:
            bad = f"unknown dtype {unknown[0] if unknown else v!r}"
            c.error(span, bad, f"one of: {', '.join(DTYPES)}")
            return
        con.dtype = tuple(DTYPES[n] for n in names)
    elif key == "rank":
        ranks = v if isinstance(v, list) else [v]
        if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
            bad = "'rank' must be a non-negative integer or a list of them"
        else:
            con.rank = tuple(ranks)
    elif key == "shape":
        alts = v if isinstance(v, list) and v and all(isinstance(x, list) for x in v) else [v]
        ok = all(isinstance(a, list) and all(isinstance(d, int | str) and not isinstance(d, bool) for d in a)
                 for a in alts)
        if not ok:
            bad = "'shape' must be a list of dims (integers, dim names, '_') or a list of such lists"
        else:
            con.shape = tuple(tuple(a) for a in alts)
    elif key == "attrs":
        if not is_line:
            bad = "'attrs' applies to match lines (nodes), not to values"
        elif not isinstance(v, dict):
            bad = "'attrs' must be a mapping of attribute name to value"
        else:
            con.attrs = dict(v)
    if bad:
        c.error(span, bad)


def _parse_compute(node: yaml.Node, c: _Collector) -> dict[str, CompiledExpr]:
    out: dict[str, CompiledExpr] = {}
    for name, kn, vn in _mapping(node, c, "'compute'") or []:
        if not IDENT.match(name):
            c.error(c.span(kn), f"compute name {name!r} must be an identifier")
            continue
        raw = _plain(vn)
        span = c.span(vn, content=True)
        if not isinstance(raw, str | int | float | list):
            c.error(span, f"compute {name!r} must be an expression")
            continue
        try:
            out[name] = compile_expr(raw)
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
    return out


def _parse_rewrite(node: yaml.Node, c: _Collector) -> list[RewriteNode]:
    out: list[RewriteNode] = []
    for key, kn, vn in _mapping(node, c, "'rewrite'") or []:
        outs = [o.strip() for o in key.split(",")]
        if not all(o == "_" or IDENT.match(o) for o in outs) or all(o == "_" for o in outs):
            c.error(c.span(kn), f"rewrite outputs {key!r} must be names separated by commas ('_' skips one)")
            continue
        text = _string(vn, c, f"rewrite of {key!r}")
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
        _check_op(expr, c, span, match_side=False)
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


def _parse_require(node: yaml.Node, c: _Collector) -> list[tuple[tuple[CompiledExpr, str], Span]]:
    if not isinstance(node, yaml.SequenceNode):
        c.error(c.span(node), "'require' must be a list of conditions")
        return []
    out = []
    for item in node.value:
        text = _string(item, c, "a 'require' condition")
        if text is None:
            continue
        span = c.span(item, content=True)
        try:
            out.append(((compile_expr(text), text), span))
        except SyntaxProblem as e:
            c.error(span.shifted(e.offset), e.message, e.hint)
    return out


def _parse_example(node: yaml.Node, c: _Collector, values: set[str], lines: dict[str, Expr]
                   ) -> tuple[dict[str, list[list[int]]], dict[tuple[str, str], object]]:
    """Shapes of input values (a shape, or a list of alternative shapes), constant values of input values
    (`{value: [...]}`, e.g. a Reshape's target shape) and `line.attr` attribute values for the models
    `patterns test` builds. Constant values are returned under the key ('', name) of the attribute map."""
    shapes: dict[str, list[list[int]]] = {}
    attrs: dict[tuple[str, str], object] = {}

    def dims_ok(v: object) -> bool:
        return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)

    for name, kn, vn in _mapping(node, c, "'example'") or []:
        v = _plain(vn)
        line, dot, attr = name.partition(".")
        if dot:
            if line not in lines:
                c.error(c.span(kn), f"'example' sets an attribute of {line!r}, which is not a match line")
            else:
                attrs[(line, attr)] = v
        elif name not in values:
            c.error(c.span(kn), f"'example' names {name!r}, which is not an input value of the match",
                    _closest(name, values))
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


def _parse_targets(node: yaml.Node, c: _Collector
                   ) -> tuple[tuple[str, ...], dict[str, list[tuple[tuple[CompiledExpr, str], Span]]]]:
    """`targets: [cpu, cuda]`, or a mapping with conditions per target: `{cpu: {}, cuda: {require: [...]}}`
    (the keys are the targets; an empty value means no condition beyond the rule's own)."""
    conditions: dict[str, list[tuple[tuple[CompiledExpr, str], Span]]] = {}
    if isinstance(node, yaml.MappingNode):
        targets: list[str] = []
        for name, kn, vn in _mapping(node, c, "'targets'") or []:
            if name not in TARGETS:
                c.error(c.span(kn), f"unknown target {name!r}", f"targets are: {', '.join(TARGETS)}")
                continue
            targets.append(name)
            if isinstance(vn, yaml.ScalarNode) and _plain(vn) is None:
                continue
            for key, ckn, cvn in _mapping(vn, c, f"conditions for {name!r}") or []:
                if key not in spec.TARGET_KEYS:
                    c.error(c.span(ckn), f"unknown key {key!r} for target {name!r}", _closest(key, spec.TARGET_KEYS)
                            or f"a target takes: {', '.join(spec.TARGET_KEYS)}")
                elif key == "require":
                    conditions[name] = _parse_require(cvn, c)
        if not targets and not c.diags:
            c.error(c.span(node), "'targets' names no target", f"targets are: {', '.join(TARGETS)}")
        return tuple(targets) or TARGETS, conditions
    v = _plain(node)
    vals = v if isinstance(v, list) else [v]
    bad = [t for t in vals if t not in TARGETS]
    if bad or not vals:
        c.error(c.span(node), f"unknown target {bad[0] if bad else v!r}", f"targets are: {', '.join(TARGETS)}")
        return TARGETS, conditions
    return tuple(vals), conditions


def _parse_opset(node: yaml.Node, c: _Collector) -> tuple[int, int]:
    v = _plain(node)
    if isinstance(v, dict) and set(v) <= {"min", "max"} and all(isinstance(x, int) for x in v.values()):
        return int(v.get("min", 1)), int(v.get("max", 10_000))
    c.error(c.span(node), "'opset' must be a mapping like {min: 13, max: 17}")
    return 1, 10_000


def _check_names(rule: Rule, values: set[str], compute_spans: dict[str, Span], c: _Collector,
                 require_spans: list[Span], conditions: list[tuple[CompiledExpr, Span, str]] | None = None) -> None:
    lines = rule.lines
    constant_ok = {n for n, con in rule.where.items() if con.needs_constant}
    defined = set(values) | set(lines)
    used_compute: set[str] = set()

    def check_expr(expr: CompiledExpr, span: Span, known_compute: set[str], what: str) -> None:
        for name, fld, off in expr.names:
            if name in known_compute:
                used_compute.add(name)
                if fld is not None:
                    c.error(span.shifted(off), f"{name!r} is a computed value; it has no field {fld!r}")
            elif name in lines:
                if fld is None:
                    c.error(span.shifted(off), f"{name!r} is a node; read an attribute like {name}.<attr>")
            elif name in values:
                if fld not in (None, "value", "shape", "dims", "rank", "dtype", "size"):
                    c.error(span.shifted(off), f"values have no field {fld!r}",
                            "fields: value, shape, dims, rank, dtype, size")
                elif fld in (None, "value") and name not in constant_ok:
                    c.error(span.shifted(off), f"{what} reads the value of {name!r}, which may not be constant",
                            f"add '{name}: {{constant: true}}' under 'where'")
            else:
                c.error(span.shifted(off), f"undefined name {name!r} in {what}", _closest(name, defined))

    known: set[str] = set()
    for name, expr in rule.compute.items():
        if name in defined:
            c.error(compute_spans.get(name, rule.span), f"compute name {name!r} is already used in the match")
        check_expr(expr, compute_spans.get(name, rule.span), known, f"compute {name!r}")
        known.add(name)
    for (expr, _), span in zip(rule.require, require_spans, strict=True):
        check_expr(expr, span, known, "require")
    for expr, span, what in conditions or []:
        check_expr(expr, span, known, what)
    temps: dict[str, Span] = {}
    produced: set[str] = set()
    for rn in rule.rewrite:
        args = rn.call.args if rn.call is not None else [Ref(rn.alias or "", False, 0)]
        for a in args:
            assert isinstance(a, Ref)
            if a.name == "_":
                if rn.call is None:
                    c.error(rn.span.shifted(a.off), "'_' cannot be aliased", "name the value the output becomes")
            elif a.name in known:
                used_compute.add(a.name)
            elif a.name in temps:
                temps.pop(a.name)
            elif a.name not in defined and a.name not in produced:
                c.error(rn.span.shifted(a.off), f"undefined name {a.name!r} in rewrite",
                        _closest(a.name, defined | known | produced))
        for k, expr in rn.attrs.items():
            assert rn.call is not None
            check_expr(expr, rn.span.shifted(rn.call.kw_offs.get(k, 0)), known, f"attribute {k!r}")
        if rn.copy_attrs is not None and rn.copy_attrs not in lines and rn.call is not None:
            c.error(rn.span.shifted(rn.call.kw_offs["copy_attrs"]),
                    f"copy_attrs names {rn.copy_attrs!r}, which is not a match line")
        for k, o in enumerate(rn.outputs):
            if o == "_":
                continue
            if o in produced:
                c.error(rn.span, f"rewrite defines {o!r} twice")
            produced.add(o)
            if o not in lines:
                if o in values or o in known:
                    c.error(rn.span, f"rewrite output {o!r} is an input value of the match, not a node")
                elif k == 0:
                    temps[o] = rn.span  # a later output may be named only because the op needs it present
    for o in lines:
        if (o[0].isupper() or o == rule.root) and o not in produced:
            c.error(rule.line_spans[o], f"rewrite does not produce {o!r}, an output of the match",
                    f"add a rewrite line for {o!r}" if o == rule.root else
                    "UPPERCASE match lines are outputs: the rewrite must re-create them (or rename to lowercase)")
    for name, span in temps.items():
        if name not in {o for rn in rule.rewrite for o in rn.outputs if o in lines}:
            c.error(span, f"rewrite value {name!r} is never used")
    for name in rule.compute:
        if name not in used_compute:
            c.error(compute_spans.get(name, rule.span), f"compute value {name!r} is never used")
