"""Pattern files: the `match` lines and the `where` constraints (the CONSTRAINT_KEYS table)."""

from __future__ import annotations

import numpy as np
import yaml

from ..concepts.layout_text import LayoutError, parse_layout
from ..opschema import all_attr_names, known_ops, op_spec
from ..words import close_matches, similarity
from .rules import Constraint, Span
from .subpatterns import SubPattern, expand, parse_signature
from .syntax import (
    CONCEPT_NAMES,
    Alt,
    Call,
    Expr,
    Ref,
    SyntaxProblem,
    iter_calls,
    iter_concepts,
    iter_refs,
    literal,
    parse_expr,
)
from .vocab import DTYPES, Key, Table, closest
from .yaml_nodes import (
    DIM_SCHEMA,
    IDENT,
    NUMBERS_SCHEMA,
    PATTERN_DOMAINS,
    TOLERANCE_SCHEMA,
    Collector,
    Invalid,
    is_number,
    mapping,
    numbers,
    plain,
    string_node,
)


def parse_match(node: yaml.Node, c: Collector
                 ) -> tuple[dict[str, Expr], dict[str, Span], dict[str, tuple[str, int]]]:
    """Match lines; a line `a, b, c: Split(...)` names the outputs of one multi-output node: `a` holds the
    expression, and `outputs_of` maps every name of such a line to (first name, output index)."""
    lines: dict[str, Expr] = {}
    spans: dict[str, Span] = {}
    outputs_of: dict[str, tuple[str, int]] = {}
    for key, kn, vn in mapping(node, c, "'match'") or []:
        names = [n.strip() for n in key.split(",")]
        bad = [n for n in names if not IDENT.match(n)]
        if bad:
            c.error(c.span(kn), f"match line name {bad[0]!r} must be an identifier")
            continue
        if len(set(names)) != len(names) or any(n in lines for n in names):
            c.error(c.span(kn), f"match line {key!r} repeats a name")
            continue
        name = names[0]
        parsed = _match_expr(vn, c, f"match line {name!r}", set(names) | set(lines))
        if parsed is None:
            continue
        expr, span = parsed
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


def parse_subpatterns(node: yaml.Node, c: Collector) -> None:
    """The file's `patterns:`: `name(param, ...): expression`, each checked where it is written (its operators,
    its concepts' layouts), into `c.subpatterns` for the match lines that call it."""
    for key, kn, vn in mapping(node, c, "'patterns'") or []:
        sig = parse_signature(key)
        if sig is None:
            c.error(c.span(kn), f"sub-pattern {key!r} must be a lowercase name with its parameters, e.g. weights(p)")
            continue
        name, params = sig
        if name in CONCEPT_NAMES or name in c.subpatterns or len(set(params)) != len(params):
            c.error(c.span(kn), f"sub-pattern {name!r} is defined twice, is a concept's name, or repeats a parameter")
            continue
        parsed = _match_expr(vn, c, f"sub-pattern {name!r}", set())
        if parsed is None:
            continue
        body, span = parsed
        unused = [p for p in params if p not in {r.name for r in iter_refs(body)}]
        if unused:
            c.error(c.span(kn), f"sub-pattern {name!r} does not use its parameter {unused[0]!r}")
            continue
        c.subpatterns[name] = SubPattern(name, params, body, span)


def _match_expr(vn: yaml.Node, c: Collector, what: str, line_names: set[str]) -> tuple[Expr, Span] | None:
    """A match expression (a line's, a sub-pattern's) with the sub-patterns it calls expanded and its operators
    and concepts checked, and where it starts; None (the error said) where it does not parse."""
    text = string_node(vn, c, what)
    if text is None:
        return None
    span = c.span(vn, content=True)
    try:
        expr = expand(parse_expr(text), c.subpatterns)
        _check_calls(expr, c, span, match_side=True)
    except SyntaxProblem as e:
        c.error(span.shifted(e.offset), e.message, e.hint)
        return None
    return (expr, span) if _check_concepts(expr, c, span, line_names) else None


def _check_concepts(expr: Expr, c: Collector, span: Span, line_names: set[str]) -> bool:
    """Parse each concept's layout (errors at their column); False when one does not parse."""
    ok = True
    for concept in iter_concepts(expr):
        if concept.layout is None:
            continue
        try:
            concept.parsed = parse_layout(concept.layout)
        except LayoutError as e:
            c.error(span.shifted(concept.layout_off + e.offset), e.message)
            ok = False
            continue
        clash = sorted(set(concept.parsed.atoms) & line_names)
        if clash:
            c.error(span.shifted(concept.layout_off), f"layout axis {clash[0]!r} is also a match line name",
                    "axis names are dims (read by name in compute and require): rename one of them")
            ok = False
    return ok


