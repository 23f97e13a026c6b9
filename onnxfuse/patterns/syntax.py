"""Expression syntax of pattern lines: `Add(Erf(s), ONE) | Mul(X, Y?)`, `com.microsoft.Gelu(X)`.

Expressions are parsed with Python's `ast` module (never evaluated) and turned into a small typed tree.
`B?` marks an optional input; `|` separates alternatives; `_` matches any value.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .functions import FUNCTIONS

OPT_MARK = "ʔ"  # '?' is rewritten to this identifier letter so Python's parser accepts `B?`


class SyntaxProblem(Exception):
    """An error at a character offset inside one expression string."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.hint = hint


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


@dataclass
class Concept:
    """A concept the matcher proves instead of matching ops (match side only): `layout(q, "b s (n d) -> b n
    s d", scale=S)`, `scaled(MatMul(q, k), scale=S)`, `masked(s, M)`. `arg` is the expression matched where the
    concept's chain starts; `layout` the text of its rearrangement; `facts` the names it binds (kwarg -> name);
    `bias` the value name `masked` binds (the sum of its additive terms; absent when there is none), `rows` the
    value whose dim -2 is the query length when the mask must have every query row (rank 4)."""

    name: str
    arg: Expr
    layout: str | None
    facts: dict[str, str]
    off: int
    layout_off: int = 0
    parsed: object = None  # the parsed Layout (patterns/layouts.py), set by the pattern checker
    bias: str | None = None
    rows: str | None = None  # masked(..., rows=X): M gets every query row, X's dim -2 of them
    causal: bool = False  # masked(..., causal=True): M must mask every later key (match/causal.py proves it)
    function: str | None = None  # computes(x, "gelu"): the function's name (patterns/functions.py FUNCTIONS)


Expr = Ref | Call | Alt | Concept
# Lowercase call names of the match language that are concepts, not operators (parsed by _concept below).
CONCEPT_NAMES = frozenset({"layout", "scaled", "masked", "computes"})


def _char_offset(text: str, col_bytes: int) -> int:
    return len(text.encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))


def parse_python(text: str) -> tuple[ast.expr, str]:
    """Parse one expression (with `?` markers) into a Python AST node; returns the node and marked text."""
    marked = text.replace("?", OPT_MARK)
    flat = " ".join(marked.splitlines())
    try:
        tree = ast.parse(flat.strip() and flat, mode="eval")
    except SyntaxError as e:
        off = _char_offset(flat, (e.offset or 1) - 1) if e.offset else 0
        raise SyntaxProblem(f"syntax error in expression: {e.msg}", off) from None
    return tree.body, flat


def offset_of(node: ast.AST, text: str) -> int:
    return _char_offset(text, getattr(node, "col_offset", 0))


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
    name = node.func.id  # type: ignore[attr-defined]
    if name == "masked":
        return _masked(node, text, off)
    if name == "computes":
        return _computes(node, text, off)
    want = 2 if name == "layout" else 1
    if len(node.args) != want or any(isinstance(a, ast.Starred) for a in node.args):
        usage = 'layout(x, "b s (n d) -> b n s d", scale=S)' if name == "layout" else "scaled(x, scale=S)"
        raise SyntaxProblem(f"{name} takes {want} argument(s): {usage}", off)
    arg = _convert(node.args[0], text)
    layout = None
    layout_off = 0
    if name == "layout":
        spec = node.args[1]
        if not (isinstance(spec, ast.Constant) and isinstance(spec.value, str)):
            raise SyntaxProblem("the layout is a string, e.g. \"b s (n d) -> b n s d\"", offset_of(spec, text))
        layout, layout_off = spec.value, offset_of(spec, text) + 1
    facts: dict[str, str] = {}
    for kw in node.keywords:
        if kw.arg != "scale":
            raise SyntaxProblem(f"{name} has no parameter {kw.arg!r} (it has: scale)", offset_of(kw.value, text))
        if not isinstance(kw.value, ast.Name) or OPT_MARK in kw.value.id or not kw.value.id[:1].isupper():
            raise SyntaxProblem("scale= names the factor the concept binds: an UPPERCASE name",
                                offset_of(kw.value, text))
        facts["scale"] = kw.value.id
    if name == "scaled" and "scale" not in facts:
        raise SyntaxProblem("scaled(x, scale=S) names the factor it binds: scaled(MatMul(q, k), scale=S)", off)
    return Concept(name, arg, layout, facts, off, layout_off)


def _masked(node: ast.Call, text: str, off: int) -> Concept:
    usage = ("masked(x, M, rows=X, causal=True): x plus the additive mask M it binds, with every query row (X's "
             "dim -2 is their number), proved to mask every later key where causal=True, e.g. "
             "Softmax(masked(scores, M, rows=X), axis=-1)")
    if len(node.args) != 2 or any(isinstance(a, ast.Starred) for a in node.args):
        raise SyntaxProblem(f"masked takes 2 arguments: {usage}", off)
    for kw in node.keywords:
        if kw.arg not in ("rows", "causal"):
            raise SyntaxProblem(f"masked has no parameter {kw.arg!r} (it has: rows, causal)", offset_of(kw.value, text))
    causal = next((kw.value for kw in node.keywords if kw.arg == "causal"), None)
    if causal is not None and not (isinstance(causal, ast.Constant) and isinstance(causal.value, bool)):
        raise SyntaxProblem(f"masked: causal= is True or False ({usage})", offset_of(causal, text))
    names = []
    for arg, what in ((node.args[1], "its second argument names the mask it binds"),
                      *((kw.value, "rows= names the value whose dim -2 is the query length")
                        for kw in node.keywords if kw.arg == "rows")):
        if not isinstance(arg, ast.Name) or OPT_MARK in arg.id or not arg.id[:1].isupper():
            raise SyntaxProblem(f"masked: {what}, an UPPERCASE name ({usage})", offset_of(arg, text))
        names.append(arg.id)
    return Concept("masked", _convert(node.args[0], text), None, {}, off, bias=names[0],
                   rows=names[1] if len(names) > 1 else None, causal=bool(causal is not None and causal.value))


def _computes(node: ast.Call, text: str, off: int) -> Concept:
    usage = 'computes(x, "gelu") or computes(x, "layernorm", eps=EPS)'
    if len(node.args) != 2 or any(isinstance(a, ast.Starred) for a in node.args):
        raise SyntaxProblem(f"computes takes 2 arguments: {usage}", off)
    spec = node.args[1]
    if not (isinstance(spec, ast.Constant) and isinstance(spec.value, str)):
        raise SyntaxProblem(f"computes: the function is a string, one of {', '.join(FUNCTIONS)}",
                            offset_of(spec, text))
    fn = FUNCTIONS.get(spec.value)
    if fn is None:
        raise SyntaxProblem(f"computes: no function {spec.value!r} (there are: {', '.join(FUNCTIONS)})",
                            offset_of(spec, text) + 1)
    facts: dict[str, str] = {}
    for kw in node.keywords:
        if kw.arg != "eps" or not fn.eps:
            has = "eps" if fn.eps else "none"
            raise SyntaxProblem(f"computes {fn.name!r} has no parameter {kw.arg!r} (it has: {has})",
                                offset_of(kw.value, text))
        if not isinstance(kw.value, ast.Name) or OPT_MARK in kw.value.id or not kw.value.id[:1].isupper():
            raise SyntaxProblem("eps= names the number the concept binds: an UPPERCASE name", offset_of(kw.value, text))
        facts["eps"] = kw.value.id
    return Concept("computes", _convert(node.args[0], text), None, facts, off, function=fn.name)


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
