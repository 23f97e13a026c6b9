"""Random graphs for property-based tests: motifs the built-in patterns target (and near misses of them),
joined by glue ops, with random shapes, operand orders, perturbed constants, extra consumers and graph outputs.
Imported by tests/test_fuzz.py (bounded) and benchmarks/fuzz_long.py (longer); not run by itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.helper as oh
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper


@dataclass
class G:
    """A graph under construction; `cur` is the value the next motif reads."""

    draw: object
    rank4: bool
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    cur: str = "x"
    n: int = 0
    channels: int = 4

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name("k")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def scalar(self, value: float) -> str:
        """A scalar constant, sometimes off (the rule must then not fire): one in 20, so that a motif of five
        or six constants still fuses more often than not."""
        if self.draw(st.integers(0, 19)) == 0:
            value = value * self.draw(st.sampled_from([0.5, 1.1, -1.0]))
        return self.const(value)

    def exponent(self, value: float) -> str:
        """A Pow exponent, sometimes off by an even step (2 -> 4, 3 -> 5): never fractional, which would make
        Pow of a negative base NaN (an all-NaN output passes any closeness check)."""
        if self.draw(st.integers(0, 19)) == 0:
            value = value + 2.0
        return self.const(value)

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(oh.make_node(op, inputs, [out], name=self.name(f"/{op}"), **attrs))
        return out

    def binop(self, op: str, a: str, b: str) -> str:
        """A commutative op with a random operand order."""
        return self.node(op, [b, a] if self.draw(st.booleans()) else [a, b])

    def maybe_leak(self, value: str) -> None:
        """Sometimes an interior value is also read elsewhere or is a graph output."""
        choice = self.draw(st.integers(0, 11))
        if choice == 0:
            self.outputs.append(value)
        elif choice == 1:
            self.outputs.append(self.node("Identity", [value]))


def conv_block(g: G) -> None:
    c = g.channels
    w = g.const(np.random.default_rng(g.n).standard_normal((c, c, 3, 3)) * 0.2)
    args = [g.cur, w] + ([g.const(np.linspace(-0.1, 0.1, c))] if g.draw(st.booleans()) else [])
    y = g.node("Conv", args, pads=[1, 1, 1, 1])
    if g.draw(st.booleans()):
        g.maybe_leak(y)
        y = g.node("BatchNormalization", [y, g.const(np.linspace(0.5, 1.5, c)), g.const(np.linspace(-1, 1, c)),
                                          g.const(np.linspace(-0.2, 0.2, c)), g.const(np.linspace(0.5, 2, c))])
    g.maybe_leak(y)
    act = g.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip", "HardSwishD",
                                  "Residual", "none"]))
    if act == "LeakyRelu":
        y = g.node("LeakyRelu", [y], alpha=0.1)
    elif act == "Clip":
        y = g.node("Clip", [y, g.scalar(0.0), g.scalar(6.0)])
    elif act == "HardSwishD":
        t = g.node("Clip", [g.binop("Add", y, g.scalar(3.0)), g.scalar(0.0), g.scalar(6.0)])
        g.maybe_leak(t)
        y = g.node("Div", [g.binop("Mul", y, t), g.scalar(6.0)])
    elif act == "Residual":
        y = g.node("Relu", [g.binop("Add", y, g.cur)])
    elif act != "none":
        y = g.node(act, [y])
    g.cur = y


def gelu_block(g: G) -> None:
    x = g.cur
    if g.draw(st.booleans()):
        s = g.node("Div", [x, g.scalar(1.4142135)])
        p = g.binop("Add", g.node("Erf", [s]), g.scalar(1.0))
    else:
        cube = g.node("Pow", [x, g.exponent(3.0)])
        inner = g.binop("Add", x, g.binop("Mul", cube, g.scalar(0.044715)))
        p = g.binop("Add", g.node("Tanh", [g.binop("Mul", inner, g.scalar(0.7978845608))]), g.scalar(1.0))
    g.maybe_leak(p)
    g.cur = g.binop("Mul", g.binop("Mul", x, g.scalar(0.5)), p)


def layernorm(g: G, x: str, opset: int, exponent: str | None = None, mul_square: bool = False,
              gamma_shape: tuple[int, ...] = (), beta: bool = False, swap=lambda: False) -> str:
    """LayerNorm over the last axis written out: (x - mean) / sqrt(mean(d^exponent) + eps) * gamma (+ beta).
    `exponent` names a constant (or None with `mul_square` for d * d); `swap()` picks commutative orders."""
    axes_attr = opset < 18

    def mean(v: str) -> str:
        if axes_attr:
            return g.node("ReduceMean", [v], axes=[-1], keepdims=1)
        return g.node("ReduceMean", [v, g.const([-1], np.int64)], keepdims=1)

    def binop(op: str, a: str, b: str) -> str:
        return g.node(op, [b, a] if swap() else [a, b])

    d = g.node("Sub", [x, mean(x)])
    sq = g.node("Mul", [d, d]) if mul_square else g.node("Pow", [d, exponent])
    std = g.node("Sqrt", [binop("Add", mean(sq), g.const(1e-5))])
    g.maybe_leak(std)
    n = g.node("Div", [d, std])
    size = int(np.prod(gamma_shape))
    y = binop("Mul", n, g.const(np.linspace(0.5, 1.5, size).reshape(gamma_shape)))
    if beta:
        y = binop("Add", y, g.const(np.linspace(-1, 1, size).reshape(gamma_shape)))
    return y


def layernorm_block(g: G, opset: int) -> None:
    k = 6 if g.rank4 else 8  # the last axis
    square = g.draw(st.booleans())
    exponent = None if square else g.exponent(2.0)  # sometimes off: a near miss the rule must not take
    shape = g.draw(st.sampled_from([(k,), (1, k), (1,)]))  # gamma over the last axis, or broadcast
    g.cur = layernorm(g, g.cur, opset, exponent, square, shape, g.draw(st.booleans()),
                      swap=lambda: g.draw(st.booleans()))


def layernorm_chain(second_exponent: float, opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two LayerNorms in a row, the second squaring with Pow(d, second_exponent): a fixed regression case
    (exponent 1.0 made the original ill-conditioned)."""
    g = G(draw=None, rank4=False)
    g.maybe_leak = lambda value: None
    y = layernorm(g, "x", opset, g.const(2.0), gamma_shape=(8,), beta=True)
    y = layernorm(g, y, opset, g.const(second_exponent), gamma_shape=(8,), beta=True)
    return _finish(g, [y], [2, 5, 8], opset, np.random.default_rng(7))


