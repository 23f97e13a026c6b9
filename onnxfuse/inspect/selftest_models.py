"""The small models a rule's self-test is built from: every alternative of its match (and the commutative
operands swapped), inputs and constants of the rule's dtype, shapes from its constraints and examples, and
the mutations (a constant out of tolerance, an extra consumer, a wrong dtype) that must not fire."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

from ..concepts.function_table import FUNCTIONS
from ..model_proto import make_model
from ..opschema import op_spec
from ..patterns.rules import Rule
from ..patterns.syntax import Alt, Call, Concept, Expr, Ref

MAX_INSTANCES = 48
DEFAULT_DIM = 4
NAMED_DIMS = {"k": 8}
FLOAT = onnx.TensorProto.FLOAT
FLOATS = (FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


def expand(e: Expr) -> list[Expr]:
    if isinstance(e, Alt):
        return [x for o in e.options for x in expand(o)]
    if isinstance(e, Concept):
        return [dataclasses.replace(e, arg=a) for a in expand(e.arg)]
    if isinstance(e, Call):
        return [Call(e.op, e.domain, list(args), e.kwargs, e.kw_offs, e.off, e.lits)
                for args in itertools.product(*[expand(a) for a in e.args])]
    return [e]


def swap_operands(e: Expr) -> Expr:
    if isinstance(e, Concept):
        return dataclasses.replace(e, arg=swap_operands(e.arg))
    if isinstance(e, Call):
        args = [swap_operands(a) for a in e.args]
        spec = op_spec(e.domain, e.op)
        if spec is not None and spec.commutative and len(args) == 2:
            args.reverse()
        return Call(e.op, e.domain, args, e.kwargs, e.kw_offs, e.off, e.lits)
    return e


def instances(rule: Rule) -> list[tuple[dict[str, Expr], tuple[int, ...]]]:
    """Every combination of alternatives (evenly thinned to MAX_INSTANCES), with each line's option index; for
    every alternative also the combination that takes the same alternative on most lines (a rule's second
    alternatives often go together: 3-D heads in every line)."""
    names = rule.line_names()
    options = [list(enumerate(expand(rule.lines[n]))) for n in names]
    combos = list(itertools.product(*options))
    if len(combos) > MAX_INSTANCES:
        step = len(combos) / MAX_INSTANCES
        picked = [combos[int(i * step)] for i in range(MAX_INSTANCES)]
        seen = {tuple(x[0] for x in c) for c in picked}
        for li, opts in enumerate(options):
            for oi, _ in opts:
                aligned = max((c for c in combos if c[li][0] == oi), key=lambda c, oi=oi: sum(x[0] == oi for x in c))
                key = tuple(x[0] for x in aligned)
                if key not in seen:
                    seen.add(key)
                    picked.append(aligned)
        combos = picked
    return [(dict(zip(names, (e for _, e in c), strict=True)), tuple(i for i, _ in c)) for c in combos]


# ----- building a model -------------------------------------------------------------------------------------


def np_of(elem: int) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(elem)


def input_type(call: Call, idx: int, opset: int, primary: int) -> int:
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


# The usual spelling of each function `computes(x, NAME)` proves (concepts/function_table.py FUNCTIONS), for the models
# `patterns test` builds: (value, op, inputs (values, or a float constant), attributes) in order, from x.
_MEAN = {"axes": [-1], "keepdims": 1}
SPELLINGS: dict[str, list[tuple[str, str, list, dict]]] = {
    "gelu": [("s", "Div", ["x", 1.4142135], {}), ("e", "Erf", ["s"], {}), ("p", "Add", ["e", 1.0], {}),
             ("m", "Mul", ["x", "p"], {}), ("y", "Mul", ["m", 0.5], {})],
    "gelu_tanh": [("c", "Pow", ["x", 3.0], {}), ("a", "Mul", ["c", 0.044715], {}), ("i", "Add", ["x", "a"], {}),
                  ("j", "Mul", ["i", 0.7978845608], {}), ("t", "Tanh", ["j"], {}), ("p", "Add", ["t", 1.0], {}),
                  ("h", "Mul", ["x", 0.5], {}), ("y", "Mul", ["h", "p"], {})],
    "silu": [("s", "Sigmoid", ["x"], {}), ("y", "Mul", ["x", "s"], {})],
    "quickgelu": [("a", "Mul", ["x", 1.702], {}), ("s", "Sigmoid", ["a"], {}), ("y", "Mul", ["x", "s"], {})],
    "hardsigmoid": [("a", "Add", ["x", 3.0], {}), ("c", "Clip", ["a", 0.0, 6.0], {}), ("y", "Div", ["c", 6.0], {})],
    "hardswish": [("a", "Add", ["x", 3.0], {}), ("c", "Clip", ["a", 0.0, 6.0], {}), ("m", "Mul", ["x", "c"], {}),
                  ("y", "Div", ["m", 6.0], {})],
    "layernorm": [("m", "ReduceMean", ["x"], _MEAN), ("d", "Sub", ["x", "m"], {}), ("q", "Pow", ["d", 2.0], {}),
                  ("v", "ReduceMean", ["q"], _MEAN), ("e", "Add", ["v", 1e-5], {}), ("r", "Sqrt", ["e"], {}),
                  ("y", "Div", ["d", "r"], {})],
    "rmsnorm": [("q", "Pow", ["x", 2.0], {}), ("v", "ReduceMean", ["q"], _MEAN), ("e", "Add", ["v", 1e-5], {}),
                ("r", "Sqrt", ["e"], {}), ("y", "Div", ["x", "r"], {})],
}
assert set(SPELLINGS) == set(FUNCTIONS), "each function of the language has a spelling here"


@dataclass
class Mutation:
    const_scale: dict[str, float] = field(default_factory=dict)  # value name -> multiply const by this
    extra_output: str | None = None  # interior line to expose through an extra consumer
    dtype: int | None = None  # replace the primary float type


class Builder:
    def __init__(self, rule: Rule, inst: dict[str, Expr], opset: int, with_optional: bool, mut: Mutation,
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
        elem = input_type(call, idx, self.opset, self.primary)
        if con is not None and con.dtype and con.dtype[0] in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            elem = con.dtype[0]  # e.g. token ids, or an int64 buffer read by a Slice
        shape = self._shape(name)
        fixed = self.rule.example_attrs.get(("", name))
        if fixed is not None and not self.mut.const_scale.get(name):
            self.inits.append(numpy_helper.from_array(np.asarray(fixed, dtype=np_of(elem)), name))
        elif con is not None and con.const is not None:
            c = con.const * self.mut.const_scale.get(name, 1.0)
            if name in self.mut.const_scale and (not c.any() or elem == onnx.TensorProto.INT64):
                c = con.const + 1
            data = np.broadcast_to(c, shape) if c.size == 1 else c.reshape(shape)
            self.inits.append(numpy_helper.from_array(np.asarray(data, dtype=np_of(elem)), name))
        elif con is not None and con.constant:
            data = self.rng.uniform(0.5, 1.5, size=shape) if elem != onnx.TensorProto.INT64 else np.ones(shape)
            self.inits.append(numpy_helper.from_array(np.asarray(data, dtype=np_of(elem)), name))
        else:
            self.inputs.append(oh.make_tensor_value_info(name, elem, shape))
            self.feeds[name] = np.asarray(self.rng.standard_normal(shape), dtype=np_of(elem))
        self.done[name] = name
        return name

    def emit(self, e: Expr, parent: Call | None = None, idx: int = 0) -> str:
        if isinstance(e, Ref):
            if e.name in self.inst or self.rule.head(e.name) in self.inst:
                return self.line(e.name)
            if e.optional and not self.with_optional:
                return ""
            if e.name == "_":
                return self.value(f"ANY{idx}", parent, idx) if parent else ""
            assert parent is not None
            return self.value(e.name, parent, idx)
        if isinstance(e, Concept):
            return self._concept(e, None)
        assert isinstance(e, Call)
        return self._node(e, None)[0]

    def _concept(self, c: Concept, out: str | None) -> str:
        """The usual spelling of a concept: Reshape to the source's atoms, Transpose, Reshape to the result's
        groups (steps that change nothing left out), and a Mul by 0.5 where it binds a scale; a mask is an Add
        of an input of the example's shape (or x's own), or nothing without the optional values (a causal mask is
        not optional: without it nothing is causal)."""
        x = self.emit(c.arg, Call("Identity", "", [c.arg]), 0)  # the chain's first op reads it: a float input
        if c.name == "computes":
            assert c.function is not None
            return self._spell(c.function, x, out)
        if c.name == "masked":
            if not self.with_optional and out is None and not c.causal:
                return x
            assert c.bias is not None
            if c.bias not in self.done:
                if c.bias not in self.example:
                    self.example[c.bias] = self._inferred_shape(x)
                self.value(c.bias, Call("Add", "", [c.arg, Ref(c.bias, True, 0)]), 1)
            self.n += 1
            name = out if out is not None else f"t{self.n}"
            self.nodes.append(oh.make_node("Add", [x, self.done[c.bias]], [name], name=f"n{self.n}_Add"))
            return name
        steps: list[tuple[str, list[str], dict]] = []
        if c.parsed is not None:
            lay = c.parsed
            src = self._inferred_shape(x)
            size: dict[str, int] = {a: v for (k, a), v in self.rule.example_attrs.items() if k == "axis"}
            for g, dim in zip(lay.source, src, strict=False):
                unknown = [a for a in g if a not in size]
                for a in unknown[:-1]:
                    size[a] = self.dims.get(a, 2)
                if unknown:
                    size[unknown[-1]] = dim // max(1, int(np.prod([size[a] for a in g if a != unknown[-1]])))
            atoms = lay.atoms
            order = [a for g in lay.result for a in g]
            perm = [atoms.index(a) for a in order]
            if any(a not in size for a in atoms):
                return x  # the source does not have the layout's rank: this combination builds no valid model
            if [size[a] for a in atoms] != list(src):
                steps.append(("Reshape", [self._int_const([size[a] for a in atoms])], {}))
            if perm != sorted(perm):
                steps.append(("Transpose", [], {"perm": perm}))
            final = [int(np.prod([size[a] for a in g])) for g in lay.result]
            if final != [size[a] for a in order]:
                steps.append(("Reshape", [self._int_const(final)], {}))
        if "scale" in c.facts:
            half = f"half{self.n}"
            self.inits.append(numpy_helper.from_array(np.asarray(0.5, dtype=np_of(self.primary)), half))
            steps.append(("Mul", [half], {}))
        if not steps:
            steps.append(("Identity", [], {}))
        for i, (op, extra, attrs) in enumerate(steps):
            self.n += 1
            name = out if (out is not None and i == len(steps) - 1) else f"t{self.n}"
            self.nodes.append(oh.make_node(op, [x, *extra], [name], name=f"n{self.n}_{op}", **attrs))
            x = name
        return x

    def _spell(self, function: str, x: str, out: str | None) -> str:
        """The usual spelling of a function `computes` proves (SPELLINGS), reading `x`, ending in `out`."""
        env = {"x": x}
        steps = SPELLINGS[function]
        for i, (name, op, args, attrs) in enumerate(steps):
            ins = []
            for a in args:
                if isinstance(a, float):
                    self.n += 1
                    c = f"c{self.n}"
                    self.inits.append(numpy_helper.from_array(np.asarray(a, dtype=np_of(self.primary)), c))
                    ins.append(c)
                else:
                    ins.append(env[a])
            attrs = dict(attrs)
            if op == "ReduceMean" and self.opset >= 18:  # axes as an input from opset 18
                ins.append(self._int_const(attrs.pop("axes")))
            self.n += 1
            env[name] = out if (out is not None and i == len(steps) - 1) else f"t{self.n}"
            self.nodes.append(oh.make_node(op, ins, [env[name]], name=f"n{self.n}_{op}", **attrs))
        return env[steps[-1][0]]

    def _int_const(self, values: list[int]) -> str:
        self.n += 1
        name = f"shape{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def _inferred_shape(self, value: str) -> list[int]:
        """The static shape of a value built so far (onnx shape inference on the partial model)."""
        if value in self.feeds:
            return list(self.feeds[value].shape)
        graph = oh.make_graph(list(self.nodes), "partial", list(self.inputs),
                              [oh.make_tensor_value_info(value, onnx.TensorProto.UNDEFINED, None)], list(self.inits))
        inferred = onnx.shape_inference.infer_shapes(make_model(graph, {"": self.opset, "com.microsoft": 1}))
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.name == value:
                return [d.dim_value for d in vi.type.tensor_type.shape.dim]
        return []

    def line(self, name: str) -> str:
        head = self.rule.head(name)
        if name not in self.done:
            call = self.inst[head]
            if isinstance(call, Concept):
                self._concept(call, name)
                self.done[name] = name
                return name
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
        model = make_model(graph, {"": self.opset, "com.microsoft": 1})
        inferred = onnx.shape_inference.infer_shapes(model)
        for o, io in zip(model.graph.output, inferred.graph.output, strict=True):
            o.type.CopyFrom(io.type)
            if o.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:  # e.g. a contrib op: no ONNX schema
                o.type.tensor_type.elem_type = self.primary
            if not o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.shape.SetInParent()
        return model, self.feeds


def rule_opsets(rule: Rule) -> list[int]:
    cands = [rule.opset_min, 11, 13, 17, 18, 21, 23, rule.opset_max]
    top = onnx.defs.onnx_opset_version()
    return sorted({o for o in cands if rule.opset_min <= o <= min(rule.opset_max, top) and o >= 7})


def claimed_dtypes(rule: Rule) -> list[int]:
    """The floating dtypes a rule claims: those of the first `dtype` constraint that starts with a floating type
    (the value the generated models are built around); float32 where no constraint names one."""
    for con in rule.where.values():
        if con.dtype and con.dtype[0] in FLOATS:
            return [d for d in con.dtype if d in FLOATS]
    return [FLOAT]


# ----- expanding alternatives -----------------------------------------------------------------------------
