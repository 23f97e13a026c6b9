"""The matcher: backtracking over alternatives and commutative operand orders, constraints checked while
matching (a failure backtracks into the next alternative), and a record of why the best attempt failed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..ir import Graph, Node
from ..opschema import attr_value, op_spec
from ..patterns.functions import REGION_OPS
from ..patterns.layouts import LAYOUT_OPS, Layout
from ..patterns.rules import Constraint, Rule
from ..patterns.syntax import Alt, Call, Concept, Expr, Ref
from ..tensors import dtype_name
from .algebra import RankMismatch, Unprovable, prove_layout, scalar_factor
from .causal import prove_causal, prove_rows_keep_a_key
from .functions import FUNCTIONS, Region, regions

ABSENT = ""
DERIVED = "\x00mask:"  # the value name of a mask the rewrite builds (Binding.derived)
_CONST_CHUNK = 1 << 20  # elements of a constant compared at a time (Matcher._const_ok)
# Ops that compute shapes and indices; a chain of them that only feeds a match is removed with it.
SHAPE_ARITHMETIC = frozenset({"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Size",
                              "Reshape", "Add", "Sub", "Mul", "Div", "Constant", "Identity", "Equal", "Where",
                              "ConstantOfShape", "Expand", "Range", "Sqrt", "Reciprocal"})


MASK_MIN = -1e30  # a Where fill at most this (or -inf) makes Where(c, x, fill) the additive mask x + Where(c, 0, fill)
# A finite fill at most this (GPT-2's -10000) is one too where every query row is proved to keep a key: the masked
# scores' exp(fill + x - max) and exp(fill - max) are then both 0 in float32 while the open scores lie within
# 9,896 of each other and above -9,896 (exp underflows below -104); validation checks the model's own numbers.
SOFT_MASK_MIN = -1e4
MAX_MASK_TERMS = 6


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


@dataclass(frozen=True)
class Binding:
    """One (partial) match: names to value names, lines to nodes, every node taken, unified dims."""

    values: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    matched: tuple[Node, ...] = ()
    dims: dict[str, int | str] = field(default_factory=dict)
    side: tuple[Node, ...] = ()  # outside readers that only feed the match (shape arithmetic): die with it
    kept: tuple[Node, ...] = ()  # nodes of shared lines: checked, not removed
    facts: dict[str, float] = field(default_factory=dict)  # what concepts proved (scale=S: the factor)
    chained: frozenset[int] = frozenset()  # ids of the nodes a concept's chain took (data movement, factors)
    derived: dict[str, MaskSum] = field(default_factory=dict)  # values the rewrite builds first (masked's sum)

    def bind(self, name: str, value: str, node: Node | None = None) -> Binding:
        nodes = self.nodes if node is None else {**self.nodes, name: node}
        return dataclasses.replace(self, values={**self.values, name: value}, nodes=nodes)

    def take(self, node: Node) -> Binding:
        return dataclasses.replace(self, matched=self.matched + (node,))

    def with_dims(self, dims: dict[str, int | str]) -> Binding:
        return dataclasses.replace(self, dims=dims)

    def with_side(self, side: tuple[Node, ...]) -> Binding:
        return dataclasses.replace(self, side=side)

    def with_fact(self, name: str, value: float) -> Binding:
        return dataclasses.replace(self, facts={**self.facts, name: value})

    def keep_since(self, n: int) -> Binding:
        """Move the nodes taken after the first `n` from `matched` to `kept` (a shared line's nodes)."""
        return dataclasses.replace(self, matched=self.matched[:n], kept=self.kept + self.matched[n:])


@dataclass(frozen=True)
class Failure:
    """Why the most advanced attempt at one candidate failed."""

    progress: int  # nodes matched when it failed
    node: str  # node (or value) where it failed
    reason: str
    complete: bool = False  # a complete match the final checks refused (outranks equal progress)
    bound: int = 0  # names bound when it failed: progress + bound is how far into the pattern it got
    weak: bool = False  # a layout of another rank than the chain's: a stronger reason as far along outranks it


def _fmt(v: np.ndarray) -> str:
    flat = np.asarray(v).reshape(-1)
    if flat.size == 1:
        return f"{float(flat[0]):.6g}"
    head = ", ".join(f"{float(x):.4g}" for x in flat[:4])
    return f"[{head}{', ...' if flat.size > 4 else ''}]"


def _rank(graph: Graph, value: str) -> int | None:
    t = graph.type_of(value)
    return None if t is None or t.shape is None else len(t.shape)


def _same_attr(actual: object, wanted: object) -> bool:
    if isinstance(wanted, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(wanted):
            return False
        return all(_same_attr(a, w) for a, w in zip(actual, wanted, strict=True))
    if isinstance(wanted, float) or isinstance(actual, float):
        try:
            return abs(float(actual) - float(wanted)) <= 1e-6 * max(1.0, abs(float(wanted)))
        except (TypeError, ValueError):
            return False
    return actual == wanted


def _dim_conflict(pattern: tuple[int | str, ...], shape: tuple[int | str | None, ...] | None,
                  dims: dict[str, int | str]) -> str | None:
    """Which dim of `shape` the pattern's names do not take, in words (the concept of the failed constraint: the
    sequence length of one value against another's), or None where the rank or an unknown dim is the reason."""
    if shape is None or len(shape) != len(pattern):
        return None
    for p, d in zip(pattern, shape, strict=True):
        if isinstance(p, str) and p != "_" and p in dims and dims[p] != d and d is not None:
            old = dims[p]
            if isinstance(old, int) != isinstance(d, int):
                return (f"{p} is {d!r} here, {old!r} where it was bound first (a dim shape inference named is not "
                        "proved equal to a number)")
            return f"{p} is {d!r} here, {old!r} where it was bound first"
    return None


class Matcher:
    """Matches one rule against candidate root nodes of one graph."""

    def __init__(self, rule: Rule, graph: Graph) -> None:
        self.rule = rule
        self.graph = graph
        self.best: Failure | None = None
        self.exposed = rule.exposed
        self.read = rule.read_names
        # computes(...): the regions found at a value, and why each other candidate was not one
        self._regions: dict[tuple[str, str, bool], tuple[list[Region], list[tuple[str, str, tuple[Node, ...]]]]] = {}
        # masked(..., causal=True): per (terms, scores), '' where proved, else why not (a split is tried once per
        # alternative of the lines around it)
        self._causal: dict[tuple, str] = {}

    # ----- entry -----------------------------------------------------------------------------------------
    def match(self, root: Node) -> Binding | None:
        self.best = None
        if not root.proto.output or not root.proto.output[0]:
            return None
        for b in self._line(self.rule.root, root.proto.output[0], Binding()):
            final = self._final(b)
            if final is not None:
                return final
        return None

    def _fail(self, b: Binding, where: str, reason: str, complete: bool = False, weak: bool = False) -> None:
        """Remember the most advanced failure; a complete match refused by the final checks (an interior value
        read outside) outranks a later attempt that took as many nodes, so `explain` names the real obstacle."""
        rank = (len(b.matched) + len(b.values), complete, not weak)  # how far into the pattern, then how telling
        best = self.best
        if best is None or rank >= (best.progress + best.bound, best.complete, not best.weak):
            self.best = Failure(len(b.matched), where, reason, complete, len(b.values), weak)

    # ----- lines and expressions -----------------------------------------------------------------------
    def _line(self, name: str, value: str, b: Binding) -> Iterator[Binding]:
        if name in b.values:
            if b.values[name] == value:
                yield b
            else:
                self._fail(b, value, f"line {name!r} is already bound to {b.values[name]!r}")
            return
        node = self.graph.producer.get(value)
        if node is None:
            self._fail(b, value, f"{value!r} is not produced by a node (graph input or initializer)")
            return
        head, idx = self.rule.outputs_of.get(name, (name, 0))
        if head != name or idx != 0:  # an output of a multi-output line: match the node through its head
            if idx >= len(node.outputs) or node.outputs[idx] != value:
                self._fail(b, node.name, f"{value!r} is not output {idx} of {node.op_type} (line {name!r})")
                return
            b2 = self._constrain(name, value, b, node)
            if b2 is None:
                return
            for b3 in self._line(head, node.outputs[0], b2):
                yield b3.bind(name, value, node)
            return
        con = self.rule.where.get(name)
        if con is not None:
            spec = op_spec(node.domain, node.op_type, self.graph.model.opset if node.domain == "" else None)
            for k, wanted in con.attrs.items():
                actual = attr_value(node.proto, k, spec)
                if actual is None and (spec is None or k not in spec.attrs):
                    continue  # the op version in this model has no such attribute: nothing to check
                if not _same_attr(actual, wanted):
                    self._fail(b, node.name, f"{node.op_type} {k}={actual!r}, rule needs {wanted!r}")
                    return
            b2 = self._constrain(name, value, b, node)
            if b2 is None:
                return
            b = b2
        names = self.rule.outputs_named(name)
        if len(names) > 1 and len(node.outputs) != len(names):
            self._fail(b, node.name, f"{node.op_type} has {len(node.outputs)} outputs, line {name!r} names "
                                     f"{len(names)}")
            return
        shared = con is not None and con.shared
        n0 = len(b.matched)
        for b2 in self._expr(self.rule.lines[name], value, b, None):
            b3: Binding | None = (b2.keep_since(n0) if shared else b2).bind(name, value, node)
            for other, out in zip(names[1:], node.outputs[1:], strict=True):  # the line's other outputs
                if b3 is None or other in b3.values:
                    continue
                b3 = self._constrain(other, out, b3, node)
                b3 = None if b3 is None else b3.bind(other, out, node)
            if b3 is not None:
                yield b3

    def _expr(self, e: Expr, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        if isinstance(e, Alt):
            for option in e.options:
                yield from self._expr(option, value, b, consumer)
        elif isinstance(e, Call):
            yield from self._call(e, value, b)
        elif isinstance(e, Concept):
            yield from self._concept(e, value, b, consumer)
        elif e.name == "_":
            yield b
        elif e.name in self.rule.lines:
            if value == ABSENT:
                self._fail(b, consumer.name if consumer else "?", f"input for line {e.name!r} is absent")
            else:
                yield from self._line(e.name, value, b)
        else:
            yield from self._value(e, value, b, consumer)

    def _value(self, ref: Ref, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        name = ref.name
        if name in b.values:
            if b.values[name] == value:
                yield b
            else:
                self._fail(b, value, f"{name} must be the same value in both places "
                                     f"({b.values[name]!r} vs {value!r})")
            return
        if value == ABSENT:
            if ref.optional:
                yield b.bind(name, ABSENT)
            else:
                self._fail(b, consumer.name if consumer else "?", f"input {name} is absent")
            return
        b2 = self._constrain(name, value, b, consumer)
        if b2 is not None:
            yield b2.bind(name, value)

    def _call(self, call: Call, value: str, b: Binding) -> Iterator[Binding]:
        g = self.graph
        node = g.producer.get(value)
        if node is None:
            self._fail(b, value, f"{value!r} is a graph input or constant, expected {call.qualified}")
            return
        if node.op_type != call.op or node.domain != call.domain:  # weak: another alternative's reason on the op
            self._fail(b, node.name, f"found {node.op_type}, expected {call.qualified}", weak=True)  # says more
            return
        if node in b.matched:
            self._fail(b, node.name, f"{node.op_type} is already part of this match")
            return
        if node.proto.output[0] != value:
            self._fail(b, node.name, f"uses output {list(node.proto.output).index(value)} of {node.op_type}, "
                                     "expected 0")
            return
        spec = op_spec(node.domain, node.op_type, g.model.opset if node.domain == "" else None)
        for k, wanted in call.lits.items():
            actual = attr_value(node.proto, k, spec)
            if not _same_attr(actual, wanted):
                self._fail(b, node.name, f"{node.op_type} {k}={actual!r}, rule needs {wanted!r}")
                return
        inputs = list(node.proto.input)
        while inputs and inputs[-1] == ABSENT:
            inputs.pop()
        required = sum(1 for a in call.args if not (isinstance(a, Ref) and a.optional))
        if len(inputs) < required or len(inputs) > len(call.args):
            self._fail(b, node.name, f"{node.op_type} has {len(inputs)} inputs, rule expects "
                                     f"{required}" + (f"-{len(call.args)}" if required != len(call.args) else ""))
            return
        inputs = inputs + [ABSENT] * (len(call.args) - len(inputs))
        b = b.take(node)
        orders = [inputs]
        if spec is not None and spec.commutative and len(call.args) == 2 and inputs[0] != inputs[1]:
            orders.append([inputs[1], inputs[0]])
        for order in orders:
            yield from self._args(call.args, order, 0, b, node)

    # ----- concepts ---------------------------------------------------------------------------------------
    def _concept(self, c: Concept, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        if c.name == "masked":
            yield from self._masked(c, value, b, consumer)
        elif c.name == "computes":
            yield from self._computes(c, value, b)
        else:
            yield from self._moved(c, value, b, consumer)

    def _computes(self, c: Concept, value: str, b: Binding) -> Iterator[Binding]:
        """`computes(x, "gelu")`: a region of elementwise and normalizing ops from one source to `value` that
        computes the function of it (match/functions.py), the nearest source first; `x` is matched at the source
        and eps= binds the number the region adds."""
        assert c.function is not None
        # At the root of an attempt, a value that only region ops read is a part of a longer chain: that a part
        # computes something else is no near miss (the chain's end is the candidate to explain).
        readers = self.graph.consumers.get(value, [])
        inner = not b.matched and value not in self.graph.graph_outputs and bool(readers) and all(
            n.domain == "" and n.op_type in REGION_OPS for n in readers)
        key = (value, c.function, inner)
        hit = self._regions.get(key)
        if hit is None or any(not n.alive for r in hit[0] for n in r.nodes):  # (a rewrite took some: found again)
            reasons: list[tuple[str, str, tuple[Node, ...]]] = []
            hit = (list(regions(self.graph, value, FUNCTIONS[c.function], set(),
                                lambda node, why, nodes: reasons.append((node, why, nodes)), inner)), reasons)
            self._regions[key] = hit
        found, reasons = hit
        for node, why, nodes in reasons:  # a region that was run counts as that far along
            self._fail(dataclasses.replace(b, matched=b.matched + nodes), node, why)
        taken = {id(n) for n in b.matched}
        for r in found:
            if any(id(n) in taken for n in r.nodes):
                self._fail(b, r.nodes[-1].name, f"computes {c.function!r}: its ops are already part of this match")
                continue
            b2 = b
            for x in reversed(r.nodes):
                b2 = b2.take(x)
            # (not `chained`: a region's value read outside fails the match, it is not computed twice)
            if "eps" in c.facts:
                b2 = b2.with_fact(c.facts["eps"], r.eps)
            yield from self._expr(c.arg, r.source, b2, r.reader)

    def _masked(self, c: Concept, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        """`masked(x, M)`: from `value` back through additive terms (Add of a value that leaves the shape as it
        is, Where(c, x, MIN) with MIN -inf or at most -1e30) to where `x` matches; M is their sum (absent with no
        term). Every split is tried, the most terms first."""
        assert c.bias is not None
        t = self.graph.type_of(value)
        elem = t.elem_type if t is not None else 0
        refused: list[tuple[str, str, str]] = []  # (node, why, its value): a Where that is no mask, told last
        reached: dict[str, Binding] = {}  # the split that went furthest before each start value
        for start, terms, nodes in self._mask_terms(value, b, 0, refused):
            b2 = b
            for x in nodes:
                b2 = b2.take(x)
            if len(b2.matched) >= len(reached.get(start, b).matched):
                reached[start] = b2
            if nodes:
                b2 = dataclasses.replace(b2, chained=b2.chained | {id(x) for x in nodes})
            if c.bias in b2.values:
                self._fail(b2, value, f"mask {c.bias} is bound twice")
                continue
            if c.causal:
                why = self._causal_proof(terms, value)
                if why:
                    self._fail(b2, value, f"masked: {why}")
                    continue
            rows, lead = None, 0
            if c.rows and terms:
                rank, full = self._mask_rows(terms, value)
                rows, lead = (None, 4 - rank) if full else (c.rows, 0)
            if not terms:
                b2 = b2.bind(c.bias, ABSENT)
            elif len(terms) == 1 and terms[0].where is None and rows is None and not lead:
                b3 = self._constrain(c.bias, terms[0].value, b2, nodes[0])
                if b3 is None:
                    continue
                b2 = b3.bind(c.bias, terms[0].value)
            else:
                b2 = dataclasses.replace(b2.bind(c.bias, f"{DERIVED}{c.bias}"),
                                         derived={**b2.derived, c.bias: MaskSum(elem, tuple(terms), rows, lead)})
            yield from self._expr(c.arg, start, b2, nodes[-1] if nodes else consumer)
        for where, why, out in refused:  # the telling reason ("found Where, expected MatMul" says less), as far
            at = reached.get(out, b)  # along as the split that reached the Where
            self._fail(at.bind(c.bias, ABSENT) if c.bias not in at.values else at, where, why)

    def _soft_fill(self, f: float, fill: str, cond: str, first: bool, scores: str) -> str:
        """'' where the finite fill `f` of Where(cond, x, fill) masks as -inf would (SOFT_MASK_MIN), else why not."""
        if f > SOFT_MASK_MIN:
            return "not -inf or at most -1e30, nor at most -1e4 with every query row keeping a key"
        try:
            prove_rows_keep_a_key(self.graph, [(fill, cond, first)], scores, f)
        except Unprovable as e:
            return f"a finite fill masks only where every query row keeps a key, and {e}"
        return ""

    def _causal_proof(self, terms: list[MaskTerm], scores: str) -> str:
        """'' where the mask of `terms` is proved causal on `scores` (match/causal.py), else why not."""
        key = (tuple(terms), scores)
        if key not in self._causal:
            try:
                prove_causal(self.graph, [(t.value, t.where, t.fill_first) for t in terms], scores)
                self._causal[key] = ""
            except Unprovable as e:
                self._causal[key] = str(e)
        return self._causal[key]

    def _mask_terms(self, value: str, b: Binding, depth: int,
                    refused: list[tuple[str, str, str]]) -> Iterator[tuple[str, list[MaskTerm], list[Node]]]:
        """(where x starts, the terms added to it, innermost first, the nodes that add them) for each way to
        read `value` as x plus terms; the longest first, `value` itself (no term) last."""
        g = self.graph
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
                    why = "" if f <= MASK_MIN else self._soft_fill(f, fill, ins[0], first, value)
                    if not why:
                        splits.append((x, MaskTerm(fill, ins[0], first)))
                    else:
                        refused.append((node.name, f"masked: the Where fill {_fmt(v)} is not a mask minimum: "
                                                   f"{why}, so Where is not an additive mask", value))
            for x, term in splits:
                if not self._keeps_shape(value, x):
                    continue
                for start, terms, nodes in self._mask_terms(x, b, depth + 1, refused):
                    yield start, terms + [term], nodes + [node]
        yield value, [], []

    def _mask_rows(self, terms: list[MaskTerm], scores: str) -> tuple[int, bool]:
        """(the rank of the terms' sum, whether it has every query row of the scores: their dim -2 the same
        number, or two symbols, which shape inference often makes up twice for one dim, but not two the model
        declares for its inputs). Unknown shapes have no rows for sure: the sum is then expanded."""
        g = self.graph
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

    def _keeps_shape(self, out: str, x: str) -> bool:
        """Whether adding a term to `x` gave `out` x's shape (the term broadcasts into it, never widens it)."""
        to, tx = self.graph.type_of(out), self.graph.type_of(x)
        if to is None or tx is None or to.shape is None or tx.shape is None:
            return True
        if len(to.shape) != len(tx.shape):
            return False
        return all(not (isinstance(a, int) and isinstance(c, int)) or a == c for a, c in zip(to.shape, tx.shape, strict=True))

    def _moved(self, c: Concept, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        """Walk back from `value` through data movement (layout) and scalar factors (scale=), then match the
        argument where the chain starts: the longest chain first. Each start is proved to be the concept
        (match/algebra.py); a failure says why in the concept's terms."""
        g = self.graph
        moves = c.name == "layout"
        scales = "scale" in c.facts
        chain: list[Node] = []
        factors: dict[int, float] = {}
        starts = [(value, 0)]
        cur = value
        while len(chain) < 24:
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
        for src, n in reversed(starts):
            nodes = chain[:n]
            b2 = b
            if moves:
                assert isinstance(c.parsed, Layout)
                try:
                    proof = prove_layout(g, src, value, frozenset(id(x) for x in nodes if id(x) in factors), c.parsed)
                except Unprovable as e:
                    self._fail(b, nodes[-1].name if nodes else value, f"layout {c.parsed.text!r}: {e}",
                               weak=isinstance(e, RankMismatch) or n < len(chain))  # the longest chain says most
                    continue
                b2 = self._unify_atoms(proof.atoms, b, nodes[-1].name if nodes else value, c.parsed.text)
                if b2 is None:
                    continue
            for x in nodes:
                b2 = b2.take(x)
            if nodes:
                b2 = dataclasses.replace(b2, chained=b2.chained | {id(x) for x in nodes})
            if scales:
                b2 = b2.with_fact(c.facts["scale"], math.prod(factors.get(id(x), 1.0) for x in nodes))
            yield from self._expr(c.arg, src, b2, nodes[-1] if nodes else consumer)

    def _unify_atoms(self, atoms: dict[str, int | str], b: Binding, where: str, text: str) -> Binding | None:
        dims = dict(b.dims)
        declared = self.graph.model.input_dim_names
        for a, size in atoms.items():
            old = dims.get(a)
            if old is None:
                dims[a] = size
            elif old != size and not (isinstance(old, str) and isinstance(size, str)
                                      and not (old in declared and size in declared)):
                self._fail(b, where, f"layout {text!r}: axis {a} is {size} here, {old} in an earlier line")
                return None
        return b.with_dims(dims)

    def _args(self, args: list[Expr], values: list[str], i: int, b: Binding, node: Node) -> Iterator[Binding]:
        if i == len(args):
            yield b
            return
        for b2 in self._expr(args[i], values[i], b, node):
            yield from self._args(args, values, i + 1, b2, node)

    # ----- constraints -----------------------------------------------------------------------------------
    def _constrain(self, name: str, value: str, b: Binding, consumer: Node | None) -> Binding | None:
        """`b` with the `where` constraints of `name` checked on `value` (None when they fail)."""
        con = self.rule.where.get(name)
        return b if con is None else self._check_value(name, value, con, b, consumer)

    def _check_value(self, name: str, value: str, con: Constraint, b: Binding,
                     consumer: Node | None) -> Binding | None:
        g = self.graph
        if con.constant is not None and g.is_constant(value) != con.constant:
            self._fail(b, value, f"{name} ({value!r}) is {'not ' if con.constant else ''}a constant")
            return None
        if con.const is not None:
            t = g.type_of(value)
            size = None if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape) else \
                int(np.prod(t.shape, dtype=np.int64))
            if size is not None and size > _CONST_CHUNK and con.const.size > 1 and size != con.const.size:
                self._fail(b, value, f"{name}: const of {size} elements not within tolerance of {_fmt(con.const)}")
                return None
            v = g.const_value(value, keep=size is None or size <= _CONST_CHUNK)  # a big weight is not held
            if v is None:
                self._fail(b, value, f"{name} ({value!r}) is not a constant, rule needs {_fmt(con.const)}")
                return None
            if not self._const_ok(v, con):
                self._fail(b, value, f"{name}: const {_fmt(v)} not within tolerance of {_fmt(con.const)} "
                                     f"(rtol {con.rtol:g}, atol {con.atol:g})")
                return None
            if consumer is not None and v.ndim > 0:
                out_t = g.type_of(consumer.outputs[0])
                out_rank = out_t.rank if out_t is not None else None
                if out_rank is None or v.ndim > out_rank:
                    self._fail(b, value, f"{name}: constant of shape {list(v.shape)} could change the "
                                         f"output's rank ({out_rank if out_rank is not None else 'unknown'})")
                    return None
        if con.dtype is None and con.rank is None and con.shape is None:
            return b
        t = g.type_of(value)
        if con.dtype is not None:
            if t is None or t.elem_type not in con.dtype:
                have = t.dtype_name if t is not None else "unknown"
                self._fail(b, value, f"{name} has dtype {have}, rule allows "
                                     f"{', '.join(dtype_name(d) for d in con.dtype)}")
                return None
        if con.rank is not None and (t is None or t.rank not in con.rank):
            self._fail(b, value, f"{name} has rank {t.rank if t else 'unknown'}, rule allows "
                                 f"{', '.join(map(str, con.rank))}")
            return None
        if con.shape is not None:
            shape = t.shape if t is not None else None
            for alt in con.shape:
                dims = self._unify(alt, shape, b.dims, self.graph.model.input_dim_names, self.rule.atoms)
                if dims is not None:
                    return b.with_dims(dims)
            why = _dim_conflict(con.shape[0], shape, b.dims) if len(con.shape) == 1 else None
            self._fail(b, value, f"{name} has shape {list(shape) if shape is not None else 'unknown'}, rule needs "
                                 + " or ".join(str(list(a)) for a in con.shape) + (f": {why}" if why else ""))
            return None
        return b

    @staticmethod
    def _const_ok(v: np.ndarray, con: Constraint) -> bool:
        assert con.const is not None
        v = np.asarray(v)
        wanted = np.asarray(con.const, dtype=np.float64).reshape(-1)
        if v.size == 0 or (wanted.size != 1 and v.size != wanted.size):
            return False
        flat = v.reshape(-1)
        # the first element alone first, then in chunks: a big weight is never copied whole as float64 (a 128 MB
        # constant compared with a scalar took 2.8 s and 1 GB of temporaries)
        for lo, hi in [(0, 1)] + [(k, min(k + _CONST_CHUNK, flat.size)) for k in range(1, flat.size, _CONST_CHUNK)]:
            try:
                actual = flat[lo:hi].astype(np.float64)
            except (TypeError, ValueError):
                return False
            want = wanted if wanted.size == 1 else wanted[lo:hi]
            if not bool(np.all(np.abs(actual - want) <= con.atol + con.rtol * np.abs(want))):
                return False
        return True

    @staticmethod
    def _unify(pattern: tuple[int | str, ...], shape: tuple[int | str | None, ...] | None,
               dims: dict[str, int | str], declared: frozenset[str] = frozenset(),
               proven: frozenset[str] = frozenset()) -> dict[str, int | str] | None:
        """Bind the pattern's dim names to the value's dims. Two different symbols are taken as equal (shape
        inference often names one run-time dim twice), except two the model declares on its inputs: those are
        the user's own names for dims that may differ ([batch, seq, k] + [batch, one, k] broadcasts). A layout
        axis (`proven`) whose number a layout proof found also equals a dim shape inference made up."""
        if shape is None or len(shape) != len(pattern):
            return None
        out = dict(dims)
        for p, d in zip(pattern, shape, strict=True):
            if p == "_":
                continue
            if isinstance(p, int):
                if d != p:
                    return None
            elif d is None:
                return None
            elif p in out:
                if out[p] != d and not (isinstance(out[p], str) and isinstance(d, str)
                                        and not (out[p] in declared and d in declared)) \
                        and not (p in proven and isinstance(out[p], int) and isinstance(d, str) and d not in declared):
                    return None  # literal dims must agree, a symbol never equals a literal
            else:
                out[p] = d
        return out

    # ----- whole-match checks ----------------------------------------------------------------------------
    def _final(self, b: Binding) -> Binding | None:
        g = self.graph
        kept = self._keep_read_chains(b)
        if kept is None:
            return None
        b = kept
        line_of = {id(n): self.rule.head(name) for name, n in b.nodes.items()}
        exposed = {b.values[n] for n in self.exposed if n in b.values}  # outputs the rewrite re-creates
        taken = {id(n) for n in b.matched}
        if exposed:
            loop = self._reads_its_own_output(b, exposed, taken)
            if loop is not None:
                self._fail(b, loop, f"{loop!r}, which the rewrite reads, is computed from a value the rewrite "
                           "re-creates: the rewrite would read its own output (the mask or a shape reads the "
                           "present key or value)", complete=True)
                return None
        side: dict[int, Node] = {}
        for node in b.matched:
            line = line_of.get(id(node))
            for out in node.outputs:
                if not out or out in exposed:
                    continue
                label = f"{node.op_type} {node.name!r}" + (f" (line {line})" if line else "")
                if g.is_graph_output(out):
                    self._fail(b, node.name, f"{label}: its output {out!r} is a graph output", complete=True)
                    return None
                outside = [c for c in g.consumers.get(out, ()) if id(c) not in taken]
                if outside and not self._feeds_only_match(outside, taken, side, self._read_values(b)):
                    names = ", ".join(sorted({f"{c.op_type} {c.name!r}" for c in outside})[:3])
                    self._fail(b, node.name, f"{label} has {len(outside)} consumer(s) outside the match ({names})",
                               complete=True)
                    return None
        return b.with_side(tuple(side.values())) if side else b

    def _keep_read_chains(self, b: Binding) -> Binding | None:
        """A concept's data movement whose value is also read outside the match (T5 reads the key heads'
        length for its position bias) is kept for that reader, with every matched node it is computed from
        (the key projection): checked, not removed, like a shared line's nodes. None (the match fails) where that
        would keep a node whose value the rewrite re-creates: its reader would then depend on the rewrite's
        own output (a mask that reads the length of repeated keys that a GroupQueryAttention's present feeds)."""
        if not b.chained:
            return b
        taken = {id(n) for n in b.matched}
        exposed = {b.values[n] for n in self.exposed if n in b.values}  # re-created by the rewrite
        by_out = {o: n for n in b.matched for o in n.outputs if o}
        keep: dict[int, Node] = {}
        for node in b.matched:
            if id(node) not in b.chained or id(node) in keep:
                continue
            outs = [o for o in node.outputs if o and o not in exposed]
            outside = [c for o in outs for c in self.graph.consumers.get(o, ()) if id(c) not in taken]
            read = any(self.graph.is_graph_output(o) for o in outs) or bool(outside) and not self._feeds_only_match(
                outside, taken, {}, self._read_values(b))
            stack = [node] if read else []
            while stack:
                n = stack.pop()
                if id(n) in keep:
                    continue
                keep[id(n)] = n
                stack.extend(by_out[i] for i in n.inputs if i in by_out)
        if not keep:
            return b
        again = next((n for n in keep.values() if any(o in exposed for o in n.outputs)), None)
        if again is not None:
            self._fail(b, again.name, f"{again.op_type} {again.name!r} is re-created by the rewrite, but a chain "
                       "read outside the match is computed from it (its reader would read the rewrite's own output)",
                       complete=True)
            return None
        return dataclasses.replace(b, matched=tuple(n for n in b.matched if id(n) not in keep),
                                   kept=b.kept + tuple(keep.values()))

    def _reads_its_own_output(self, b: Binding, exposed: set[str], taken: set[int]) -> str | None:
        """A value the rewrite reads that is computed (outside the match) from a value the rewrite re-creates:
        the rewrite would then depend on its own output (a cycle). The read value, or None. Walked forward from
        the re-created values (a cache's present: a few shape readers), not back through the reads' cones."""
        g = self.graph
        reads = self._read_values(b)
        stack, seen = [v for v in exposed], set(exposed)
        while stack and len(seen) < 4096:
            for node in g.consumers.get(stack.pop(), ()):
                if id(node) in taken:
                    continue
                for out in node.outputs:
                    if out in reads:
                        return out
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
        return None

    def _read_values(self, b: Binding) -> set[str]:
        """The graph values the rewrite reads: bound names it reads, and the terms of a mask it builds."""
        out = {v for k, v in b.values.items() if k in self.read}
        for m in b.derived.values():
            out.update(v for t in m.terms for v in (t.value, t.where) if v)
        return out

    def _feeds_only_match(self, readers: list[Node], taken: set[int], side: dict[int, Node],
                          bound: set[str]) -> bool:
        """True when every reader is shape arithmetic (Shape, Gather, Unsqueeze, Concat, ...) whose results
        reach only matched nodes, and that computes no value the match bound (which the rewrite may read): it
        dies with the match, so it does not keep an interior value alive. Found nodes are added to `side`."""
        found: dict[int, Node] = {}
        stack = list(readers)
        while stack:
            n = stack.pop()
            if id(n) in taken or id(n) in found or id(n) in side:
                continue
            if n.op_type not in SHAPE_ARITHMETIC or n.domain != "" or len(found) >= 64:
                return False
            found[id(n)] = n
            for out in n.outputs:
                if not out:
                    continue
                if self.graph.is_graph_output(out) or out in bound:
                    return False  # the rewrite may read it
                stack.extend(self.graph.consumers.get(out, ()))
        side.update(found)
        return True
