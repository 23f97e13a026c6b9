"""What every concept module shares: the `Concept` node of the match language, the syntax error with its column,
the matcher's value markers, and `ConceptKind`, the one record a concept registers (concepts/__init__.py).

A concept is a lowercase call in a match line (`layout(q, "b s (n d) -> b n s d")`) that the matcher proves
instead of matching op types. Its module declares, in one `ConceptKind`: its name, its parser (the call's
arguments into a `Concept`), its matcher (the proof, yielding bindings or telling the matcher why not) and its
rows of the pattern-language docs. The pattern parser (patterns/syntax.py), the matcher (match/matcher.py) and
the docs generator (patterns/docs.py) read the registry; none of them names a concept.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ABSENT", "DERIVED", "OPT_MARK", "Concept", "ConceptKind", "SyntaxProblem", "char_offset", "offset_of",
           "short", "upper_name"]

OPT_MARK = "ʔ"  # '?' is rewritten to this identifier letter so Python's parser accepts `B?`
ABSENT = ""  # the value of an optional input that is not there
DERIVED = "\x00mask:"  # the value name of a mask the rewrite builds (Binding.derived)


class SyntaxProblem(Exception):
    """An error at a character offset inside one expression string."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.hint = hint


@dataclass
class Concept:
    """A concept the matcher proves instead of matching ops (match side only): `layout(q, "b s (n d) -> b n
    s d", scale=S)`, `scaled(MatMul(q, k), scale=S)`, `masked(s, M)`. `arg` is the expression matched where the
    concept's chain starts; `layout` the text of its rearrangement; `facts` the names it binds (kwarg -> name);
    `bias` the value name `masked` binds (the sum of its additive terms; absent when there is none), `rows` the
    value whose dim -2 is the query length when the mask must have every query row (rank 4)."""

    name: str
    arg: Any  # the expression (patterns/syntax.py Expr)
    layout: str | None
    facts: dict[str, str]
    off: int
    layout_off: int = 0
    parsed: object = None  # the parsed Layout (concepts/layout_text.py), set by the pattern checker
    bias: str | None = None
    rows: str | None = None  # masked(..., rows=X): M gets every query row, X's dim -2 of them
    causal: bool = False  # masked(..., causal=True): M must mask every later key (concepts/causal.py proves it)
    function: str | None = None  # computes(x, "gelu"): the function's name (concepts/function_table.py)


# parse(call, text, offset of the call, convert: an argument's AST node -> its expression) -> Concept
Parse = Callable[[ast.Call, str, int, Callable[[ast.expr], Any]], Concept]
# match(matcher, concept, value, binding, consumer) -> the bindings where `value` is the concept
Match = Callable[[Any, Concept, str, Any, Any], Iterator[Any]]


@dataclass(frozen=True)
class ConceptKind:
    """One concept of the match language: its name, parser, matcher, and its rows of the language's docs table
    ((syntax, meaning) each; `{region_ops}` and `{functions}` are filled in by the docs generator)."""

    name: str
    parse: Parse
    match: Match
    docs: tuple[tuple[str, str], ...]


def char_offset(text: str, col_bytes: int) -> int:
    return len(text.encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))


def offset_of(node: ast.AST, text: str) -> int:
    return char_offset(text, getattr(node, "col_offset", 0))


def upper_name(node: ast.expr, text: str, what: str) -> str:
    """The UPPERCASE name a concept's argument binds, or a SyntaxProblem saying `what` it must be."""
    if not isinstance(node, ast.Name) or OPT_MARK in node.id or not node.id[:1].isupper():
        raise SyntaxProblem(what, offset_of(node, text))
    return node.id


def short(v: np.ndarray) -> str:
    """A constant as a reason shows it: one number, or the first four."""
    flat = np.asarray(v).reshape(-1)
    if flat.size == 1:
        return f"{float(flat[0]):.6g}"
    head = ", ".join(f"{float(x):.4g}" for x in flat[:4])
    return f"[{head}{', ...' if flat.size > 4 else ''}]"
