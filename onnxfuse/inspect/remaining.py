"""What onnxfuse knows about the op types that take the most time outside GEMM work (`onnxfuse profile`'s
remaining costs): one note per op type.

The op types are onnxruntime's, from the graph it runs: a node it did not fuse keeps its name from the file,
so a profiled op type maps back to the file's nodes of those names. One explain-like pass over the file (the
facts optimize would use, the rules to a fixed point, the near misses of the rules that read those op types)
then says, per op type, which rule would rewrite some of them (not applied in this file), which rule is held
back on the target (not declared for it, or no kernel for what it makes), which rule nearly matched and why,
or that no rule reads the op at all.

ReorderInput / ReorderOutput are onnxruntime's NCHWc layout boundaries (its NchwcTransformer puts them around
each chain of blocked convolutions): their note names the op types at the boundaries in onnxruntime's optimized
graph (the consumers of a ReorderOutput, the producers of a ReorderInput's input) and what the layout rules
(patterns/layout.yaml) do with those nodes."""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import onnx

from ..errors import OnnxfuseError
from ..kernels.applicable import rule_usage
from ..match.matcher import Matcher
from ..patterns.rules import Rule
from ..patterns.syntax import iter_calls
from ..rewrite.engine import near_misses
from ..rewrite.rebuild import Rewritten, rebuild
from ..rewrite.ruleset import load_rules
from ..targets import HOST, get
from ..validate.facts import run_facts
from ..validate.runtime import make_session

__all__ = ["LAYOUT_OPS", "Boundaries", "Fact", "Note", "layout_boundaries", "notes", "ort_optimized"]

LAYOUT_OPS = ("ReorderInput", "ReorderOutput")
NCHWC = "com.microsoft.nchwc"
LAYOUT_FILE = "layout.yaml"  # the built-in rules that keep onnxruntime's convolutions in NCHWc
NOT_APPLIED = "matched, but not applied: "
SHOWN = 2  # facts besides the rewrites per note in its text (all are in facts)


@dataclass(frozen=True)
class Fact:
    """One thing known about a rule and some of the op's nodes. kind: `rewrites` (the rule would rewrite them:
    it is not applied in this file), `held back` (the rule is not used on the target, or what it makes has no
    kernel there: `reason`), `near miss` (its best attempt on them failed: the most common `reason`)."""

    kind: str
    rule: str
    nodes: int
    reason: str = ""


@dataclass
class Note:
    """What onnxfuse knows about one op type: `text` (one line), the `facts` behind it and, for a layout
    boundary op, `boundaries` (op type at the boundary -> nodes)."""

    op: str
    text: str
    facts: list[Fact] = field(default_factory=list)
    boundaries: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"text": self.text, "facts": [f.__dict__ for f in self.facts], "boundaries": self.boundaries}


@dataclass
class Boundaries:
    """onnxruntime's NCHWc layout boundaries: op type (nchwc.X for a blocked one) -> names of its nodes that read a
    ReorderOutput (`ends`; `<output>` where a graph output is one) or make a ReorderInput's input (`starts`;
    `<input>` for a graph input). A node is counted once however many of its inputs are reordered."""

    ends: dict[str, list[str]]
    starts: dict[str, list[str]]


def ort_optimized(path: str, provider: str = HOST, level: str = "all", threads: int = 1) -> onnx.ModelProto:
    """onnxruntime's optimized graph of `path` (its fusions, and on CPU at `all` the NCHWc layout), as it saves
    it with SessionOptions.optimized_model_filepath; weights are not loaded back."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-ort-") as tmp:
        out = os.path.join(tmp, "optimized.onnx")
        make_session(path, level, provider, threads, optimized_path=out)
        return onnx.load(out, load_external_data=False)


def label(n: onnx.NodeProto) -> str:
    return f"nchwc.{n.op_type}" if n.domain == NCHWC else n.op_type


def layout_boundaries(g: onnx.GraphProto) -> Boundaries:
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in g.node:
        for i in dict.fromkeys(n.input):
            consumers[i].append(n)
    outputs = {o.name for o in g.output}
    ends: dict[str, dict[str, None]] = defaultdict(dict)
    starts: dict[str, dict[str, None]] = defaultdict(dict)
    for n in g.node:
        if n.op_type == "ReorderOutput":
            for c in consumers.get(n.output[0], []):
                ends[label(c)][c.name] = None
            if n.output[0] in outputs:
                ends["<output>"][n.output[0]] = None
        elif n.op_type == "ReorderInput":
            p = producer.get(n.input[0])
            if p is None:
                starts["<input>"][n.input[0]] = None
            else:
                starts[label(p)][p.name] = None

    def ordered(d: dict[str, dict[str, None]]) -> dict[str, list[str]]:
        return {k: list(v) for k, v in sorted(d.items(), key=lambda kv: (-len(kv[1]), kv[0]))}

    return Boundaries(ordered(ends), ordered(starts))


def reads(rule: Rule) -> set[str]:
    """The op types a rule's match contains (any line, any alternative)."""
    return {c.op for e in rule.lines.values() for c in iter_calls(e)}


