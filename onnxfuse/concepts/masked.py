"""The masked concept: `masked(x, M, rows=X, causal=True)` is `x` plus an additive mask in any spelling: zero or
more Add of a term and Where(c, x, MIN) (masked_fill), each leaving x's shape as it is. M binds the sum of the
terms: a graph value where one term is it, else a `MaskSum` the rewrite builds (rewrite/apply.py). With rows=,
M gets every query row (rank 4, as attention_bias takes it); with causal=True it is proved to mask every later
key (causal.py). Every split of the chain into x and terms is tried, the most terms first."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..ir import Node
from .causal import prove_causal, prove_rows_keep_a_key
from .language import ABSENT, DERIVED, Concept, ConceptKind, SyntaxProblem, offset_of, short, upper_name
from .shape_ops import Unprovable

__all__ = ["MASKED", "MASK_MIN", "SOFT_MASK_MIN", "MaskSum", "MaskTerm"]

MASK_MIN = -1e30  # a Where fill at most this (or -inf) makes Where(c, x, fill) the additive mask x + Where(c, 0, fill)
# A finite fill at most this (GPT-2's -10000) is one too where every query row is proved to keep a key: the masked
# scores' exp(fill + x - max) and exp(fill - max) are then both 0 in float32 while the open scores lie within
# 9,896 of each other and above -9,896 (exp underflows below -104); validation checks the model's own numbers.
SOFT_MASK_MIN = -1e4
MAX_MASK_TERMS = 6
USAGE = ("masked(x, M, rows=X, causal=True): x plus the additive mask M it binds, with every query row (X's dim -2 is "
         "their number), proved to mask every later key where causal=True, e.g. Softmax(masked(scores, M, rows=X), "
         "axis=-1)")


@dataclass(frozen=True)
class MaskTerm:
    """One additive term of a mask: a value added (`where` None), or Where(where, 0, fill) (`fill_first`:
    Where(where, fill, 0)), the additive form of Where(where, x, fill)."""

    value: str  # the added value, or the fill
    where: str | None = None
    fill_first: bool = False


@dataclass(frozen=True)
class MaskSum:
    """What `masked(x, M)` bound M to when no single graph value is it: the sum of its terms, in the scores'
    element type (an ONNX TensorProto type), expanded to every query row (rank 4) when `rows` names the value
    whose dim -2 is their number, or given `lead` leading axes (one with every row, of a lower rank); the
    rewrite builds it (rewrite/apply.py)."""

    elem_type: int
    terms: tuple[MaskTerm, ...]
    rows: str | None = None
    lead: int = 0  # leading axes to add (a mask with every row, of rank 4 - lead)


def parse(node: ast.Call, text: str, off: int, convert: Callable[[ast.expr], Any]) -> Concept:
    if len(node.args) != 2 or any(isinstance(a, ast.Starred) for a in node.args):
        raise SyntaxProblem(f"masked takes 2 arguments: {USAGE}", off)
    for kw in node.keywords:
        if kw.arg not in ("rows", "causal"):
            raise SyntaxProblem(f"masked has no parameter {kw.arg!r} (it has: rows, causal)", offset_of(kw.value, text))
    causal = next((kw.value for kw in node.keywords if kw.arg == "causal"), None)
    if causal is not None and not (isinstance(causal, ast.Constant) and isinstance(causal.value, bool)):
        raise SyntaxProblem(f"masked: causal= is True or False ({USAGE})", offset_of(causal, text))
    names = [upper_name(arg, text, f"masked: {what}, an UPPERCASE name ({USAGE})")
             for arg, what in ((node.args[1], "its second argument names the mask it binds"),
                               *((kw.value, "rows= names the value whose dim -2 is the query length")
                                 for kw in node.keywords if kw.arg == "rows"))]
    return Concept("masked", convert(node.args[0]), None, {}, off, bias=names[0],
                   rows=names[1] if len(names) > 1 else None, causal=bool(causal is not None and causal.value))


def match(m, c: Concept, value: str, b, consumer: Node | None) -> Iterator:
    """`masked(x, M)`: from `value` back through additive terms to where `x` matches; M is their sum (absent
    with no term)."""
    assert c.bias is not None
    t = m.graph.type_of(value)
    elem = t.elem_type if t is not None else 0
    refused: list[tuple[str, str, str]] = []  # (node, why, its value): a Where that is no mask, told last
    reached: dict[str, Any] = {}  # the split that went furthest before each start value
    for start, terms, nodes in _terms(m, value, b, 0, refused):
        b2 = b
        for x in nodes:
            b2 = b2.take(x)
        if len(b2.matched) >= len(reached.get(start, b).matched):
            reached[start] = b2
        if nodes:
            b2 = dataclasses.replace(b2, chained=b2.chained | {id(x) for x in nodes})
        if c.bias in b2.values:
            m.fail(b2, value, f"mask {c.bias} is bound twice")
            continue
        if c.causal:
            why = _causal_proof(m, terms, value)
            if why:
                m.fail(b2, value, f"masked: {why}")
                continue
        b2 = _bind_sum(m, c, terms, nodes, value, b2, elem)
        if b2 is not None:
            yield from m.expr(c.arg, start, b2, nodes[-1] if nodes else consumer)
    for where, why, out in refused:  # the telling reason ("found Where, expected MatMul" says less), as far
        at = reached.get(out, b)  # along as the split that reached the Where
        m.fail(at.bind(c.bias, ABSENT) if c.bias not in at.values else at, where, why)


def _bind_sum(m, c: Concept, terms: list[MaskTerm], nodes: list[Node], value: str, b, elem: int):
    """The binding with M: absent (no term), the one term's value, or the sum the rewrite builds."""
    rows, lead = None, 0
    if c.rows and terms:
        rank, full = _rows(m, terms, value)
        rows, lead = (None, 4 - rank) if full else (c.rows, 0)
    if not terms:
        return b.bind(c.bias, ABSENT)
    if len(terms) == 1 and terms[0].where is None and rows is None and not lead:
        b3 = m.constrain(c.bias, terms[0].value, b, nodes[0])
        return None if b3 is None else b3.bind(c.bias, terms[0].value)
    return dataclasses.replace(b.bind(c.bias, f"{DERIVED}{c.bias}"),
                               derived={**b.derived, c.bias: MaskSum(elem, tuple(terms), rows, lead)})


