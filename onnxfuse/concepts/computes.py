"""The computes concept: `computes(x, "gelu")` (or `computes(x, "layernorm", eps=EPS)`) is any region of
elementwise and normalizing ops from one source to the value that computes the function of it
(function_regions.py proves it by running the region; function_table.py names the functions). `x` is matched
at the source, the nearest source first; eps= binds the number the region adds, alpha= QuickGelu's factor."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ..ir import Node
from .function_regions import regions
from .function_table import FUNCTIONS, REGION_OPS
from .language import Concept, ConceptKind, SyntaxProblem, offset_of, upper_name

__all__ = ["COMPUTES"]


def parse(node: ast.Call, text: str, off: int, convert: Callable[[ast.expr], Any]) -> Concept:
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
        if not fn.param or kw.arg != fn.param:
            raise SyntaxProblem(f"computes {fn.name!r} has no parameter {kw.arg!r} (it has: {fn.param or 'none'})",
                                offset_of(kw.value, text))
        facts[fn.param] = upper_name(kw.value, text, f"{fn.param}= names the number the concept binds: an "
                                                     "UPPERCASE name")
    return Concept("computes", convert(node.args[0]), None, facts, off, function=fn.name)


def match(m, c: Concept, value: str, b, consumer: Node | None) -> Iterator:
    """The regions that end at `value` and compute the function, `x` matched at each one's source."""
    assert c.function is not None
    # At the root of an attempt, a value that only region ops read is a part of a longer chain: that a part
    # computes something else is no near miss (the chain's end is the candidate to explain).
    readers = m.graph.consumers.get(value, [])
    inner = not b.matched and value not in m.graph.graph_outputs and bool(readers) and all(
        n.domain == "" and n.op_type in REGION_OPS for n in readers)
    cache = m.cache("computes")  # per (value, function, inner): the regions found, and why others are not
    key = (value, c.function, inner)
    hit = cache.get(key)
    if hit is None or any(not n.alive for r in hit[0] for n in r.nodes):  # (a rewrite took some: found again)
        reasons: list[tuple[str, str, tuple[Node, ...]]] = []
        hit = (list(regions(m.graph, value, FUNCTIONS[c.function], set(),
                            lambda node, why, nodes: reasons.append((node, why, nodes)), inner)), reasons)
        cache[key] = hit
    found, reasons = hit
    for node, why, nodes in reasons:  # a region that was run counts as that far along
        m.fail(dataclasses.replace(b, matched=b.matched + nodes), node, why)
    taken = {id(n) for n in b.matched}
    for r in found:
        if any(id(n) in taken for n in r.nodes):
            m.fail(b, r.nodes[-1].name, f"computes {c.function!r}: its ops are already part of this match")
            continue
        b2 = b
        for x in reversed(r.nodes):
            b2 = b2.take(x)
        # (not `chained`: a region's value read outside fails the match, it is not computed twice)
        for name in c.facts:  # the function's parameter (eps, alpha)
            b2 = b2.with_fact(c.facts[name], r.param)
        yield from m.expr(c.arg, r.source, b2, r.reader)


COMPUTES = ConceptKind("computes", parse, match, (
    ('`computes(x, "NAME")`', "any region of elementwise and normalizing ops ({region_ops}) whose only non-constant "
     "input is `x` and that computes the function NAME of it, proved by running the region in float64 on test "
     "inputs; the nearest source is tried first; the functions: {functions}"),
    ('`computes(x, "NAME", eps=E)`', "the same for a normalization; `E` is the number the region adds under the "
     "root (0 when there is none)"),
    ('`computes(x, "quickgelu", alpha=A)`', "x * sigmoid(A * x): `A` is the factor the region multiplies by (a "
     "region with none is not this function)"),
))