@dataclass
class _Pass:
    """The explain-like pass: the file's rules to a fixed point, and the near misses of the rules asked about."""

    target: str
    rules: list[Rule]
    state: Rewritten
    owner: dict[str, str]  # file node name -> the rule whose rewrite replaces it (the last one to take it)
    misses: dict[str, list[tuple[set[str], str]]]  # rule -> (node names the attempt touched, reason)
    names: dict[str, str]  # profiled node name -> the file's node name (onnxruntime renames some)
    file_ops: dict[str, str]  # the file's node name -> its op type
    optimized: bool  # the file is onnxfuse's output


def _run_pass(path: str, ops: set[str], target: str, layout: bool) -> _Pass:
    rules = load_rules(None, True, only=None)
    state = rebuild(path, rules, run_facts(path, target), set())  # a file onnxfuse cannot load raises here
    proto = onnx.load(path, load_external_data=False)
    file_ops: dict[str, str] = {}
    names: dict[str, str] = {}
    for n in proto.graph.node:
        file_ops[n.name] = n.op_type
        names[n.name] = n.name
        for o in n.output:  # onnxruntime's NCHWc transform names a node after its output value
            names.setdefault(f"{o}_nchwc", n.name)
    optimized = any(n.doc_string.startswith("onnxfuse:") for n in proto.graph.node)
    asked = [r for r in rules if reads(r) & ops or layout and os.path.basename(r.file) == LAYOUT_FILE]
    owner: dict[str, str] = {}  # file node -> the last rule that replaced it (a later rewrite takes an earlier's)
    for a in state.eng.applications:
        owner.update(dict.fromkeys(a.replaced, a.rule))
    misses: dict[str, list[tuple[set[str], str]]] = defaultdict(list)
    for m in near_misses(state.model, asked, target, min_progress=1):
        if m.progress >= 2 or m.reason.startswith(NOT_APPLIED):  # past the root, or matched whole and refused
            misses[m.rule].append(({m.node, m.at}, m.reason))
    return _Pass(target, rules, state, owner, misses, names, file_ops, optimized)


def _held_back(p: _Pass, rule: Rule, names: set[str]) -> tuple[str, int] | None:
    """(why, nodes it would take) for a rule the target cannot use, where it matches some of `names`."""
    skip = next((s for s in p.state.eng.skipped if s.rule == rule.id), None)
    if skip is None:
        return None
    taken: set[str] = set()
    for graph in p.state.model.graphs():
        matcher = Matcher(rule, graph)
        for n in graph.live_nodes():
            if (n.domain, n.op_type) in rule.root_ops():
                b = matcher.match(n)
                if b is not None:
                    taken.update(m.name for m in b.matched if m.name in names)
    usage = rule_usage(rule, p.target)
    return (usage.why if usage.used == "no" else skip.reason), len(taken)


