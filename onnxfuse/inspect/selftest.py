"""Tests generated from a rule itself (`onnxfuse patterns test`).

For every alternative of the match (and once more with every commutative operand swapped and optional inputs
left out), build a small model, check the rule fires exactly once and onnxruntime gives the same outputs
before and after. Then build mutants that must NOT fire: a constant out of tolerance, an extra consumer on an
interior value, a dtype the rule does not allow.

Every floating dtype the rule claims (the `dtype` list of the value the models are built around) is tested:
the models are built in that dtype (inputs and initializers) and compared with the tolerance validation uses
for it. A dtype whose fused op has no CPU kernel in the installed onnxruntime cannot be validated here: the
optimizer must not apply the rule on the CPU target, the rewrite is checked on another declared target, and
the dtype is reported as held back with the kernel registry's reason.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import numpy as np
import onnx

from ..ir import Model
from ..kernels.applicable import match_issue, rule_issue
from ..load.loader import checker_error, runtime_only_masked
from ..match.matcher import Matcher
from ..patterns.rules import Rule
from ..patterns.syntax import Call, Concept, Expr, Ref
from ..rewrite.engine import EngineOptions, near_misses, run
from ..targets import HOST, assume_cpu_nchwc, available, kernel_issue, names
from ..validate.compare import default_tolerance
from .selftest_models import (
    FLOAT,
    FLOATS,
    Builder,
    Mutation,
    claimed_dtypes,
    expand,
    instances,
    rule_opsets,
    swap_operands,
)
from .selftest_report import DtypeReport, RuleReport, dtype_label


def _no_kernel_here(model: onnx.ModelProto) -> str | None:
    """A contrib op of the model that no installed execution provider can run (e.g. a CUDA-only op here)."""
    providers = [p for p in names() if available(p)]
    for n in model.graph.node:
        if n.domain and all(kernel_issue(n.domain, n.op_type, p) for p in providers):
            return f"{n.domain}.{n.op_type}"
    return None


def _match_issues(rule: Rule, m: Model, targets: list[str]) -> dict[str, str | None]:
    """The engine's own per-match kernel check (the matched dtype included) of the model's match, per target,
    so a reason given is the optimizer's; {} when nothing matches."""
    matcher = Matcher(rule, m.graph)
    roots = rule.root_ops()
    for node in list(m.graph.live_nodes()):
        if (node.domain, node.op_type) in roots and (b := matcher.match(node)) is not None:
            return {t: match_issue(rule, m.graph, b, t) for t in targets}
    return {}


def _reference_note(model: onnx.ModelProto, elem: int) -> str | None:
    """Original ops that have a CPU kernel, but none for `elem`. The reference is computed anyway (the model was
    run): a float16 op in float32 between Casts onnxruntime inserts, rounded to float16 after every op."""
    ops = dict.fromkeys(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node
                        if not kernel_issue(n.domain, n.op_type, HOST)
                        and kernel_issue(n.domain, n.op_type, HOST, elem))
    if not ops:
        return None
    how = ("in float32 between Casts it inserts" if elem in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
           else "through their ONNX function bodies")
    return f"original ops without a {dtype_label(elem)} CPU kernel, run by onnxruntime {how}: {', '.join(ops)}"


def _typed(model: onnx.ModelProto) -> Model:
    inferred = onnx.shape_inference.infer_shapes(model)
    from ..load.loader import merge_types

    m = Model(model, ".")
    merge_types(m.graph, inferred.graph)
    return m


def _target(rule: Rule, opset: int) -> str:
    """The first of the rule's targets it can be used on with the installed onnxruntime."""
    return next((t for t in rule.targets if rule_issue(rule, t, opset) is None), rule.targets[0])


def _fires(rule: Rule, model: onnx.ModelProto, target: str | None = None) -> tuple[int, onnx.ModelProto]:
    m = _typed(model)
    target = target or _target(rule, m.opset)
    # a condition on this machine's layout (cpu_nchwc()) is lifted: the rewrite's numbers hold on any CPU
    lift = any("cpu_nchwc" in text for _, text in rule.conditions.get(target, ()))
    with assume_cpu_nchwc(False) if lift else contextlib.nullcontext():
        res = run(m, [rule], EngineOptions(target=target, fold=False))
    return sum(1 for a in res.applications if a.rule == rule.id), m.export()


