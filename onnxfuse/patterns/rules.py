"""Typed rules: what a YAML pattern file turns into once it has been checked."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np

from ..concepts.function_table import REGION_OPS
from ..concepts.layout_text import LAYOUT_OPS, MASK_OPS, SCALE_OPS
from ..targets import names
from .compute import CompiledExpr
from .syntax import Alt, Call, Concept, Expr, iter_concepts, iter_refs, layout_atoms, max_calls

TARGETS = names()  # a rule without `targets:` is for every registered target (its kernel facts decide)
# Rewrite ops whose output has the element type of their first input: an input read through them has that type.
SAME_TYPE_OPS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Expand",
                           "Identity", "Concat", "Split", "Gather", "Tile", "Pad"})


@dataclass(frozen=True)
class Span:
    file: str
    line: int  # 1-based
    col: int  # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def shifted(self, chars: int) -> Span:
        return Span(self.file, self.line, self.col + chars)


@dataclass(frozen=True)
class Diagnostic:
    span: Span
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        return f"{self.span}: error: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


@dataclass
class Constraint:
    """Conditions on a value (or on the output value and node of a match line)."""

    const: np.ndarray | None = None
    rtol: float = 1e-5
    atol: float = 1e-6
    constant: bool | None = None
    shared: bool = False  # match lines: checked, not removed, may have outside readers
    dtype: tuple[int, ...] | None = None
    rank: tuple[int, ...] | None = None
    shape: tuple[tuple[int | str, ...], ...] | None = None  # alternatives; str dims unify by name
    attrs: dict[str, object] = field(default_factory=dict)
    span: Span | None = None

    @property
    def needs_constant(self) -> bool:
        return self.const is not None or bool(self.constant)


@dataclass
class RewriteNode:
    outputs: list[str]  # names; "_" for an unused output slot
    call: Call | None  # None for an alias line (`Y: X`: uses of Y read X instead)
    attrs: dict[str, CompiledExpr]
    copy_attrs: str | None
    span: Span
    alias: str | None = None


@dataclass
class Rule:
    id: str
    doc: str
    file: str
    span: Span
    lines: dict[str, Expr]  # match lines in file order; the last one is the root
    line_spans: dict[str, Span]
    where: dict[str, Constraint]
    compute: dict[str, CompiledExpr]
    rewrite: list[RewriteNode]
    require: list[tuple[CompiledExpr, str]] = field(default_factory=list)  # (expr, source text)
    example: dict[str, list[list[int]]] = field(default_factory=dict)  # input shape alternatives (self-test)
    example_attrs: dict[tuple[str, str], object] = field(default_factory=dict)  # (line, attr) -> value
    outputs_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # multi-output line names
    targets: tuple[str, ...] = TARGETS
    declared: bool = False  # `targets:` given (else every registered target: each one's kernel facts decide)
    conditions: dict[str, list[tuple[CompiledExpr, str]]] = field(default_factory=dict)  # target -> extra require
    early: bool = False  # stage: early (canonicalisation before the fusion rules)
    measure: str = "region"  # measure: model (its benefit is non-local: decided on the whole model)
    expect: str = "unknown"  # expect: faster | neutral | unknown (the prior where measuring cannot decide)
    opset_min: int = 1
    opset_max: int = 10_000
    order: int = 0
    builtin: bool = False
    # a built-in rule naming an operator the installed onnx/onnxruntime does not define: why it cannot be used
    unavailable: str = ""

    @property
    def root(self) -> str:
        """The last match line (the first name of its node when that node has several outputs)."""
        return self.head(next(reversed(self.lines)))

    @property
    def size(self) -> int:
        return sum(max_calls(e) for n, e in self.lines.items() if self.head(n) == n)

    def head(self, name: str) -> str:
        """The line holding the expression: `name` itself, or the first name of its multi-output line."""
        return self.outputs_of.get(name, (name, 0))[0]

    def outputs_named(self, head: str) -> list[str]:
        """Every name of a multi-output line, in output order ([head] for a single-output line)."""
        named = sorted((i, n) for n, (h, i) in self.outputs_of.items() if h == head)
        return [n for _, n in named] or [head]

    def line_names(self) -> list[str]:
        """Match lines, one name per node (the first name of a multi-output line)."""
        return [n for n in self.lines if self.head(n) == n]

    @property
    def removes_only(self) -> bool:
        """Its rewrite makes no node (every line an alias: `Y: X`): each application only removes nodes, which
        measured selection keeps without timing (exact)."""
        return bool(self.rewrite) and all(rn.call is None for rn in self.rewrite)

    @property
    def exposed(self) -> set[str]:
        """Match lines whose values the rewrite re-creates (may have consumers outside the match)."""
        return {o for rn in self.rewrite for o in rn.outputs if o in self.lines}

    @property
    def read_names(self) -> set[str]:
        """Names whose values the rewrite reads: rewrite inputs and names read by computations."""
        names = {a.name for rn in self.rewrite if rn.call is not None for a in rn.call.args}
        names |= {rn.alias for rn in self.rewrite if rn.alias}
        exprs = list(self.compute.values()) + [e for e, _ in self.require]
        exprs += [e for rn in self.rewrite for e in rn.attrs.values()]
        names |= {n for e in exprs for n, _, _ in e.names}
        return names

    @functools.cached_property
    def required_ops(self) -> frozenset[tuple[str, str]]:
        """Ops every match contains: the calls of lines that have no alternatives at their top."""
        return frozenset((e.domain, e.op) for n, e in self.lines.items() if isinstance(e, Call) and self.head(n) == n)

    def root_ops(self) -> set[tuple[str, str]]:
        return _top_ops(self.lines[self.root])

    @functools.cached_property
    def facts(self) -> frozenset[str]:
        """Names the concepts of the match bind (`scale=S`): numbers compute and require read."""
        return frozenset(n for e in self.lines.values() for c in iter_concepts(e) for n in c.facts.values())

    @functools.cached_property
    def atoms(self) -> frozenset[str]:
        """The axis names of the match's layouts: dims compute and require read by name (`num_heads=n`)."""
        return layout_atoms(self.lines)

    def output_ops(self) -> list[tuple[str, str]]:
        return [(rn.call.domain, rn.call.op) for rn in self.rewrite if rn.call is not None]

    def for_target(self, target: str) -> Rule:
        """The rule as it applies on `target`: its conditions for that target join `require` (each reported as
        '<condition> (on <target>)' when it fails)."""
        extra = self.conditions.get(target)
        if not extra:
            return self
        return dataclasses.replace(self, require=self.require + [(e, f"{t} (on {target})") for e, t in extra])

    def elem_source(self, rn: RewriteNode) -> tuple[str, int] | None:
        """(match name, input index): the first input of the rewrite call `rn` whose element type the match
        determines; a value the rewrite makes with a same-type op (Transpose, Reshape, ...) counts as the
        match value it was made from. None when no input is one (e.g. only computed constants)."""
        if rn.call is None:
            return None
        made = {o: r for r in self.rewrite for o in r.outputs if o != "_"}
        matched = set(self.lines) | set(self.outputs_of) | {a for e in self.lines.values() for a in _refs(e)}
        matched.discard("_")
        for i, a in enumerate(rn.call.args):
            name, seen = getattr(a, "name", "_"), set()
            while name in made and name not in matched and name not in seen:
                seen.add(name)
                src = made[name]
                if src.call is None:
                    name = src.alias or "_"
                elif src.call.domain == "" and src.call.op in SAME_TYPE_OPS and src.call.args:
                    name = getattr(src.call.args[0], "name", "_")
                else:
                    name = "_"
            if name in matched:
                return name, i
        return None


def _top_ops(e: Expr) -> set[tuple[str, str]]:
    """The ops a node matched by `e` can have: a concept's chain ends in one of its own ops or its argument's."""
    if isinstance(e, Alt):
        return set().union(*(_top_ops(o) for o in e.options))
    if isinstance(e, Call):
        return {(e.domain, e.op)}
    if isinstance(e, Concept):
        own = (LAYOUT_OPS if e.name == "layout" else MASK_OPS if e.name == "masked"
               else REGION_OPS if e.name == "computes" else frozenset()) \
            | (SCALE_OPS if e.facts else frozenset())
        return {("", op) for op in own} | _top_ops(e.arg)
    return set()


def _refs(e: Expr) -> set[str]:
    return {r.name for r in iter_refs(e)}
