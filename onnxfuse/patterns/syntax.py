"""Expression syntax of pattern lines: `Add(Erf(s), ONE) | Mul(X, Y?)`, `com.microsoft.Gelu(X)`.

Expressions are parsed with Python's `ast` module (never evaluated) and turned into a small typed tree.
`B?` marks an optional input; `|` separates alternatives; `_` matches any value.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..concepts import CONCEPTS
from ..concepts.function_table import FUNCTIONS
from ..concepts.language import OPT_MARK, Concept, SyntaxProblem, char_offset, offset_of  # noqa: F401 (re-exported)


@dataclass
class Ref:
    name: str
    optional: bool
    off: int


@dataclass
class Call:
    op: str
    domain: str
    args: list[Expr]
    kwargs: dict[str, ast.expr] = field(default_factory=dict)
    kw_offs: dict[str, int] = field(default_factory=dict)
    off: int = 0
    lits: dict[str, object] = field(default_factory=dict)  # literal attribute constraints (match side)

    @property
    def qualified(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op


@dataclass
class Alt:
    options: list[Expr]
    off: int


Expr = Ref | Call | Alt | Concept
# Lowercase call names of the match language that are concepts, not operators (concepts/: each parses its own).
CONCEPT_NAMES = frozenset(CONCEPTS)



def parse_python(text: str) -> tuple[ast.expr, str]:
    """Parse one expression (with `?` markers) into a Python AST node; returns the node and marked text."""
    marked = text.replace("?", OPT_MARK)
    flat = " ".join(marked.splitlines())
    try:
        tree = ast.parse(flat.strip() and flat, mode="eval")
    except SyntaxError as e:
        off = char_offset(flat, (e.offset or 1) - 1) if e.offset else 0
        raise SyntaxProblem(f"syntax error in expression: {e.msg}", off) from None
    return tree.body, flat



def dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def parse_expr(text: str) -> Expr:
    node, flat = parse_python(text)
    return _convert(node, flat)


def _convert(node: ast.expr, text: str) -> Expr:
    off = offset_of(node, text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        options: list[Expr] = []
        for side in (node.left, node.right):
            sub = _convert(side, text)
            options.extend(sub.options if isinstance(sub, Alt) else [sub])
        return Alt(options, off)
    if isinstance(node, ast.Name):
        name = node.id
        optional = name.endswith(OPT_MARK)
        name = name.rstrip(OPT_MARK)
        if OPT_MARK in name:
            raise SyntaxProblem("'?' may only end a name", off)
        return Ref(name, optional, off)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONCEPT_NAMES:
        return _concept(node, text, off)
    if isinstance(node, ast.Call):
        qual = dotted_name(node.func)
        if qual is None or OPT_MARK in qual:
            raise SyntaxProblem("expected an operator name before '('", off)
        domain, _, op = qual.rpartition(".")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise SyntaxProblem("'*' arguments are not allowed", off)
        args = [_convert(a, text) for a in node.args]
        kwargs: dict[str, ast.expr] = {}
        kw_offs: dict[str, int] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise SyntaxProblem("'**' arguments are not allowed", offset_of(kw.value, text))
            kwargs[kw.arg] = kw.value
            kw_offs[kw.arg] = offset_of(kw, text)
        return Call(op, domain, args, kwargs, kw_offs, off)
    raise SyntaxProblem(
        "expected an operator call like Add(X, Y), a name, or alternatives joined with '|'",
        off,
        hint="numbers and constants go in 'where' (e.g. ONE: {const: 1.0}) or 'compute'",
    )


def _concept(node: ast.Call, text: str, off: int) -> Concept:
    return CONCEPTS[node.func.id].parse(node, text, off, lambda a: _convert(a, text))  # type: ignore[attr-defined]


def iter_calls(expr: Expr):
    """Every Call in an expression tree, outermost first."""
    if isinstance(expr, Call):
        yield expr
        for a in expr.args:
            yield from iter_calls(a)
    elif isinstance(expr, Alt):
        for o in expr.options:
            yield from iter_calls(o)
    elif isinstance(expr, Concept):
        yield from iter_calls(expr.arg)


def iter_concepts(expr: Expr):
    """Every Concept in an expression tree, outermost first."""
    if isinstance(expr, Concept):
        yield expr
        yield from iter_concepts(expr.arg)
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from iter_concepts(a)
    elif isinstance(expr, Alt):
        for o in expr.options:
            yield from iter_concepts(o)


def iter_refs(expr: Expr):
    if isinstance(expr, Ref):
        yield expr
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from iter_refs(a)
    elif isinstance(expr, Alt):
        for o in expr.options:
            yield from iter_refs(o)
    elif isinstance(expr, Concept):
        if expr.bias is not None:
            yield Ref(expr.bias, True, expr.off)
        yield from iter_refs(expr.arg)


def max_calls(expr: Expr) -> int:
    """Nodes in the largest alternative: the rule's size for ordering (a concept counts as its argument and
    the nodes of its usual spelling: a function's own number of them, two for the others)."""
    if isinstance(expr, Ref):
        return 0
    if isinstance(expr, Alt):
        return max(max_calls(o) for o in expr.options)
    if isinstance(expr, Concept):
        return (FUNCTIONS[expr.function].size if expr.function else 2) + max_calls(expr.arg)
    return 1 + sum(max_calls(a) for a in expr.args)


def literal(node: ast.expr, off: int) -> object:
    """A literal attribute value in a match (numbers, strings, lists of them)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise SyntaxProblem("attribute values in 'match' must be literals (numbers, strings, lists)", off) from None


def layout_atoms(lines) -> frozenset[str]:
    """The axis names of the layouts in a rule's match lines (dims the rule reads by name)."""
    return frozenset(a for e in lines.values() for c in iter_concepts(e) if c.parsed is not None
                     for a in c.parsed.atoms)