def _soft_fill(m, f: float, fill: str, cond: str, first: bool, scores: str) -> str:
    """'' where the finite fill `f` of Where(cond, x, fill) masks as -inf would (SOFT_MASK_MIN), else why not."""
    if f > SOFT_MASK_MIN:
        return "not -inf or at most -1e30, nor at most -1e4 with every query row keeping a key"
    try:
        prove_rows_keep_a_key(m.graph, [(fill, cond, first)], scores, f)
    except Unprovable as e:
        return f"a finite fill masks only where every query row keeps a key, and {e}"
    return ""


def _causal_proof(m, terms: list[MaskTerm], scores: str) -> str:
    """'' where the mask of `terms` is proved causal on `scores` (causal.py), else why not; once per matcher
    (a split is tried once per alternative of the lines around it)."""
    cache = m.cache("masked: causal")
    key = (tuple(terms), scores)
    if key not in cache:
        try:
            prove_causal(m.graph, [(t.value, t.where, t.fill_first) for t in terms], scores)
            cache[key] = ""
        except Unprovable as e:
            cache[key] = str(e)
    return cache[key]


def _terms(m, value: str, b, depth: int, refused: list[tuple[str, str, str]]
           ) -> Iterator[tuple[str, list[MaskTerm], list[Node]]]:
    """(where x starts, the terms added to it, innermost first, the nodes that add them) for each way to
    read `value` as x plus terms; the longest first, `value` itself (no term) last."""
    g = m.graph
    node = g.producer.get(value)
    if (node is not None and depth < MAX_MASK_TERMS and node not in b.matched and node.domain == ""
            and node.outputs[0] == value):
        ins = list(node.inputs)
        splits: list[tuple[str, MaskTerm]] = []
        if node.op_type == "Add" and len(ins) == 2:
            splits = [(ins[i], MaskTerm(ins[1 - i])) for i in (0, 1)] if ins[0] != ins[1] else []
        elif node.op_type == "Where" and len(ins) == 3:
            for x, fill, first in ((ins[1], ins[2], False), (ins[2], ins[1], True)):
                v = g.const_value(fill)
                if v is None or v.size != 1 or v.dtype.kind != "f":
                    continue
                f = float(v.reshape(-1)[0])
                why = "" if f <= MASK_MIN else _soft_fill(m, f, fill, ins[0], first, value)
                if not why:
                    splits.append((x, MaskTerm(fill, ins[0], first)))
                else:
                    refused.append((node.name, f"masked: the Where fill {short(v)} is not a mask minimum: "
                                               f"{why}, so Where is not an additive mask", value))
        for x, term in splits:
            if not _keeps_shape(m, value, x):
                continue
            for start, terms, nodes in _terms(m, x, b, depth + 1, refused):
                yield start, terms + [term], nodes + [node]
    yield value, [], []


