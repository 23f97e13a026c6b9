"""Apply rules to a fixed point, deterministically: rules by match size then file order, nodes in graph
order, every graph and subgraph (If/Loop/Scan bodies) included."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..errors import PatternError
from ..ir import Graph, Model, Node
from ..kernels.applicable import match_issue, rule_issue
from ..match.matcher import Failure, Matcher
from ..patterns.compute import ComputeError
from ..patterns.rules import Rule
from ..targets import HOST
from ..tensors import TensorType
from .apply import Application, apply_match, compute_constants
from .fold import fold
from .if_versioning import specialize_hot_branches

MAX_SWEEPS = 32


@dataclass(frozen=True)
class RuleSkip:
    rule: str
    reason: str


@dataclass(frozen=True)
class NearMiss:
    rule: str
    node: str  # candidate root node
    op: str
    at: str  # where the best attempt failed
    reason: str
    progress: int
    value: str = ""  # the candidate root node's first output
    graph: str = "rewritten"  # where it was looked for: "rewritten" (after every rule) or "before fusions"
    size: int = 0  # nodes in the rule's pattern: progress / size is how much of it the attempt matched
    hidden: str = ""  # why explain leaves it out by default: the rule cannot apply on this model and target

    @property
    def fraction(self) -> float:
        """The share of the rule's pattern this attempt matched (0..1)."""
        return min(1.0, self.progress / self.size) if self.size else 0.0


@dataclass
class EngineOptions:
    target: str = HOST
    deny: set[tuple[str, str]] = field(default_factory=set)  # (rule id, root value) never applied
    # when given, the only (rule id, root value) rule rewrites applied, besides those of rules that only remove nodes
    # (Rule.removes_only: exact, kept without timing wherever they turn up)
    allow: set[tuple[str, str]] | None = None
    fold: bool = True  # constant folding and If inlining before (and after) the rules
    max_rewrites: int | None = None  # stop after this many rule rewrites, folding still runs (bisection)
    hot: dict[str, bool] = field(default_factory=dict)  # If condition name -> its value on representative inputs
    observed: dict[str, TensorType] = field(default_factory=dict)  # types runs of the original showed, for values
    # shape inference left without a shape (Validator.observed_types); given to the graph before matching


@dataclass
class EngineResult:
    applications: list[Application]
    skipped: list[RuleSkip]
    sweeps: int
    warnings: list[str] = field(default_factory=list)  # one line each: rules still firing at MAX_SWEEPS


def rules_in_order(rules: list[Rule]) -> list[Rule]:
    """The order the engine tries rules in (within a stage: the early canonicalisations run to their fixed point
    before the rest): bigger matches first, then file order."""
    return sorted(rules, key=lambda r: (-r.size, r.order))


def _candidates(graph: Graph, only: set[int] | None = None) -> dict[tuple[str, str], list[Node]]:
    index: dict[tuple[str, str], list[Node]] = {}
    for n in graph.nodes:
        if n.alive and (only is None or id(n) in only):
            index.setdefault((n.domain, n.op_type), []).append(n)
    return index


def _downstream(graph: Graph, values: set[str], depth: int) -> set[int]:
    """Nodes within `depth` consumer hops of the given values: the only places a new match can be rooted
    after a sweep changed those values (a match spans at most `depth` nodes)."""
    seen: set[int] = set()
    frontier = set(values)
    for _ in range(depth):
        nxt: set[str] = set()
        for v in frontier:
            for n in graph.consumers.get(v, ()):
                if id(n) not in seen:
                    seen.add(id(n))
                    nxt.update(o for o in n.proto.output if o)
        frontier = nxt
    return seen


def run(model: Model, rules: list[Rule], options: EngineOptions) -> EngineResult:
    skipped: list[RuleSkip] = []
    active: list[Rule] = []
    for rule in rules_in_order(rules):
        issue = rule_issue(rule, options.target, model.opset)
        if issue:
            skipped.append(RuleSkip(rule.id, issue))
        else:
            active.append(rule.for_target(options.target))
    for name, t in options.observed.items():
        known = model.graph.types.get(name)
        if known is None or known.shape is None:
            model.graph.set_type(name, t)
    apps: list[Application] = fold(model, options.deny) if options.fold else []
    if options.fold and options.hot:
        apps.extend(specialize_hot_branches(model, options.hot, options.deny))
    # max_rewrites counts the rules' rewrites only: the exact passes (folding before and after them) always run,
    # so a prefix that bisection validates gives its last rewrite's nodes the inputs the full run gives them
    exact = len(apps)
    sweeps = 0
    warnings: list[str] = []
    for stage in ([r for r in active if r.early], [r for r in active if not r.early]):
        n, stopped = _sweep(model, stage, options, apps, exact, warnings)
        sweeps += n
        if stopped:
            break
    if options.fold and apps:
        apps.extend(fold(model, options.deny))  # rules may have made more values constant
    return EngineResult(apps, skipped, sweeps, warnings)


