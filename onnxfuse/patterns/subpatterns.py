"""Named sub-patterns: a pattern file's `patterns:` are match expressions with parameters that its rules call by
name, as ast-grep's `utils:` are named sub-rules. `weights(p): Where(IsNaN(p), ZERO, p) | p` once; a match
line writes `MatMul(weights(p), V)`, which is the sub-pattern with `p` replaced by the argument. Names inside
the sub-pattern that are not parameters (ZERO) are the calling rule's own (its `where` constrains them).

A call is expanded where the line is parsed, so everything after (the matcher, explain, the self-test) sees
the expanded expression; a node the sub-pattern brings in reports at the call's column."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .rules import Span
from .syntax import Alt, Call, Concept, Expr, Ref, SyntaxProblem

__all__ = ["SIGNATURE", "SubPattern", "expand", "parse_signature"]

SIGNATURE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*\(\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)?\s*\)\s*$")
MAX_DEPTH = 8  # sub-patterns calling sub-patterns, at most this deep (a cycle is an error, not a hang)


@dataclass(frozen=True)
class SubPattern:
    name: str
    params: tuple[str, ...]
    body: Expr
    span: Span


def parse_signature(key: str) -> tuple[str, tuple[str, ...]] | None:
    """`weights(p)` -> ("weights", ("p",)); None where the key is not a lowercase name with parameters."""
    m = SIGNATURE.match(key)
    if m is None:
        return None
    return m.group(1), tuple(p.strip() for p in (m.group(2) or "").split(",") if p.strip())


def expand(expr: Expr, subs: dict[str, SubPattern], depth: int = 0) -> Expr:
    """`expr` with every call of a sub-pattern replaced by its body, parameters bound to the call's arguments."""
    if not subs:
        return expr
    if isinstance(expr, Alt):
        options: list[Expr] = []
        for o in expr.options:
            sub = expand(o, subs, depth)
            options.extend(sub.options if isinstance(sub, Alt) else [sub])
        return Alt(options, expr.off)
    if isinstance(expr, Concept):
        return dataclasses.replace(expr, arg=expand(expr.arg, subs, depth))
    if not isinstance(expr, Call):
        return expr
    args = [expand(a, subs, depth) for a in expr.args]
    sub = subs.get(expr.op) if not expr.domain else None
    if sub is None:
        return dataclasses.replace(expr, args=args)
    if depth >= MAX_DEPTH:
        raise SyntaxProblem(f"sub-pattern {sub.name!r} calls itself (or a chain of {MAX_DEPTH} does)", expr.off)
    if expr.kwargs:
        raise SyntaxProblem(f"sub-pattern {sub.name!r} takes no keyword arguments", expr.off)
    if len(args) != len(sub.params):
        raise SyntaxProblem(f"sub-pattern {sub.name!r} takes {len(sub.params)} argument(s) "
                            f"({', '.join(sub.params)}), got {len(args)}", expr.off)
    return expand(_bind(sub.body, dict(zip(sub.params, args, strict=True)), expr.off), subs, depth + 1)


def _bind(expr: Expr, args: dict[str, Expr], off: int) -> Expr:
    """The body with its parameters replaced, every node of its own at the call's column `off`."""
    if isinstance(expr, Ref):
        return args[expr.name] if expr.name in args else dataclasses.replace(expr, off=off)
    if isinstance(expr, Alt):
        options: list[Expr] = []
        for o in expr.options:
            sub = _bind(o, args, off)
            options.extend(sub.options if isinstance(sub, Alt) else [sub])
        return Alt(options, off)
    if isinstance(expr, Concept):
        return dataclasses.replace(expr, arg=_bind(expr.arg, args, off), off=off, layout_off=off)
    return dataclasses.replace(expr, args=[_bind(a, args, off) for a in expr.args], off=off,
                               kw_offs={k: off for k in expr.kw_offs})
