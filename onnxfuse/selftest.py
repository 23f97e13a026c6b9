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

import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

from .ir import Model
from .match.matcher import Matcher
from .opschema import op_spec
from .patterns.rules import Rule
from .patterns.syntax import Alt, Call, Expr, Ref
from .rewrite.engine import EngineOptions, match_issue, rule_issue, run
from .targets import kernel_issue, provider_registered
from .validate import default_tolerance

MAX_INSTANCES = 48
DEFAULT_DIM = 4
NAMED_DIMS = {"k": 8}
FLOAT = onnx.TensorProto.FLOAT
FLOATS = (FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


@dataclass
class DtypeReport:
    """The generated models of one claimed dtype."""

    dtype: str
    instances: int = 0  # models that fired once (and, unless held back, gave equal outputs)
    held_back: str | None = None  # why this dtype's fused outputs cannot be validated on this machine
    reference: str | None = None  # original ops with no CPU kernel for this dtype (onnxruntime ran them anyway)

    @property
    def status(self) -> str:
        return "held back" if self.held_back else "validated"

    @property
    def summary(self) -> str:
        if self.held_back:
            return f"{self.dtype}: {self.instances} models fired once, held back ({self.held_back})"
        return f"{self.dtype}: {self.instances} models fired once with equal outputs"


@dataclass
class RuleReport:
    rule: str
    instances: int = 0
    mutants: int = 0
    problems: list[str] = field(default_factory=list)
    dtypes: list[DtypeReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.instances > 0

    def dtype(self, name: str) -> DtypeReport | None:
        return next((d for d in self.dtypes if d.dtype == name), None)

    @property
    def summary(self) -> str:
        return "; ".join([d.summary for d in self.dtypes] + [f"{self.mutants} mutants did not fire"])


def dtype_label(elem: int) -> str:
    """The pattern language's name of a dtype (float32, float16, float64, ...)."""
    return {FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}.get(
        elem, onnx.TensorProto.DataType.Name(elem).lower())


def claimed_dtypes(rule: Rule) -> list[int]:
    """The floating dtypes a rule claims: those of the first `dtype` constraint that starts with a floating type
    (the value the generated models are built around); float32 where no constraint names one."""
    for con in rule.where.values():
        if con.dtype and con.dtype[0] in FLOATS:
            return [d for d in con.dtype if d in FLOATS]
    return [FLOAT]


# ----- expanding alternatives -----------------------------------------------------------------------------
def _expand(e: Expr) -> list[Expr]:
    if isinstance(e, Alt):
        return [x for o in e.options for x in _expand(o)]
    if isinstance(e, Call):
        return [Call(e.op, e.domain, list(args), e.kwargs, e.kw_offs, e.off, e.lits)
                for args in itertools.product(*[_expand(a) for a in e.args])]
    return [e]


def _swap(e: Expr) -> Expr:
    if isinstance(e, Call):
        args = [_swap(a) for a in e.args]
        spec = op_spec(e.domain, e.op)
        if spec is not None and spec.commutative and len(args) == 2:
            args.reverse()
        return Call(e.op, e.domain, args, e.kwargs, e.kw_offs, e.off, e.lits)
    return e


def instances(rule: Rule) -> list[tuple[dict[str, Expr], tuple[int, ...]]]:
    """Every combination of alternatives (evenly thinned to MAX_INSTANCES), with each line's option index."""
    names = rule.line_names()
    options = [list(enumerate(_expand(rule.lines[n]))) for n in names]
    combos = list(itertools.product(*options))
    if len(combos) > MAX_INSTANCES:
        step = len(combos) / MAX_INSTANCES
        picked = [combos[int(i * step)] for i in range(MAX_INSTANCES)]
        covered = {(li, c[li][0]) for c in picked for li in range(len(names))}
        for li, opts in enumerate(options):  # every alternative of every line at least once
            for oi, _ in opts:
                if (li, oi) not in covered:
                    extra = next(c for c in combos if c[li][0] == oi)
                    picked.append(extra)
                    covered |= {(lj, extra[lj][0]) for lj in range(len(names))}
        combos = picked
    return [(dict(zip(names, (e for _, e in c), strict=True)), tuple(i for i, _ in c)) for c in combos]


# ----- building a model -------------------------------------------------------------------------------------
def _np(elem: int) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(elem)


def _input_type(call: Call, idx: int, opset: int, primary: int) -> int:
    """Element type an op wants at input `idx`: int64 for axes/shape-like inputs, else the primary float."""
    try:
        schema = onnx.defs.get_schema(call.op, opset, call.domain or "")
    except onnx.defs.SchemaError:
        return primary
    if not schema.inputs:
        return primary
    formal = schema.inputs[min(idx, len(schema.inputs) - 1)]
    allowed = [formal.type_str] if formal.type_str.startswith("tensor(") else next(
        (list(tc.allowed_type_strs) for tc in schema.type_constraints if tc.type_param_str == formal.type_str), [])
    want = f"tensor({onnx.TensorProto.DataType.Name(primary).lower()})"
    if not allowed or want in allowed:
        return primary
    if "tensor(int64)" in allowed:
        return onnx.TensorProto.INT64
    if len(allowed) == 1:  # e.g. Where's bool condition
        return getattr(onnx.TensorProto, allowed[0][len("tensor("):-1].upper(), primary)
    return primary


@dataclass
class _Mutation:
    const_scale: dict[str, float] = field(default_factory=dict)  # value name -> multiply const by this
    extra_output: str | None = None  # interior line to expose through an extra consumer
    dtype: int | None = None  # replace the primary float type


class _Builder:
    def __init__(self, rule: Rule, inst: dict[str, Expr], opset: int, with_optional: bool, mut: _Mutation,
                 rng: np.random.Generator, example: int = 0) -> None:
        self.rule, self.inst, self.opset, self.with_optional, self.mut, self.rng = (
            rule, inst, opset, with_optional, mut, rng)
        self.example = {k: v[min(example, len(v) - 1)] for k, v in rule.example.items()}
        self.primary = mut.dtype or self._primary_dtype()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.done: dict[str, str] = {}
        self.dims: dict[str, int] = dict(NAMED_DIMS)
        self.n = 0
        self._bind_example_dims()

    def _primary_dtype(self) -> int:
        return claimed_dtypes(self.rule)[0]

    def _bind_example_dims(self) -> None:
        for name, shape in self.example.items():
            con = self.rule.where.get(name)
            if con is not None and con.shape:
                for alt in con.shape:
                    if len(alt) == len(shape):
                        for p, d in zip(alt, shape, strict=True):
                            if isinstance(p, str) and p != "_":
                                self.dims.setdefault(p, d)
                        break

    def _shape(self, name: str) -> list[int]:
        if name in self.example:
            return list(self.example[name])
        con = self.rule.where.get(name)
        if con is not None and con.shape:
            alt = con.shape[0]
            return [d if isinstance(d, int) else (2 if d == "_" else self.dims.setdefault(d, DEFAULT_DIM))
                    for d in alt]
        if con is not None and con.const is not None:
            return list(con.const.shape)
        first = next(iter(self.example.values()), None)
        return list(first) if first else [2, 3, 8]

    def value(self, name: str, call: Call, idx: int) -> str:
        if name in self.done:
            return self.done[name]
        con = self.rule.where.get(name)
        elem = _input_type(call, idx, self.opset, self.primary)
        if con is not None and con.dtype and con.dtype[0] in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            elem = con.dtype[0]  # e.g. token ids, or an int64 buffer read by a Slice
        shape = self._shape(name)
        fixed = self.rule.example_attrs.get(("", name))
        if fixed is not None and not self.mut.const_scale.get(name):
            self.inits.append(numpy_helper.from_array(np.asarray(fixed, dtype=_np(elem)), name))
        elif con is not None and con.const is not None:
            c = con.const * self.mut.const_scale.get(name, 1.0)
            if name in self.mut.const_scale and (not c.any() or elem == onnx.TensorProto.INT64):
                c = con.const + 1
            data = np.broadcast_to(c, shape) if c.size == 1 else c.reshape(shape)
            self.inits.append(numpy_helper.from_array(np.asarray(data, dtype=_np(elem)), name))
        elif con is not None and con.constant:
            data = self.rng.uniform(0.5, 1.5, size=shape) if elem != onnx.TensorProto.INT64 else np.ones(shape)
            self.inits.append(numpy_helper.from_array(np.asarray(data, dtype=_np(elem)), name))
        else:
            self.inputs.append(oh.make_tensor_value_info(name, elem, shape))
            self.feeds[name] = np.asarray(self.rng.standard_normal(shape), dtype=_np(elem))
        self.done[name] = name
        return name

    def emit(self, e: Expr, parent: Call | None = None, idx: int = 0) -> str:
        if isinstance(e, Ref):
            if e.name in self.inst:
                return self.line(e.name)
            if e.optional and not self.with_optional:
                return ""
            if e.name == "_":
                return self.value(f"ANY{idx}", parent, idx) if parent else ""
            assert parent is not None
            return self.value(e.name, parent, idx)
        assert isinstance(e, Call)
        return self._node(e, None)[0]

    def line(self, name: str) -> str:
        head = self.rule.head(name)
        if name not in self.done:
            call = self.inst[head]
            assert isinstance(call, Call)
            outs = [n for n, (h, _) in sorted(self.rule.outputs_of.items(), key=lambda kv: kv[1][1]) if h == head]
            self._node(call, outs or [name])
            for o in outs or [name]:
                self.done[o] = o
        return self.done[name]

    def _node(self, call: Call, outs: list[str] | None) -> list[str]:
        inputs = [self.emit(a, call, i) for i, a in enumerate(call.args)]
        while inputs and inputs[-1] == "":
            inputs.pop()
        self.n += 1
        outs = outs or [f"t{self.n}"]
        attrs = dict(call.lits)
        attrs.update({a: v for (line, a), v in self.rule.example_attrs.items() if line == outs[0]})
        self.nodes.append(oh.make_node(call.op, inputs, outs, name=f"n{self.n}_{call.op}",
                                       domain=call.domain or None, **attrs))
        return outs

    def build(self) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        root = self.line(self.rule.root)
        undefined = onnx.TensorProto.UNDEFINED  # shape inference fills the output types in
        outputs = [oh.make_tensor_value_info(root, undefined, None)]
        if self.mut.extra_output:
            self.nodes.append(oh.make_node("Identity", [self.line(self.mut.extra_output)], ["extra_out"]))
            outputs.append(oh.make_tensor_value_info("extra_out", undefined, None))
        graph = oh.make_graph(self.nodes, f"selftest_{self.rule.id}", self.inputs, outputs, self.inits)
        opsets = [oh.make_opsetid("", self.opset), oh.make_opsetid("com.microsoft", 1)]
        model = oh.make_model(graph, opset_imports=opsets, ir_version=_ir_version(self.opset))
        inferred = onnx.shape_inference.infer_shapes(model)
        for o, io in zip(model.graph.output, inferred.graph.output, strict=True):
            o.type.CopyFrom(io.type)
            if o.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:  # e.g. a contrib op: no ONNX schema
                o.type.tensor_type.elem_type = self.primary
            if not o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.shape.SetInParent()
        return model, self.feeds


def _ir_version(opset: int) -> int:
    for ir, op in ((7, 12), (8, 14), (8, 18), (9, 20), (10, 22)):
        if opset <= op:
            return max(ir, 7)
    return 10


def _opsets(rule: Rule) -> list[int]:
    cands = [rule.opset_min, 11, 13, 17, 18, 21, 23, rule.opset_max]
    top = onnx.defs.onnx_opset_version()
    return sorted({o for o in cands if rule.opset_min <= o <= min(rule.opset_max, top) and o >= 7})


def _no_kernel_here(model: onnx.ModelProto) -> str | None:
    """A contrib op of the model that no installed execution provider can run (e.g. a CUDA-only op here)."""
    providers = [p for p in ("cpu", "cuda") if provider_registered(p)]
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
                        if not kernel_issue(n.domain, n.op_type, "cpu")
                        and kernel_issue(n.domain, n.op_type, "cpu", elem))
    if not ops:
        return None
    how = ("in float32 between Casts it inserts" if elem in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
           else "through their ONNX function bodies")
    return f"original ops without a {dtype_label(elem)} CPU kernel, run by onnxruntime {how}: {', '.join(ops)}"


def _typed(model: onnx.ModelProto) -> Model:
    inferred = onnx.shape_inference.infer_shapes(model)
    from .loader import _merge_types

    m = Model(model, ".")
    _merge_types(m.graph, inferred.graph)
    return m


def _target(rule: Rule, opset: int) -> str:
    """The first of the rule's targets it can be used on with the installed onnxruntime."""
    return next((t for t in rule.targets if rule_issue(rule, t, opset) is None), rule.targets[0])


def _fires(rule: Rule, model: onnx.ModelProto, target: str | None = None) -> tuple[int, onnx.ModelProto]:
    m = _typed(model)
    res = run(m, [rule], EngineOptions(target=target or _target(rule, m.opset), fold=False))
    return sum(1 for a in res.applications if a.rule == rule.id), m.export()


def _ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from .validate import make_session

    return make_session(model.SerializeToString(), "disable").run(None, feeds)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def _valid_build(rule: Rule, inst: dict[str, Expr], with_optional: bool, mut: _Mutation, run_reference: bool = True,
                 keep_unrunnable: bool = False
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int, str | None] | None:
    """The first opset and example at which the instance builds, passes the checker and (with `run_reference`)
    runs in onnxruntime: (model, feeds, opset, None). With `keep_unrunnable`, where every such model fails in
    onnxruntime, the first of them with onnxruntime's error."""
    n_examples = max((len(v) for v in rule.example.values()), default=1)
    unrunnable = None
    for opset, ex in itertools.product(_opsets(rule), range(n_examples)):
        b = _Builder(rule, inst, opset, with_optional, mut, np.random.default_rng(0), ex)
        try:
            model, feeds = b.build()
            onnx.checker.check_model(model, full_check=True)
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
    issues = _match_issues(rule, _typed(model), list(dict.fromkeys(["cpu", *rule.targets])))
    # A dtype question only where the CPU provider has every fused op (for some dtype): a fused op with no CPU
    # kernel at all is handled below as before (a contrib op not compared, a standard op through its function).
    cpu_has_ops = not any(kernel_issue(domain, op, "cpu") for domain, op in rule.output_ops())
    issue = issues.get("cpu") if cpu_has_ops else None
    if issue:
        # No CPU kernel takes this dtype: the optimizer must refuse the match on the CPU target; the rewrite
        # itself is still checked on a declared target that takes it (CUDA: its registry or published table).
        if "cpu" in rule.targets:
            fired, _ = _fires(rule, model, "cpu")
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
        return f"{where}: fired {fired} times on target {target}, expected once"
    try:
        onnx.checker.check_model(optimized)
    except Exception as e:  # noqa: BLE001
        return f"{where}: optimized model fails onnx.checker: {_first_line(e)}"
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
    claimed = claimed_dtypes(rule)
    for elem in dtypes or claimed:
        first_ok = _check_dtype(rule, elem, elem != claimed[0], rep)
        if elem == claimed[0] and first_ok is not None:
            _test_mutants(rule, first_ok, rep)
    return rep


def _check_dtype(rule: Rule, elem: int, tagged: bool, rep: RuleReport) -> dict[str, Expr] | None:
    """Every instance built in `elem`. Returns the first instance that passed unswapped (for the mutants)."""
    res = DtypeReport(dtype_label(elem))
    rep.dtypes.append(res)
    tag = f"[{res.dtype}] " if tagged else ""
    first_ok: dict[str, Expr] | None = None
    covered: set[tuple[int, int]] = set()
    for k, (inst, choice) in enumerate(instances(rule)):
        for swap, with_opt in ((False, True), (True, False)):
            concrete = {n: _swap(e) for n, e in inst.items()} if swap else inst
            built = _valid_build(rule, concrete, with_opt, _Mutation(dtype=elem), keep_unrunnable=tagged)
            if built is not None and built[3] and _valid_build(rule, concrete, with_opt, _Mutation()) is None:
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
    for li, name in enumerate(rule.line_names()):
        for oi in range(len(_expand(rule.lines[name]))):
            if (li, oi) not in covered:
                rep.problems.append(f"{tag}line {name!r} alternative #{oi + 1}: no valid model could be built at "
                                    f"opsets {_opsets(rule)} (add an 'example' with input shapes)")
    return first_ok


def _test_mutants(rule: Rule, inst: dict[str, Expr], rep: RuleReport) -> None:
    mutants: list[tuple[str, _Mutation]] = []
    used = {r for e in inst.values() for r in _refs(e)}
    for name, con in rule.where.items():
        if con.const is not None and name in used:
            mutants.append((f"const {name} off by 10%", _Mutation(const_scale={name: 1.1})))
        if con.dtype is not None and name in used and con.dtype[0] in FLOATS:  # the mutant changes the float type
            bad = next((d for d in (onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, FLOAT)
                        if d not in con.dtype), None)
            if bad is not None:
                mutants.append((f"{name} as {onnx.TensorProto.DataType.Name(bad).lower()}", _Mutation(dtype=bad)))
    for name in inst:
        if name != rule.root and name not in rule.exposed and not (rule.where.get(name) and rule.where[name].shared):
            mutants.append((f"extra consumer on {name}", _Mutation(extra_output=name)))
    for label, mut in mutants:
        built = _valid_build(rule, inst, True, mut, run_reference=mut.dtype is None)
        if built is None:
            built_model = _Builder(rule, inst, _opsets(rule)[0], True, mut, np.random.default_rng(0)).build()[0]
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