def _check_calls(expr: Expr, c: Collector, span: Span, match_side: bool) -> None:
    for call in iter_calls(expr):
        check_op(call, c, span, match_side)


def op_hint(domain: str, op: str) -> str | None:
    """'did you mean' for an unknown operator, named as a pattern writes it (with its domain): the same name in
    the other domain first (com.microsoft.Sigmoid -> Sigmoid, the ONNX op), else the closest name in either
    domain, the op's own domain winning a tie (QuickGelux -> com.microsoft.QuickGelu)."""
    def named(d: str, o: str) -> str:
        return f"{d}.{o}" if d else o

    others = [d for d in PATTERN_DOMAINS if d != domain]
    same = [d for d in others if op in known_ops(d)]
    if same:
        what = f"a {same[0]} op" if same[0] else "an ONNX op, written without a domain"
        return f"did you mean {named(same[0], op)!r}? {op} is {what}"
    scored = [(similarity(op, m), d == domain, named(d, m))
              for d in (domain, *others) for m in close_matches(op, known_ops(d), n=1)]
    return f"did you mean {max(scored)[2]!r}?" if scored else None


def check_op(call: Call, c: Collector, span: Span, match_side: bool) -> None:
    where = span.shifted(call.off)
    if call.domain not in PATTERN_DOMAINS:
        c.error(where, f"unknown domain {call.domain!r}", "use an ONNX op (Add) or com.microsoft.<Op>")
        return
    s = op_spec(call.domain, call.op)
    if s is None and c.builtin:  # an operator of a newer onnx or onnxruntime: the rule is unavailable here
        c.missing_ops.append(call.qualified)
        return
    if s is None:
        c.error(where, f"unknown operator {call.qualified!r}", op_hint(call.domain, call.op))
        return
    n_args = len(call.args)
    n_required = sum(1 for a in call.args if not (isinstance(a, Ref) and a.optional))
    attr_names = all_attr_names(call.domain, call.op)  # a rule's opset range picks the version
    newer = [f"{call.qualified} with {n_args} inputs"] if n_args > s.max_inputs else []
    newer += [f"{call.qualified}'s attribute {k!r}" for k in call.kwargs
              if not (k == "copy_attrs" and not match_side) and k not in attr_names]
    if newer and c.builtin:  # an input or attribute a newer onnx or onnxruntime added: unavailable here
        c.missing_ops.extend(newer)
        return
    if n_args > s.max_inputs or n_required < s.min_inputs and n_args < s.min_inputs:
        expected = f"{s.min_inputs}" if s.min_inputs == s.max_inputs else f"{s.min_inputs} to {s.max_inputs}"
        c.error(where, f"{call.qualified} takes {expected} inputs, got {n_args}")
    for k, v in call.kwargs.items():
        if k == "copy_attrs" and not match_side:
            continue
        if k not in attr_names:
            c.error(span.shifted(call.kw_offs[k]), f"{call.qualified} has no attribute {k!r}",
                    closest(k, attr_names) or (f"attributes: {', '.join(sorted(attr_names))}" if attr_names else None))
            continue
        if match_side:
            try:
                call.lits[k] = literal(v, call.kw_offs[k])
            except SyntaxProblem as e:
                c.error(span.shifted(e.offset), e.message)


def value_names(lines: dict[str, Expr]) -> set[str]:
    return {r.name for e in lines.values() for r in iter_refs(e) if r.name not in lines and r.name != "_"}


