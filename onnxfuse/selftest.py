"""Tests generated from a rule itself (`onnxfuse patterns test`).

For every alternative of the match (and once more with every commutative operand swapped and optional inputs
left out), build a small model, check the rule fires exactly once and onnxruntime gives the same outputs
before and after. Then build mutants that must NOT fire: a constant out of tolerance, an extra consumer on an
interior value, a dtype the rule does not allow.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

from .ir import Model
from .opschema import op_spec
from .patterns.rules import Rule
from .patterns.syntax import Alt, Call, Expr, Ref
from .rewrite.engine import EngineOptions, rule_issue, run
from .targets import kernel_issue, provider_registered

MAX_INSTANCES = 48
DEFAULT_DIM = 4
NAMED_DIMS = {"k": 8}
FLOAT = onnx.TensorProto.FLOAT


@dataclass
class RuleReport:
    rule: str
    instances: int = 0
    mutants: int = 0
    problems: list[str] = field(default_factory=list)
    unrunnable: str | None = None  # fused op with no kernel on this machine: outputs not compared

    @property
    def ok(self) -> bool:
        return not self.problems and self.instances > 0

    @property
    def summary(self) -> str:
        what = (f"fired once (outputs not compared: {self.unrunnable})" if self.unrunnable
                else "fired once with equal outputs")
        return f"{self.instances} models {what}, {self.mutants} mutants did not fire"


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
        floats = (FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
        for con in self.rule.where.values():
            if con.dtype and con.dtype[0] in floats:
                return con.dtype[0]
        return FLOAT

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


def _typed(model: onnx.ModelProto) -> Model:
    inferred = onnx.shape_inference.infer_shapes(model)
    from .loader import _merge_types

    m = Model(model, ".")
    _merge_types(m.graph, inferred.graph)
    return m


def _target(rule: Rule, opset: int) -> str:
    """The first of the rule's targets it can be used on with the installed onnxruntime."""
    return next((t for t in rule.targets if rule_issue(rule, t, opset) is None), rule.targets[0])


def _fires(rule: Rule, model: onnx.ModelProto) -> tuple[int, onnx.ModelProto]:
    m = _typed(model)
    res = run(m, [rule], EngineOptions(target=_target(rule, m.opset), fold=False))
    return sum(1 for a in res.applications if a.rule == rule.id), m.export()


def _ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from .validate import make_session

    return make_session(model.SerializeToString(), "disable").run(None, feeds)


def _valid_build(rule: Rule, inst: dict[str, Expr], with_optional: bool, mut: _Mutation
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int] | None:
    n_examples = max((len(v) for v in rule.example.values()), default=1)
    for opset, ex in itertools.product(_opsets(rule), range(n_examples)):
        b = _Builder(rule, inst, opset, with_optional, mut, np.random.default_rng(0), ex)
        try:
            model, feeds = b.build()
            onnx.checker.check_model(model, full_check=True)
            if mut.dtype is None:
                _ort_outputs(model, feeds)
            return model, feeds, opset
        except Exception:  # noqa: BLE001 - this opset cannot express the instance; try the next one
            continue
    return None


def _tolerance(model: onnx.ModelProto) -> float:
    return 1e-2 if any(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for i in model.graph.input) else 1e-4


def check_rule(rule: Rule) -> RuleReport:
    rep = RuleReport(rule.id)
    insts = instances(rule)
    first_ok: tuple[dict[str, Expr], int] | None = None
    covered: set[tuple[int, int]] = set()
    for k, (inst, choice) in enumerate(insts):
        for swap, with_opt in ((False, True), (True, False)):
            concrete = {n: _swap(e) for n, e in inst.items()} if swap else inst
            built = _valid_build(rule, concrete, with_opt, _Mutation())
            if built is None:
                continue  # this combination is not expressible at any opset (e.g. attribute and input axes)
            covered.update(enumerate(choice))
            model, feeds, opset = built
            fired, optimized = _fires(rule, model)
            where = f"alternative #{k + 1}{' swapped' if swap else ''} (opset {opset})"
            if fired != 1:
                rep.problems.append(f"{where}: fired {fired} times, expected once")
                continue
            missing = _no_kernel_here(optimized)
            if missing:
                rep.unrunnable = f"no kernel for {missing} on this machine"
                rep.instances += 1
                if first_ok is None and not swap:
                    first_ok = (concrete, opset)
                continue
            try:
                onnx.checker.check_model(optimized)
                before, after = _ort_outputs(model, feeds), _ort_outputs(optimized, feeds)
            except Exception as e:  # noqa: BLE001
                rep.problems.append(f"{where}: optimized model does not load/run: {str(e).splitlines()[0][:160]}")
                continue
            tol = _tolerance(model)
            for x, y in zip(before, after, strict=True):
                if x.shape != y.shape or not np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True):
                    err = float(np.max(np.abs(x - y))) if x.shape == y.shape else float("nan")
                    rep.problems.append(f"{where}: outputs differ (max abs {err:.3g}, shapes {x.shape} {y.shape})")
                    break
            else:
                rep.instances += 1
                if first_ok is None and not swap:
                    first_ok = (concrete, opset)
    for li, name in enumerate(rule.line_names()):
        for oi in range(len(_expand(rule.lines[name]))):
            if (li, oi) not in covered:
                rep.problems.append(f"line {name!r} alternative #{oi + 1}: no valid model could be built at opsets "
                                    f"{_opsets(rule)} (add an 'example' with input shapes)")
    if first_ok is not None:
        _test_mutants(rule, first_ok[0], rep)
    return rep


def _test_mutants(rule: Rule, inst: dict[str, Expr], rep: RuleReport) -> None:
    mutants: list[tuple[str, _Mutation]] = []
    used = {r for e in inst.values() for r in _refs(e)}
    for name, con in rule.where.items():
        if con.const is not None and name in used:
            mutants.append((f"const {name} off by 10%", _Mutation(const_scale={name: 1.1})))
        if con.dtype is not None and name in used:
            bad = next((d for d in (onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, FLOAT)
                        if d not in con.dtype), None)
            if bad is not None:
                mutants.append((f"{name} as {onnx.TensorProto.DataType.Name(bad).lower()}", _Mutation(dtype=bad)))
    for name in inst:
        if name != rule.root and name not in rule.exposed and not (rule.where.get(name) and rule.where[name].shared):
            mutants.append((f"extra consumer on {name}", _Mutation(extra_output=name)))
    for label, mut in mutants:
        built = _valid_build(rule, inst, True, mut)
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