# Failures that depend on the input shapes or constant values the generated model was built with: an
# `example:` (input shapes, constant values, attributes) lets the self-test build a model the rule accepts.
_EXAMPLE_FIXABLE = ("require failed", "compute failed", "has shape", "has rank", "constant of shape",
                    "is not a constant", "not within tolerance", "is a graph input or constant")


def why_not_fired(rule: Rule, model: onnx.ModelProto, target: str) -> str:
    """Why the rule did not fire on a generated model, in the engine's and the matcher's words (what `explain`
    says): the rule not used on the target (no kernel, opset), or the most advanced attempt's failure (a
    constraint, a `require`, an unsupported dtype). Points to `example:` when the inputs built decide it."""
    m = _typed(model)
    issue = rule_issue(rule, target, m.opset)
    if issue:
        return f"the rule is not used on {target}: {issue}"
    misses = near_misses(m, [rule], target, min_progress=0)
    if not misses:
        roots = ", ".join(sorted(f"{d}.{op}" if d else op for d, op in rule.root_ops()))
        return f"no match was attempted (no {roots} node in the generated model)"
    best = max(misses, key=lambda x: x.progress)
    reason = f"at {best.at}: {best.reason}"
    if any(k in best.reason for k in _EXAMPLE_FIXABLE):
        reason += (" (hint: the generated inputs decide this; adjust the rule's `example:`)" if rule.example else
                   " (hint: give the rule an `example:` with input shapes/values it accepts; see "
                   "docs/writing-patterns.md)")
    return reason


def _ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from ..validate.runtime import make_session

    return make_session(model.SerializeToString(), "disable").run(None, feeds)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def _valid_build(rule: Rule, inst: dict[str, Expr], with_optional: bool, mut: Mutation, run_reference: bool = True,
                 keep_unrunnable: bool = False
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int, str | None] | None:
    """The first opset and example at which the instance builds, passes the checker and (with `run_reference`)
    runs in onnxruntime: (model, feeds, opset, None). With `keep_unrunnable`, where every such model fails in
    onnxruntime, the first of them with onnxruntime's error."""
    n_examples = max((len(v) for v in rule.example.values()), default=1)
    unrunnable = None
    for opset, ex in itertools.product(rule_opsets(rule), range(n_examples)):
        b = Builder(rule, inst, opset, with_optional, mut, np.random.default_rng(0), ex)
        try:
            model, feeds = b.build()
            # an op onnxruntime registers in the ONNX domain where ONNX has none (a LayerNormalization at opset
            # 16) is carried through unchecked, as in a model optimize loads
            onnx.checker.check_model(runtime_only_masked(model), full_check=True)
        except Exception:  # noqa: BLE001 - this opset cannot express the instance; try the next one
            continue
        if run_reference:
            try:
                _ort_outputs(model, feeds)
            except Exception as e:  # noqa: BLE001 - e.g. an input the builder cannot size; try the next one
                unrunnable = unrunnable or (model, feeds, opset, _first_line(e))
                continue
        return model, feeds, opset, None
    return unrunnable if keep_unrunnable else None