def _sweep(model: Model, active: list[Rule], options: EngineOptions, apps: list[Application],
           exact: int = 0, warnings: list[str] | None = None) -> tuple[int, bool]:
    """Apply `active` (in order) to a fixed point. Returns (sweeps, stopped at options.max_rewrites rule
    rewrites; the first `exact` of `apps` are not rule rewrites). When MAX_SWEEPS sweeps still change the graph
    (a rule whose rewrite is its own match, two rules that undo each other), it stops there and `warnings` gets
    one line naming the rules that fired in the last two sweeps."""
    if options.max_rewrites is not None and len(apps) - exact >= options.max_rewrites:
        return 0, True
    if not active:
        return 0, False
    sweeps = 0
    depth = max((r.size for r in active), default=1) + 1
    dirty: dict[int, set[str]] | None = None  # values changed by the previous sweep, per graph; None: all
    limit = GROWTH_FACTOR * _live_count(model) + GROWTH_SLACK
    first = len(apps)  # where this sweep's rewrites start in apps
    for sweeps in range(1, MAX_SWEEPS + 1):  # noqa: B007
        _check_growth(model, limit, apps, sweeps)
        changed = False
        previous, first = first, len(apps)  # the previous sweep's and this one's rewrites start there
        touched: dict[int, set[str]] = {}
        for graph in list(model.graphs()):
            if dirty is not None and id(graph) not in dirty:
                continue  # already at its fixed point
            index = _candidates(graph, None if dirty is None else _downstream(graph, dirty[id(graph)], depth))
            present = {(n.domain, n.op_type) for n in graph.live_nodes()}
            # a match reaching a node an earlier rule made in this sweep waits for the next sweep, where the rules
            # see it in their order: a Conv a BatchNorm fold just made goes to the earlier rule that reads it
            # whole (a Concat split), not to the later one whose root happened to be indexed (Relu fusion)
            before = {id(n) for n in graph.live_nodes()}
            for rule in active:
                if not rule.required_ops <= present:
                    continue  # an op every match needs is not in this graph
                matcher = Matcher(rule, graph)
                for op in sorted(rule.root_ops()):
                    for node in index.get(op, ()):
                        key = (rule.id, node.outputs[0])
                        if not node.alive or key in options.deny or (
                                options.allow is not None and key not in options.allow and not rule.removes_only):
                            continue
                        b = matcher.match(node)
                        if b is None or match_issue(rule, graph, b, options.target):
                            continue
                        if any(id(n) not in before for n in b.matched):
                            continue  # made in this sweep: the next one sees it (changed is already set)
                        values = {v for n in b.matched + b.side for v in n.proto.input if v}
                        values.update(v for n in b.matched for v in n.proto.output if v)
                        try:
                            apps.append(apply_match(rule, graph, b))
                        except ComputeError:
                            continue
                        touched.setdefault(id(graph), set()).update(values)
                        changed = True
                        if options.max_rewrites is not None and len(apps) - exact >= options.max_rewrites:
                            for g in model.graphs():  # as the end of the sweep would
                                remove_dead_created_nodes(g)
                            return sweeps, True
        for graph in model.graphs():
            touched.setdefault(id(graph), set()).update(remove_dead_created_nodes(graph))
        if not changed:
            break
        dirty = touched
    else:
        if warnings is not None:
            # the last two sweeps: a rule undoing another's rewrite sees it only in the next sweep
            warnings.append(sweep_limit_warning(sorted({a.rule for a in apps[previous:]})))
    return sweeps, False


def sweep_limit_warning(rules: list[str]) -> str:
    return (f"the rules reached no fixed point: the graph still changed after {MAX_SWEEPS} sweeps (stopped "
            f"there); still firing: {', '.join(rules)} (a rule whose rewrite is its own match, or rules that undo "
            "each other; --skip one of them)")


GROWTH_FACTOR, GROWTH_SLACK = 4, 1000  # a graph rules made larger than this has a rule matching its own output


def _live_count(model: Model) -> int:
    return sum(1 for g in model.graphs() for _ in g.live_nodes())


def _check_growth(model: Model, limit: int, apps: list[Application], sweeps: int) -> None:
    """A rule whose rewrite contains its own pattern again fires on its output every sweep; where that makes
    the graph grow, stop with the rule named (not when memory runs out)."""
    n = _live_count(model)
    if n <= limit:
        return
    rule, count = Counter(a.rule for a in apps[-512:]).most_common(1)[0]
    raise PatternError(f"rule {rule!r} keeps matching its own output: after {sweeps - 1} sweep(s) the graph has "
                       f"{n} nodes ({count} of the last rewrites are its)",
                       hint="its rewrite must not contain its match pattern again; --skip it to go on without it")


def remove_dead_created_nodes(graph: Graph) -> set[str]:
    """Nodes a rewrite created (re-created a value for readers that then went away) and nobody reads: gone.
    Original nodes are never removed here. Returns the values they read."""
    freed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for n in graph.nodes:
            if (n.alive and n.provenance is not None and not n.subgraphs
                    and not any(graph.consumers.get(o) or graph.is_graph_output(o) for o in n.proto.output if o)):
                graph.remove_node(n)
                freed.update(i for i in n.proto.input if i)
                changed = True
    return freed


def near_misses(model: Model, rules: list[Rule], target: str, min_progress: int = 2) -> list[NearMiss]:
    """For every candidate root node no rule took: why the most advanced attempt failed."""
    out: list[NearMiss] = []
    for graph in model.graphs():
        index = _candidates(graph)
        for rule in (r.for_target(target) for r in rules_in_order(rules)):  # target conditions join `require`
            matcher = Matcher(rule, graph)
            for op in sorted(rule.root_ops()):
                for node in index.get(op, ()):
                    b = matcher.match(node)
                    fail: Failure | None = matcher.best
                    if b is not None:
                        issue = match_issue(rule, graph, b, target) or rule_issue(rule, target, model.opset)
                        if issue is None:
                            try:
                                compute_constants(rule, graph, b)
                                continue
                            except ComputeError as e:
                                issue = f"compute failed: {e}"
                        fail = Failure(len(b.matched), node.name, f"matched, but not applied: {issue}")
                    if fail is not None and fail.progress >= min_progress:
                        out.append(NearMiss(rule.id, node.name or node.outputs[0], node.op_type, fail.node,
                                            fail.reason, fail.progress, node.outputs[0] if node.outputs else "",
                                            size=rule.size))
    return out
