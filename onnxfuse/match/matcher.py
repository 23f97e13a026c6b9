"""The matcher: backtracking over alternatives and commutative operand orders, constraints checked while
matching (a failure backtracks into the next alternative), and a record of why the best attempt failed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..concepts import CONCEPTS
from ..concepts.language import ABSENT
from ..concepts.masked import MaskSum
from ..ir import Graph, Node
from ..opschema import attr_value, op_spec
from ..patterns.rules import Rule
from ..patterns.syntax import Alt, Call, Concept, Expr, Ref
from .constraints import check_value

# Ops that compute shapes and indices; a chain of them that only feeds a match is removed with it.
SHAPE_ARITHMETIC = frozenset({"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Size",
                              "Reshape", "Add", "Sub", "Mul", "Div", "Constant", "Identity", "Equal", "Where",
                              "ConstantOfShape", "Expand", "Range", "Sqrt", "Reciprocal"})


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


class Matcher:
    """Matches one rule against candidate root nodes of one graph."""

    def __init__(self, rule: Rule, graph: Graph) -> None:
        self.rule = rule
        self.graph = graph
        self.best: Failure | None = None
        self.exposed = rule.exposed
        self.read = rule.read_names
        self._caches: dict[str, dict] = {}  # the concepts' memos (cache)

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

    def fail(self, b: Binding, where: str, reason: str, complete: bool = False, weak: bool = False) -> None:
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
                self.fail(b, value, f"line {name!r} is already bound to {b.values[name]!r}")
            return
        node = self.graph.producer.get(value)
        if node is None:
            self.fail(b, value, f"{value!r} is not produced by a node (graph input or initializer)")
            return
        head, idx = self.rule.outputs_of.get(name, (name, 0))
        if head != name or idx != 0:  # an output of a multi-output line: match the node through its head
            if idx >= len(node.outputs) or node.outputs[idx] != value:
                self.fail(b, node.name, f"{value!r} is not output {idx} of {node.op_type} (line {name!r})")
                return
            b2 = self.constrain(name, value, b, node)
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
                    self.fail(b, node.name, f"{node.op_type} {k}={actual!r}, rule needs {wanted!r}")
                    return
            b2 = self.constrain(name, value, b, node)
            if b2 is None:
                return
            b = b2
        names = self.rule.outputs_named(name)
        if len(names) > 1 and len(node.outputs) != len(names):
            self.fail(b, node.name, f"{node.op_type} has {len(node.outputs)} outputs, line {name!r} names "
                      f"{len(names)}")
            return
        shared = con is not None and con.shared
        n0 = len(b.matched)
        for b2 in self.expr(self.rule.lines[name], value, b, None):
            b3: Binding | None = (b2.keep_since(n0) if shared else b2).bind(name, value, node)
            for other, out in zip(names[1:], node.outputs[1:], strict=True):  # the line's other outputs
                if b3 is None or other in b3.values:
                    continue
                b3 = self.constrain(other, out, b3, node)
                b3 = None if b3 is None else b3.bind(other, out, node)
            if b3 is not None:
                yield b3

    def expr(self, e: Expr, value: str, b: Binding, consumer: Node | None) -> Iterator[Binding]:
        if isinstance(e, Alt):
            for option in e.options:
                yield from self.expr(option, value, b, consumer)
        elif isinstance(e, Call):
            yield from self._call(e, value, b)
        elif isinstance(e, Concept):
            yield from CONCEPTS[e.name].match(self, e, value, b, consumer)
        elif e.name == "_":
            yield b
        elif e.name in self.rule.lines:
            if value == ABSENT:
                self.fail(b, consumer.name if consumer else "?", f"input for line {e.name!r} is absent")
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
                self.fail(b, value, f"{name} must be the same value in both places "
                          f"({b.values[name]!r} vs {value!r})")
            return
        if value == ABSENT:
            if ref.optional:
                yield b.bind(name, ABSENT)
            else:
                self.fail(b, consumer.name if consumer else "?", f"input {name} is absent")
            return
        b2 = self.constrain(name, value, b, consumer)
        if b2 is not None:
            yield b2.bind(name, value)

    def _call(self, call: Call, value: str, b: Binding) -> Iterator[Binding]:
        g = self.graph
        node = g.producer.get(value)
        if node is None:
            self.fail(b, value, f"{value!r} is a graph input or constant, expected {call.qualified}")
            return
        if node.op_type != call.op or node.domain != call.domain:  # weak: another alternative's reason on the op
            self.fail(b, node.name, f"found {node.op_type}, expected {call.qualified}", weak=True)  # says more
            return
        if node in b.matched:
            self.fail(b, node.name, f"{node.op_type} is already part of this match")
            return
        if node.proto.output[0] != value:
            self.fail(b, node.name, f"uses output {list(node.proto.output).index(value)} of {node.op_type}, "
                      "expected 0")
            return
        spec = op_spec(node.domain, node.op_type, g.model.opset if node.domain == "" else None)
        for k, wanted in call.lits.items():
            actual = attr_value(node.proto, k, spec)
            if not _same_attr(actual, wanted):
                self.fail(b, node.name, f"{node.op_type} {k}={actual!r}, rule needs {wanted!r}")
                return
        inputs = list(node.proto.input)
        while inputs and inputs[-1] == ABSENT:
            inputs.pop()
        required = sum(1 for a in call.args if not (isinstance(a, Ref) and a.optional))
        if len(inputs) < required or len(inputs) > len(call.args):
            self.fail(b, node.name, f"{node.op_type} has {len(inputs)} inputs, rule expects "
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
    def cache(self, name: str) -> dict:
        """A concept's memo for this matcher (the rule on this graph): what its proofs found, per question."""
        return self._caches.setdefault(name, {})

    def _args(self, args: list[Expr], values: list[str], i: int, b: Binding, node: Node) -> Iterator[Binding]:
        if i == len(args):
            yield b
            return
        for b2 in self.expr(args[i], values[i], b, node):
            yield from self._args(args, values, i + 1, b2, node)

    # ----- constraints -----------------------------------------------------------------------------------
    def constrain(self, name: str, value: str, b: Binding, consumer: Node | None) -> Binding | None:
        """`b` with the `where` constraints of `name` checked on `value` (None when they fail)."""
        con = self.rule.where.get(name)
        return b if con is None else check_value(self, name, value, con, b, consumer)

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
                self.fail(b, loop, f"{loop!r}, which the rewrite reads, is computed from a value the rewrite "
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
                    self.fail(b, node.name, f"{label}: its output {out!r} is a graph output", complete=True)
                    return None
                outside = [c for c in g.consumers.get(out, ()) if id(c) not in taken]
                if outside and not self._feeds_only_match(outside, taken, side, self._read_values(b)):
                    names = ", ".join(sorted({f"{c.op_type} {c.name!r}" for c in outside})[:3])
                    self.fail(b, node.name, f"{label} has {len(outside)} consumer(s) outside the match ({names})",
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
            self.fail(b, again.name, f"{again.op_type} {again.name!r} is re-created by the rewrite, but a chain "
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