def _difference(x: np.ndarray, y: np.ndarray) -> str | None:
    """Outputs compared with the tolerance validation uses for their dtype (validate.default_tolerance)."""
    if x.shape != y.shape:
        return f"shapes {x.shape} {y.shape}"
    tol = default_tolerance(onnx.helper.np_dtype_to_tensor_dtype(x.dtype))
    a, b = x.astype(np.float64), y.astype(np.float64)
    if np.allclose(a, b, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
        return None
    with np.errstate(invalid="ignore"):
        err = float(np.nanmax(np.abs(a - b))) if a.size else float("nan")
    return f"max abs {err:.3g}, {x.dtype} tolerance rtol {tol.rtol:g} atol {tol.atol:g}"


def _check_instance(rule: Rule, model: onnx.ModelProto, feeds: dict[str, np.ndarray], opset: int,
                    ref_error: str | None, where: str, res: DtypeReport) -> str | None:
    """Fire the rule on one built model and compare outputs. Returns a problem, or None (res updated)."""
    target = _target(rule, opset)
    issues = _match_issues(rule, _typed(model), list(dict.fromkeys([HOST, *rule.targets])))
    # A dtype question only where the CPU provider has every fused op (for some dtype): a fused op with no CPU
    # kernel at all is handled below as before (a contrib op not compared, a standard op through its function).
    cpu_has_ops = not any(kernel_issue(domain, op, HOST) for domain, op in rule.output_ops())
    issue = issues.get(HOST) if cpu_has_ops else None
    if issue:
        # No CPU kernel takes this dtype: the optimizer must refuse the match on the CPU target; the rewrite
        # itself is still checked on a declared target that takes it (CUDA: its registry or published table).
        if HOST in rule.targets:
            fired, _ = _fires(rule, model, HOST)
            if fired:
                return f"{where}: applied on the CPU target although {issue}"
        usable = [t for t in rule.targets if not issues.get(t) and rule_issue(rule, t, opset) is None]
        if not usable:
            why = "; ".join(f"{t}: {issues.get(t) or rule_issue(rule, t, opset)}" for t in rule.targets)
            return f"{where}: claims {res.dtype} but applies on none of its targets ({why})"
        target = usable[0]
        res.held_back = res.held_back or issue
    fired, optimized = _fires(rule, model, target)
    if fired != 1:
        why = f": {why_not_fired(rule, model, target)}" if fired == 0 else ""
        return f"{where}: fired {fired} times on target {target}, expected once{why}"
    error = checker_error(optimized)  # the checker as validation runs it (runtime-only ONNX ops left to onnxruntime)
    if error:
        return f"{where}: optimized model fails onnx.checker: {error.splitlines()[0]}"
    if ref_error:
        res.held_back = res.held_back or f"the original ops in {res.dtype} do not run on CPU: {ref_error}"
        return None
    missing = _no_kernel_here(optimized)
    if missing:
        res.held_back = res.held_back or f"no kernel for {missing} on this machine"
        return None
    try:
        before, after = _ort_outputs(model, feeds), _ort_outputs(optimized, feeds)
    except Exception as e:  # noqa: BLE001
        if issue and "NOT_IMPLEMENTED" in str(e):
            return None  # held back: no kernel for the fused op at this dtype, as the registry said
        return f"{where}: optimized model does not load/run: {_first_line(e)}"
    if issue:
        # Held back, yet it ran: onnxruntime computes a float16 op without a float16 kernel in float32 between
        # Casts it inserts. That tests neither the kernel at this dtype nor the numbers a GPU gives, so the
        # outputs are not compared; it does show that the rewritten model is well typed.
        return None
    for x, y in zip(before, after, strict=True):
        diff = _difference(np.asarray(x), np.asarray(y))
        if diff:
            return f"{where}: outputs differ ({diff})"
    return None


def check_rule(rule: Rule, dtypes: list[int] | None = None) -> RuleReport:
    """Self-test a rule in each of `dtypes` (default: every floating dtype it claims); the mutants run with the
    first claimed dtype."""
    rep = RuleReport(rule.id)
    if rule.unavailable:
        rep.skipped = rule.unavailable
        return rep
    unusable = {t: rule_issue(rule, t, None) for t in rule.targets}
    if all(unusable.values()):
        rep.problems.append("the rule can never be used: " + "; ".join(f"{t}: {why}" for t, why in unusable.items()))
        return rep
    claimed = claimed_dtypes(rule)
    covered: set[tuple[int, int]] = set()
    for elem in dtypes or claimed:
        first_ok = _check_dtype(rule, elem, elem != claimed[0], rep, covered)
        if elem == claimed[0] and first_ok is not None:
            _test_mutants(rule, first_ok, rep)
    # an alternative valid in one dtype only (a float16 model's Casts to float32 and back) is covered by that one,
    # checked in full there (in a report of its own: this one is about `dtypes`)
    for elem in (e for e in claimed if e not in (dtypes or claimed)):
        missing = {(li, oi) for li, _, oi in _uncovered(rule, covered)}
        if missing:
            _check_dtype(rule, elem, True, RuleReport(rule.id), covered, only=missing)
    for _, name, oi in _uncovered(rule, covered):
        rep.problems.append(f"line {name!r} alternative #{oi + 1}: no valid model could be built at "
                            f"opsets {rule_opsets(rule)} (add an 'example' with input shapes)")
    return rep


def _uncovered(rule: Rule, covered: set[tuple[int, int]]) -> list[tuple[int, str, int]]:
    """(line index, line name, alternative index) of each alternative no valid model covered."""
    return [(li, name, oi) for li, name in enumerate(rule.line_names())
            for oi in range(len(expand(rule.lines[name]))) if (li, oi) not in covered]


def _check_dtype(rule: Rule, elem: int, tagged: bool, rep: RuleReport, covered_any: set[tuple[int, int]],
                 only: set[tuple[int, int]] | None = None) -> dict[str, Expr] | None:
    """Every instance built in `elem` (with `only`, those holding one of these (line, alternative) pairs); the
    pairs a valid model covered join `covered_any`. Returns the first instance that passed unswapped (for the
    mutants)."""
    res = DtypeReport(dtype_label(elem))
    rep.dtypes.append(res)
    tag = f"[{res.dtype}] " if tagged else ""
    first_ok: dict[str, Expr] | None = None
    covered: set[tuple[int, int]] = set()
    picked = instances(rule)
    for k, (inst, choice) in enumerate(itertools.chain(picked, _covering(rule, covered))):
        if k >= len(picked) and all(pair in covered for pair in enumerate(choice)):
            continue  # a further combination only for an alternative still uncovered
        if only is not None and not only.intersection(enumerate(choice)) - covered:
            continue
        for swap, with_opt in ((False, True), (True, False)):
            concrete = {n: swap_operands(e) for n, e in inst.items()} if swap else inst
            built = _valid_build(rule, concrete, with_opt, Mutation(dtype=elem), keep_unrunnable=tagged)
            if built is not None and built[3] and _valid_build(rule, concrete, with_opt, Mutation()) is None:
                built = None  # it does not run in the first dtype either: not a question of this dtype
            if built is None:
                continue  # this combination is not expressible at any opset (e.g. attribute and input axes)
            covered.update(enumerate(choice))
            model, feeds, opset, ref_error = built
            where = f"{tag}alternative #{k + 1}{' swapped' if swap else ''} (opset {opset})"
            problem = _check_instance(rule, model, feeds, opset, ref_error, where, res)
            if problem:
                rep.problems.append(problem)
                continue
            res.instances += 1
            rep.instances += 1
            res.reference = res.reference or _reference_note(model, elem)
            if first_ok is None and not swap:
                first_ok = concrete
    covered_any |= covered
    return first_ok


def _covering(rule: Rule, covered: set[tuple[int, int]]):
    """Further combinations for the alternatives no valid model covers yet (`covered`, read as it grows: the
    thinned set can miss the one valid combination of an alternative): for each, the combinations holding it
    whose other lines take one same alternative number as far as they have it (a 3-D softmax goes with 3-D heads
    and a 3-D merge: all second alternatives), one per number. The caller skips one whose alternatives are all
    covered by then."""
    names = rule.line_names()
    options = [list(enumerate(expand(rule.lines[n]))) for n in names]
    widest = max(len(o) for o in options)
    for li, opts in enumerate(options):
        for oi, _ in opts:
            for j in range(widest):
                if (li, oi) in covered:
                    break
                c = [o[oi] if k == li else o[min(j, len(o) - 1)] for k, o in enumerate(options)]
                yield dict(zip(names, (e for _, e in c), strict=True)), tuple(i for i, _ in c)


def _test_mutants(rule: Rule, inst: dict[str, Expr], rep: RuleReport) -> None:
    mutants: list[tuple[str, Mutation]] = []
    used = {r for e in inst.values() for r in _refs(e)}
    for name, con in rule.where.items():
        if con.const is not None and name in used:
            mutants.append((f"const {name} off by 10%", Mutation(const_scale={name: 1.1})))
        if con.dtype is not None and name in used and con.dtype[0] in FLOATS:  # the mutant changes the float type
            bad = next((d for d in (onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, FLOAT)
                        if d not in con.dtype), None)
            if bad is not None:
                mutants.append((f"{name} as {onnx.TensorProto.DataType.Name(bad).lower()}", Mutation(dtype=bad)))
    for name in inst:
        # a concept's data movement read outside the match is kept for that reader (matcher._keep_read_chains)
        kept = rule.where.get(name) and rule.where[name].shared or isinstance(inst[name], Concept)
        if name != rule.root and name not in rule.exposed and not kept:
            mutants.append((f"extra consumer on {name}", Mutation(extra_output=name)))
    for label, mut in mutants:
        built = _valid_build(rule, inst, True, mut, run_reference=mut.dtype is None)
        if built is None:
            built_model = Builder(rule, inst, rule_opsets(rule)[0], True, mut, np.random.default_rng(0)).build()[0]
        else:
            built_model = built[0]
        try:
            fired, _ = _fires(rule, built_model)
        except Exception as e:  # noqa: BLE001
            rep.problems.append(f"mutant '{label}': could not be analysed: {str(e).splitlines()[0][:120]}")
            continue
        if fired:
            rep.problems.append(f"mutant '{label}': rule fired but must not")
        else:
            rep.mutants += 1


def _refs(e: Expr) -> set[str]:
    if isinstance(e, Ref):
        return {e.name}
    if isinstance(e, Call):
        return {r for a in e.args for r in _refs(a)}
    return set()


def check_rules(rules: list[Rule]):
    for r in rules:
        yield check_rule(r)


def self_test(rules: list[Rule]) -> Iterator[RuleReport]:
    """Each rule's generated self-test (`onnxfuse patterns test`): models built from the rule fire it once with
    equal onnxruntime outputs in every dtype it claims, and its mutants do not fire."""
    return check_rules(rules)


def shadowed_by(rule: Rule, rules: list[Rule]) -> str | None:
    """Whether another rule of `rules` (the set a run loads: the built-ins, then the user's files, in that order)
    takes the nodes `rule` matches, on the rule's own self-test model (its first buildable alternative, its
    `example:`): the engine tries bigger matches first, then file order, so a built-in of the same size fires
    there first and the user's rule never does. One warning line, or None."""
    built = next((b for inst, _ in instances(rule)
                  if (b := _valid_build(rule, inst, True, Mutation(), run_reference=False)) is not None), None)
    if built is None:
        return None
    model, _, opset, _ = built
    target = _target(rule, opset)
    alone = run(_typed(model), [rule], EngineOptions(target=target, fold=False))
    mine = {n for a in alone.applications if a.rule == rule.id for n in a.replaced}
    together = run(_typed(model), rules, EngineOptions(target=target, fold=False))
    if not mine or any(a.rule == rule.id for a in together.applications):
        return None
    taken = next((a for a in together.applications if set(a.replaced) & mine), None)
    if taken is None:
        return None
    first = next(r for r in rules if r.id == taken.rule)
    names = ", ".join(sorted(set(taken.replaced) & mine))
    kind = "built-in rule" if first.builtin else "rule"
    return (f"{rule.span}: warning: rule {rule.id!r} loses to {kind} {first.id!r} ({first.span}): on the rule's own "
            f"example, {first.id!r} fires first on the same nodes ({names}) and {rule.id!r} never fires (hint: "
            f"rules are tried bigger first, then built-ins before your files; `--skip {first.id}` lets yours fire, "
            f"or drop yours if {first.id!r} does what you need)")