def _key(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def _unusable(why: str) -> str | None:
    """The reason in a near miss that matched but cannot be used on the target (no kernel for what it makes,
    not declared for the target); None for any other near miss."""
    if why.startswith(NOT_APPLIED) and not why.startswith(NOT_APPLIED + "compute failed"):
        return why[len(NOT_APPLIED):]
    return None


def _facts(p: _Pass, rules: list[Rule], names: set[str]) -> list[Fact]:
    """What the rules do with the file's nodes `names`: the rewrites of any rule (most nodes first), then the
    rules of `rules` held back on the target, then their near misses (each with its most common reason)."""
    taken = Counter(p.owner[n] for n in names if n in p.owner)
    rewrites = [Fact("rewrites", rule, n) for rule, n in taken.most_common()]
    held, missed = [], []
    for r in rules:
        hits = [(touched & names, why) for touched, why in p.misses.get(r.id, []) if touched & names]
        unusable = [(t, _unusable(why)) for t, why in hits if _unusable(why)]
        hits = [h for h in hits if not _unusable(h[1])]
        back = _held_back(p, r, names)
        if back is not None and back[1]:
            held.append(Fact("held back", r.id, back[1], back[0]))
        elif back is None and unusable:
            held.append(Fact("held back", r.id, len(set().union(*(t for t, _ in unusable))),
                             Counter(why for _, why in unusable).most_common(1)[0][0]))
        if hits:
            common = Counter(_key(why) for _, why in hits).most_common(1)[0][0]
            why = next(why for _, why in hits if _key(why) == common)
            missed.append(Fact("near miss", r.id, len(set().union(*(t for t, _ in hits))),
                               why.removeprefix(NOT_APPLIED + "compute failed: ")))
    # a whole match refused (by a require, say) is the nearest miss: first, then by the nodes it concerns
    missed.sort(key=lambda f: (not f.reason.startswith("require failed"), -f.nodes))
    return rewrites + sorted(held, key=lambda f: -f.nodes) + missed


def _fact_text(f: Fact, p: _Pass, of: int) -> str:
    if f.kind == "held back":
        return f"{f.rule} held back on {p.target}: {f.reason} (it would take {f.nodes})"
    hint = " (optimize --static --shape fixes them)" if "not known before run time" in f.reason else ""
    return f"{f.rule}: near miss on {f.nodes} of the {of}: {f.reason}{hint}"


def _join(facts: list[Fact], p: _Pass, of: int) -> str:
    """The rewrites in one clause, then the other facts (SHOWN of them at most)."""
    rewrites = [f for f in facts if f.kind == "rewrites"]
    parts = []
    if rewrites:
        why = ("this file is onnxfuse's output: measured selection or validation dropped them" if p.optimized
               else "this file was not optimized")
        parts.append(f"would be rewritten ({sum(f.nodes for f in rewrites)} of the {of}) by "
                     + ", ".join(f"{f.rule} {f.nodes}" for f in rewrites) + f", not applied here: {why}")
    others = [f for f in facts if f.kind != "rewrites"]
    parts += [_fact_text(f, p, of) for f in others[:SHOWN]]
    if len(others) > SHOWN:
        parts.append(f"{len(others) - SHOWN} more in --json")
    return "; ".join(parts)


def _op_note(p: _Pass, op: str, profiled: list[str]) -> Note:
    names = {p.names[n] for n in profiled if n in p.names and p.file_ops.get(p.names[n]) == op}
    if not names:
        made = Counter(p.file_ops[p.names[n]] for n in profiled if n in p.names)
        what = ", ".join(f"{k} {v}" for k, v in made.most_common(3))
        return Note(op, "onnxruntime's own op, not one of this file's" + (f" (in place of its {what})" if what else ""))
    asked = [r for r in p.rules if op in reads(r)]
    facts = _facts(p, asked, names)
    if not asked and not facts:
        return Note(op, f"no rule reads {op}")
    if not facts:
        ids = ", ".join(r.id for r in asked[:4]) + (" ..." if len(asked) > 4 else "")
        return Note(op, f"{len(asked)} rule(s) read {op} ({ids}); none gets past its first node on these")
    return Note(op, _join(facts, p, len(names)), facts)


def _layout_note(p: _Pass, op: str, bounds: Boundaries) -> Note:
    side = bounds.ends if op == "ReorderOutput" else bounds.starts
    counts = {k: len(v) for k, v in side.items()}
    where = ", ".join(f"{k} {v}" for k, v in list(counts.items())[:4]) or "nothing"
    head = f"NCHWc chains {'end before' if op == 'ReorderOutput' else 'restart after'} {where}"
    names = {p.names[n] for v in side.values() for n in v if n in p.names}
    layout = [r for r in p.rules if os.path.basename(r.file) == LAYOUT_FILE]
    facts = _facts(p, layout, names)
    if facts:
        return Note(op, f"{head}; {_join(facts, p, len(names))}", facts, counts)
    ops = sorted({p.file_ops[n] for n in names})
    ids = ", ".join(r.id for r in layout)
    return Note(op, f"{head}; the layout rules ({ids}) " + (f"match none of these ({', '.join(ops)})" if ops
                                                             else "have nothing to read here"), [], counts)


def notes(path: str, profiled: dict[str, list[str]], target: str = HOST, level: str = "all",
          threads: int = 1) -> dict[str, Note]:
    """One note per op type of `profiled` (op type -> names of its profiled nodes, as onnxruntime ran `path` on
    `target` at `level`). A file onnxfuse cannot load or rewrite gets the reason as every note."""
    try:
        # layout boundaries where the target prefers onnxruntime's blocked NCHWc layout (Target.layout)
        layout = get(target).layout == "nchwc" and bool(set(profiled) & set(LAYOUT_OPS))
        p = _run_pass(path, set(profiled) - set(LAYOUT_OPS), target, layout)
        bounds = layout_boundaries(ort_optimized(path, target, level, threads).graph) if layout else None
    except OnnxfuseError as e:
        return {op: Note(op, f"not known: {e}") for op in profiled}
    return {op: _layout_note(p, op, bounds) if bounds is not None and op in LAYOUT_OPS else _op_note(p, op, names)
            for op, names in profiled.items()}
