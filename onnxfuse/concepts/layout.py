"""The layout and scaled concepts: `layout(x, "b s (n d) -> b n s d", scale=S)` is any chain of data movement
(and, with scale=, scalar factors) from `x` whose element map is the rearrangement; `scaled(x, scale=S)` is
scalar factors alone. The matcher walks back from the value through such ops, the longest chain first, and
each start is proved (layout_proof.py); a failure says why in the concept's terms."""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

from ..ir import Graph, Node
from .language import Concept, ConceptKind, SyntaxProblem, offset_of, upper_name
from .layout_proof import prove_layout, scalar_factor
from .layout_text import LAYOUT_OPS, Layout
from .shape_ops import RankMismatch, Unprovable

__all__ = ["LAYOUT", "SCALED"]

MAX_CHAIN = 24  # nodes a chain may have


def parse(node: ast.Call, text: str, off: int, convert: Callable[[ast.expr], Any]) -> Concept:
    name = node.func.id  # type: ignore[attr-defined]
    want = 2 if name == "layout" else 1
    if len(node.args) != want or any(isinstance(a, ast.Starred) for a in node.args):
        usage = 'layout(x, "b s (n d) -> b n s d", scale=S)' if name == "layout" else "scaled(x, scale=S)"
        raise SyntaxProblem(f"{name} takes {want} argument(s): {usage}", off)
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
        facts["scale"] = upper_name(kw.value, text, "scale= names the factor the concept binds: an UPPERCASE name")
    if name == "scaled" and "scale" not in facts:
        raise SyntaxProblem("scaled(x, scale=S) names the factor it binds: scaled(MatMul(q, k), scale=S)", off)
    return Concept(name, convert(node.args[0]), layout, facts, off, layout_off)


def _rank(graph: Graph, value: str) -> int | None:
    t = graph.type_of(value)
    return None if t is None or t.shape is None else len(t.shape)


def _chain(m, c: Concept, value: str, b) -> tuple[list[Node], dict[int, float], list[tuple[str, int]]]:
    """The nodes from `value` back through the concept's ops (nearest first), the scalar factors among them
    (node id -> factor), and each place the chain may start (value, nodes before it)."""
    g = m.graph
    moves, scales = c.name == "layout", "scale" in c.facts
    chain: list[Node] = []
    factors: dict[int, float] = {}
    starts = [(value, 0)]
    cur = value
    while len(chain) < MAX_CHAIN:
        node = g.producer.get(cur)
        if node is None or node in b.matched or node.domain != "" or node.outputs[0] != cur:
            break
        if moves and (node.op_type in LAYOUT_OPS or node.op_type == "Concat" and len(node.inputs) == 1):
            nxt = node.inputs[0]  # (a Concat of one input, an empty KV cache, moves nothing)
        elif scales and (sf := scalar_factor(g, node, _rank(g, cur))) is not None:
            nxt, factors[id(node)] = sf
        else:
            break
        chain.append(node)
        cur = nxt
        starts.append((cur, len(chain)))
    return chain, factors, starts


def match(m, c: Concept, value: str, b, consumer: Node | None) -> Iterator:
    """Walk back from `value` through data movement (layout) and scalar factors (scale=), then match the
    argument where the chain starts: the longest chain first."""
    chain, factors, starts = _chain(m, c, value, b)
    for src, n in reversed(starts):
        nodes = chain[:n]
        b2 = b
        if c.name == "layout":
            assert isinstance(c.parsed, Layout)
            try:
                proof = prove_layout(m.graph, src, value, frozenset(id(x) for x in nodes if id(x) in factors),
                                     c.parsed)
            except Unprovable as e:
                m.fail(b, nodes[-1].name if nodes else value, f"layout {c.parsed.text!r}: {e}",
                       weak=isinstance(e, RankMismatch) or n < len(chain))  # the longest chain says most
                continue
            b2 = _unify_atoms(m, proof.atoms, b, nodes[-1].name if nodes else value, c.parsed.text)
            if b2 is None:
                continue
        for x in nodes:
            b2 = b2.take(x)
        if nodes:
            b2 = dataclasses.replace(b2, chained=b2.chained | {id(x) for x in nodes})
        if "scale" in c.facts:
            b2 = b2.with_fact(c.facts["scale"], math.prod(factors.get(id(x), 1.0) for x in nodes))
        yield from m.expr(c.arg, src, b2, nodes[-1] if nodes else consumer)


def _unify_atoms(m, atoms: dict[str, int | str], b, where: str, text: str):
    """The binding with the proof's axis sizes (a number, or the symbolic dim), None where one differs from
    what an earlier line found (two symbols shape inference made up may be one dim; two declared ones not)."""
    dims = dict(b.dims)
    declared = m.graph.model.input_dim_names
    for a, size in atoms.items():
        old = dims.get(a)
        if old is None:
            dims[a] = size
        elif old != size and not (isinstance(old, str) and isinstance(size, str)
                                  and not (old in declared and size in declared)):
            m.fail(b, where, f"layout {text!r}: axis {a} is {size} here, {old} in an earlier line")
            return None
    return b.with_dims(dims)


LAYOUT = ConceptKind("layout", parse, match, (
    ('`layout(x, "b s (n d) -> b n s d")`', "any chain of Reshape / Transpose / Squeeze / Unsqueeze / Flatten / "
     "Identity from `x` whose element map is this einops-style rearrangement (groups in parentheses are merged "
     "axes); the longest such chain is tried first"),
    ('`layout(x, "...", scale=S)`', "the same, with Mul / Div by a scalar anywhere on the way; `S` is the product "
     "of the factors (1 when there is none)"),
))
SCALED = ConceptKind("scaled", parse, match, (
    ("`scaled(x, scale=S)`", "zero or more Mul / Div by a scalar after `x`; `S` their product"),
))