def silu_block(g: G) -> None:
    x = g.cur
    s = g.node("Sigmoid", [x if g.draw(st.booleans()) else g.binop("Mul", x, g.scalar(1.702))])
    g.maybe_leak(s)
    g.cur = g.binop("Mul", x, s)


def transpose_block(g: G) -> None:
    """Transpose pairs: inverse (cancel) or not (merge), then back to the original layout."""
    rank = 4 if g.rank4 else 3
    rng = np.random.default_rng(g.n)
    perm = [int(i) for i in rng.permutation(rank)]
    t = g.node("Transpose", [g.cur], perm=perm)
    g.maybe_leak(t)
    if g.draw(st.booleans()):
        g.cur = g.node("Transpose", [t], perm=[int(i) for i in np.argsort(perm)])
        return
    q = [int(i) for i in rng.permutation(rank)]
    t2 = g.node("Transpose", [t], perm=q)
    composite = [perm[i] for i in q]
    g.cur = g.node("Transpose", [t2], perm=[int(i) for i in np.argsort(composite)])


def glue(g: G) -> None:
    op = g.draw(st.sampled_from(["Relu", "Neg", "Abs", "Add1"]))
    g.cur = g.binop("Add", g.cur, g.const(0.25)) if op == "Add1" else g.node(op, [g.cur])


@st.composite
def random_model(draw) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rank4 = draw(st.booleans())
    opset = draw(st.sampled_from([13, 17, 18]))
    g = G(draw, rank4)
    fusions = ([conv_block] if rank4 else []) + [gelu_block, silu_block, layernorm_block]
    motifs = fusions + [transpose_block, glue]
    for i in range(draw(st.integers(1, 5))):
        # the first motif is one a fusion rule targets (it may still be drawn as a near miss): a graph of glue
        # and Transposes alone would exercise the transpose rules only
        m = draw(st.sampled_from(fusions if i == 0 else motifs))
        if m is layernorm_block:
            layernorm_block(g, opset)
        else:
            m(g)
    g.outputs.append(g.cur)
    shape = [draw(st.sampled_from([1, 2])), g.channels, 6, 6] if rank4 else [draw(st.sampled_from([1, 2])), 5, 8]
    return _finish(g, g.outputs, shape, opset, np.random.default_rng(draw(st.integers(0, 2**16))))


def _finish(g: G, outputs: list[str], shape: list[int], opset: int,
            rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model (output types from shape inference) and a normal random feed for its input x."""
    outputs = list(dict.fromkeys(outputs))
    graph = oh.make_graph(g.nodes, "fuzz", [oh.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [oh.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], g.inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(model)
    for o, io in zip(model.graph.output, inferred.graph.output, strict=True):
        o.type.CopyFrom(io.type)
        if not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.SetInParent()
    return model, {"x": rng.standard_normal(shape).astype(np.float32)}