def _rows(m, terms: list[MaskTerm], scores: str) -> tuple[int, bool]:
    """(the rank of the terms' sum, whether it has every query row of the scores: their dim -2 the same
    number, or two symbols, which shape inference often makes up twice for one dim, but not two the model
    declares for its inputs). Unknown shapes have no rows for sure: the sum is then expanded."""
    g = m.graph
    shapes = []
    for t in terms:
        for v in ((t.value,) if t.where is None else (t.where, t.value)):
            tt = g.type_of(v)
            if tt is None or tt.shape is None:
                return 0, False
            shapes.append(tt.shape)
    rank = max(len(sh) for sh in shapes)
    ts = g.type_of(scores)
    if ts is None or ts.shape is None or len(ts.shape) != 4 or rank > 4:
        return rank, False
    want, declared = ts.shape[-2], g.model.input_dim_names

    def same(r: int | str | None) -> bool:
        if isinstance(r, int) or isinstance(want, int):
            return r == want
        return r is not None and want is not None and (r == want or not (r in declared and want in declared))
    return rank, want == 1 or any(same(sh[-2]) for sh in shapes if len(sh) >= 2)


def _keeps_shape(m, out: str, x: str) -> bool:
    """Whether adding a term to `x` gave `out` x's shape (the term broadcasts into it, never widens it)."""
    to, tx = m.graph.type_of(out), m.graph.type_of(x)
    if to is None or tx is None or to.shape is None or tx.shape is None:
        return True
    if len(to.shape) != len(tx.shape):
        return False
    return all(not (isinstance(a, int) and isinstance(c, int)) or a == c for a, c in zip(to.shape, tx.shape, strict=True))


MASKED = ConceptKind("masked", parse, match, (
    ("`masked(x, M)`", "`x` plus an additive mask, in any spelling: zero or more Add of a term and Where(c, x, MIN) "
     "(masked_fill; MIN -inf or at most -1e30, whose additive form is Where(c, 0, MIN)), each leaving x's shape as "
     "it is; `M` is their sum (absent when there is none), which the rewrite builds where no single value is it"),
    ("`masked(x, M, rows=X)`", "the same, `M` rank 4 with every query row, as Attention's and MultiHeadAttention's "
     "attention_bias take it: expanded to [1, 1, s, 1] (s read at run time from X's dim -2) where it lacks them, "
     "given its leading axes (Unsqueeze, a view) where it has them at a lower rank, else as it is"),
    ("`masked(x, M, rows=X, causal=True)`", "the same, and `M` proved causal: it masks (-inf or at most -1e30) every "
     "key after the query's own position (with s query rows and t keys, each (i, j) with j > t - s + i), computed "
     "with numpy at two sets of sizes for the graph's symbolic dims, graph inputs of int or bool type taken as ones "
     "(an attention mask that keeps every token); a mask that reads a floating input (one the caller feeds) is not "
     "proved"),
))