def check_match_names(lines: dict[str, Expr], spans: dict[str, Span], c: Collector,
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


def parse_where(node: yaml.Node, c: Collector, lines: dict[str, Expr]) -> dict[str, Constraint]:
    out: dict[str, Constraint] = {}
    names = value_names(lines) | set(lines)
    for name, kn, vn in mapping(node, c, "'where'") or []:
        if name not in names:
            c.error(c.span(kn), f"'where' names {name!r}, which the match does not use", closest(name, names))
            continue
        items = mapping(vn, c, f"constraints of {name!r}")
        if items is None:
            continue
        con = Constraint(span=c.span(kn))
        for key, ckn, cvn in items:
            entry = CONSTRAINT_KEYS.get(key)
            if entry is None:
                c.error(c.span(ckn), *CONSTRAINT_KEYS.unknown_error(key))
                continue
            try:
                setattr(con, key, entry.parse(plain(cvn), name in lines))
            except Invalid as e:
                c.error(c.span(cvn), e.message, e.hint)
        out[name] = con
    return out


def _const(v: object, is_line: bool) -> np.ndarray:
    v = numbers(v)
    flat = v if isinstance(v, list) else [v]
    if not flat or not all(is_number(x) for x in flat):
        raise Invalid("'const' must be a number or a list of numbers")
    return np.asarray(v, dtype=np.float64)


def _tolerance(key: str):
    def parse(v: object, is_line: bool) -> float:
        v = numbers(v)
        if not is_number(v) or v < 0:  # type: ignore[operator]
            raise Invalid(f"{key!r} must be a non-negative number")
        return float(v)  # type: ignore[arg-type]
    return parse


def _constant(v: object, is_line: bool) -> bool:
    if not isinstance(v, bool):
        raise Invalid("'constant' must be true or false")
    return v


def _shared(v: object, is_line: bool) -> bool:
    if not isinstance(v, bool):
        raise Invalid("'shared' must be true or false")
    if not is_line:
        raise Invalid("'shared' applies to match lines only (a value entering the match is never removed)")
    return v


def _dtype(v: object, is_line: bool) -> tuple[int, ...]:
    names = v if isinstance(v, list) else [v]
    unknown = [n for n in names if not isinstance(n, str) or n not in DTYPES]
    if unknown or not names:
        raise Invalid(f"unknown dtype {unknown[0] if unknown else v!r}", f"one of: {', '.join(DTYPES)}")
    return tuple(DTYPES[n] for n in names)


def _rank(v: object, is_line: bool) -> tuple[int, ...]:
    ranks = v if isinstance(v, list) else [v]
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise Invalid("'rank' must be a non-negative integer or a list of them")
    return tuple(ranks)


def _shape(v: object, is_line: bool) -> tuple[tuple[int | str, ...], ...]:
    alts = v if isinstance(v, list) and v and all(isinstance(x, list) for x in v) else [v]
    ok = all(isinstance(a, list) and all(isinstance(d, int | str) and not isinstance(d, bool) for d in a)
             for a in alts)
    if not ok:
        raise Invalid("'shape' must be a list of dims (integers, dim names, '_') or a list of such lists")
    return tuple(tuple(a) for a in alts)  # type: ignore[arg-type]


def _attrs(v: object, is_line: bool) -> dict[str, object]:
    if not is_line:
        raise Invalid("'attrs' applies to match lines (nodes), not to values")
    if not isinstance(v, dict):
        raise Invalid("'attrs' must be a mapping of attribute name to value")
    return dict(v)


CONSTRAINT_KEYS: Table[Key] = Table(
    "Constraint keys", "Under `where:`, per value or match line name: `NAME: {key: value, ...}`.", [
        Key("const", _const, NUMBERS_SCHEMA,
            "Must be a constant equal to this, within rtol/atol (a scalar: every element equals it).",
            "MEAN: {const: 0.0}"),
        Key("rtol", _tolerance("rtol"), TOLERANCE_SCHEMA,
            "Relative tolerance for 'const' (default 1e-5).", "MEAN: {const: 0.0, rtol: 0.001}"),
        Key("atol", _tolerance("atol"), TOLERANCE_SCHEMA,
            "Absolute tolerance for 'const' (default 1e-6).", "MEAN: {const: 0.0, atol: 0.0001}"),
        Key("constant", _constant, {"type": "boolean"},
            "Must be an initializer or a Constant node's output (or an Identity of either).",
            "W: {constant: true}"),
        Key("shared", _shared, {"type": "boolean"},
            "Match lines only: the node is checked but kept, and may have readers outside the match (e.g. rotary "
            "cos/sin computed once for all layers); it may read only values and other shared lines.",
            "c: {shared: true}"),
        Key("dtype", _dtype, {"oneOf": [{"enum": list(DTYPES)}, {"type": "array", "items": {"enum": list(DTYPES)}}]},
            "Allowed element types: one name or a list of them.", "X: {dtype: [float32, float16]}"),
        Key("rank", _rank, {"oneOf": [{"type": "integer", "minimum": 0},
                                      {"type": "array", "items": {"type": "integer", "minimum": 0}}]},
            "Allowed ranks: one or a list of them.", "SCALE: {rank: 1}"),
        Key("shape", _shape, {"type": "array", "items": {"oneOf": [DIM_SCHEMA, {"type": "array", "items": DIM_SCHEMA}]}},
            "Dims: integers, names (the same name is the same dim across values) or '_' (any); or a list of "
            "alternative shapes.", "W: {shape: [M, _, _, _]}"),
        Key("attrs", _attrs, {"type": "object"},
            "Match lines only: attribute values the node must have (the schema default counts where one is absent; "
            "skipped where the model's op version has no such attribute).", "Y: {attrs: {training_mode: 0}}"),
    ], unknown="unknown constraint {key!r}")
