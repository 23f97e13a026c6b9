"""The function concept (concepts/computes.py, concepts/function_regions.py): `computes(x, "gelu" | "gelu_tanh" | "silu" | "layernorm" |
"rmsnorm")` is proved by running the ops between x and the value, so spellings no rule lists fuse (ReduceSum over
the count, a positive axis, Pow(-0.5), casts around a float16 norm, Gelu with the half distributed), a region that
computes another function is refused with the concept's reason, and a bad `computes` is one error line with its
column."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model
from onnx import TensorProto
from rules.conftest import check_fires, check_misses, why_not

from onnxfuse.concepts.function_regions import FUNCTIONS, regions
from onnxfuse.ir import Model

K = 16
RNG = np.random.default_rng(1)
GAMMA = RNG.uniform(0.5, 1.5, K).astype(np.float32)
BETA = RNG.standard_normal(K).astype(np.float32)


def _ln_sum_count(axis=2, rsqrt="pow"):
    """LayerNorm as a converter may write it: mean as ReduceSum / K over a positive axis, 1/sqrt as Pow(-0.5)."""
    nodes = [oh.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1),
             oh.make_node("Div", ["s", "k"], ["mean"]),
             oh.make_node("Sub", ["x", "mean"], ["d"]),
             oh.make_node("Mul", ["d", "d"], ["sq"]),
             oh.make_node("ReduceSum", ["sq", "ax"], ["ss"], keepdims=1),
             oh.make_node("Mul", ["ss", "invk"], ["var"]),
             oh.make_node("Add", ["var", "eps"], ["ve"])]
    if rsqrt == "pow":
        nodes += [oh.make_node("Pow", ["ve", "mhalf"], ["r"]), oh.make_node("Mul", ["r", "d"], ["n"])]
    else:
        nodes += [oh.make_node("Sqrt", ["ve"], ["sd"]), oh.make_node("Div", ["d", "sd"], ["n"])]
    nodes += [oh.make_node("Mul", ["n", "gamma"], ["g"]), oh.make_node("Add", ["g", "beta"], ["y"])]
    inits = {"ax": np.asarray([axis], np.int64), "k": np.float32(K), "invk": np.float32(1.0 / K),
             "eps": np.float32(1e-6), "mhalf": np.float32(-0.5), "gamma": GAMMA, "beta": BETA}
    inits = {k: v for k, v in inits.items() if any(k in n.input for n in nodes)}
    return make_model(nodes, [("x", [2, 5, K])], [("y", [2, 5, K])], inits, opset=18)


@pytest.mark.parametrize("rsqrt", ["pow", "sqrt"])
def test_layernorm_of_sums_over_a_positive_axis_is_layernorm(rsqrt):
    got = check_fires(_ln_sum_count(rsqrt=rsqrt), "layernorm-decomposed", ["LayerNormalization"], rtol=1e-4,
                      atol=1e-4)
    (ln,) = got.graph.node
    eps = next(a.f for a in ln.attribute if a.name == "epsilon")
    assert abs(eps - 1e-6) < 1e-12  # the eps the ops add, found by the proof


def test_a_sum_over_another_axis_is_not_layernorm():
    check_misses(_ln_sum_count(axis=1), "layernorm-decomposed",
                 "computes 'layernorm': the ops from 'x' compute something else")


def _rms_fp16_with_casts():
    """Llama's RMSNorm in float16: the input cast to float32, x * rsqrt(mean(x^2) + eps) there, cast back, times
    the float16 weight."""
    nodes = [oh.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
             oh.make_node("Pow", ["x32", "two"], ["sq"]),
             oh.make_node("ReduceMean", ["sq", "ax"], ["ms"], keepdims=1),
             oh.make_node("Add", ["ms", "eps"], ["ve"]),
             oh.make_node("Sqrt", ["ve"], ["sd"]),
             oh.make_node("Reciprocal", ["sd"], ["r"]),
             oh.make_node("Mul", ["x32", "r"], ["n32"]),
             oh.make_node("Cast", ["n32"], ["n"], to=TensorProto.FLOAT16),
             oh.make_node("Mul", ["gamma", "n"], ["y"])]
    inits = {"two": np.float32(2.0), "ax": np.asarray([-1], np.int64), "eps": np.float32(1e-6),
             "gamma": GAMMA.astype(np.float16)}
    return make_model(nodes, [("x", [2, 5, K], TensorProto.FLOAT16)], [("y", [2, 5, K], TensorProto.FLOAT16)], inits,
                      opset=18)


def test_a_float16_rmsnorm_computed_in_float32_between_casts_is_one_norm():
    got = check_fires(_rms_fp16_with_casts(), "rmsnorm-zero-skip",
                      ["Constant", "com.microsoft.SkipSimplifiedLayerNormalization"], rtol=2e-3,
                      atol=2e-3)
    norm = got.graph.node[-1]  # (its zero skip folded to a Constant: the shapes are static)
    assert norm.input[0] == "x" and norm.input[2] == "gamma"  # the float16 input itself: the casts are gone


def _gelu_distributed():
    """Gelu with the half distributed over the sum: x * (0.5 + 0.5 * erf(x * (1 / sqrt 2)))."""
    nodes = [oh.make_node("Mul", ["x", "isq2"], ["a"]), oh.make_node("Erf", ["a"], ["e"]),
             oh.make_node("Mul", ["e", "half"], ["he"]), oh.make_node("Add", ["half", "he"], ["p"]),
             oh.make_node("Mul", ["p", "x"], ["y"])]
    inits = {"isq2": np.float32(0.70710678), "half": np.float32(0.5)}
    return make_model(nodes, [("x", [2, 5, K])], [("y", [2, 5, K])], inits)


def test_gelu_with_the_half_distributed_is_gelu():
    check_fires(_gelu_distributed(), "erf-gelu", ["com.microsoft.Gelu"], rtol=1e-5, atol=1e-5)


def _graph(model):
    return Model(onnx.shape_inference.infer_shapes(model), ".").graph


def test_the_nearest_source_is_proved_first_and_a_rival_function_is_named():
    """Gelu after a bias Add: the region starts at the Add's output (the nearest source), so bias-gelu can take
    the Add; the tanh form is refused as Gelu by the family rule ("computes 'gelu_tanh'") when its constants
    make it nearer Gelu's tanh approximation than Gelu, told apart at float32 precision."""
    nodes = [oh.make_node("Add", ["x", "b"], ["xb"]), oh.make_node("Div", ["xb", "sq2"], ["a"]),
             oh.make_node("Erf", ["a"], ["e"]), oh.make_node("Add", ["e", "one"], ["p"]),
             oh.make_node("Mul", ["xb", "p"], ["m"]), oh.make_node("Mul", ["m", "half"], ["y"])]
    inits = {"b": BETA, "sq2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    g = _graph(make_model(nodes, [("x", [2, 5, K])], [("y", [2, 5, K])], inits))
    found = list(regions(g, "y", FUNCTIONS["gelu"], set(), lambda *a: None))
    assert [r.source for r in found] == ["xb"] and len(found[0].nodes) == 5
    reasons: list[str] = []
    assert not list(regions(g, "y", FUNCTIONS["gelu_tanh"], set(), lambda n, why, ns: reasons.append(why)))
    assert reasons == ["computes 'gelu_tanh': no Tanh on the way to 'y'"]


def test_a_silu_is_not_gelu_and_the_reason_says_what_it_computes_instead():
    nodes = [oh.make_node("Sigmoid", ["x"], ["s"]), oh.make_node("Mul", ["x", "s"], ["y"])]
    g = _graph(make_model(nodes, [("x", [2, K])], [("y", [2, K])], {}))
    assert [r.source for r in regions(g, "y", FUNCTIONS["silu"], set(), lambda *a: None)] == ["x"]
    reasons: list[str] = []
    assert not list(regions(g, "y", FUNCTIONS["gelu"], set(), lambda n, why, ns: reasons.append(why)))
    assert reasons == ["computes 'gelu': no Erf on the way to 'y'"]


def test_a_tanh_gelu_is_told_apart_from_gelu_by_which_it_is_nearer():
    """The tanh approximation is within 5e-4 of Gelu: tolerance alone at float16 would take it for Gelu; the
    family rule refuses it because it is nearer gelu_tanh. (A Gelu spelled with Tanh is checked as Gelu.)"""
    c = np.float16
    nodes = [oh.make_node("Pow", ["x", "three"], ["cu"]), oh.make_node("Mul", ["cu", "c1"], ["a"]),
             oh.make_node("Add", ["x", "a"], ["i"]), oh.make_node("Mul", ["i", "c2"], ["j"]),
             oh.make_node("Tanh", ["j"], ["t"]), oh.make_node("Add", ["t", "one"], ["p"]),
             oh.make_node("Mul", ["x", "p"], ["m"]), oh.make_node("Mul", ["m", "half"], ["y"]),
             oh.make_node("Erf", ["y"], ["z"])]  # an Erf after it: Gelu's cheap filter passes, the proof decides
    inits = {"three": c(3), "c1": c(0.044715), "c2": c(0.7978845608), "one": c(1), "half": c(0.5)}
    g = _graph(make_model(nodes, [("x", [2, K], TensorProto.FLOAT16)], [("z", [2, K], TensorProto.FLOAT16)], inits))
    assert [r.source for r in regions(g, "y", FUNCTIONS["gelu_tanh"], set(), lambda *a: None)] == ["x"]
    reasons: list[str] = []
    regions_z = list(regions(g, "y", FUNCTIONS["gelu"], set(), lambda n, why, ns: reasons.append(why)))
    assert not regions_z
    assert any("the ops from 'x' compute 'gelu_tanh'" in r or "no Erf" in r for r in reasons), reasons


USER_RULE = """rules:
- id: my-silu
  match:
    Y: computes(X, "silu")
  where:
    X: {dtype: [float32]}
  rewrite:
    Y: com.microsoft.QuickGelu(X, alpha=1.0)
"""


def test_a_users_rule_on_the_function_concept(tmp_path):
    from onnxfuse import OptimizeOptions, optimize

    # silu spelled x * 0.5 * (1 + tanh(x / 2)): exact, but with neither Sigmoid nor Exp, the ops `needs` names (the
    # cheap filter says why)
    nodes = [oh.make_node("Mul", ["x", "half"], ["h"]), oh.make_node("Tanh", ["h"], ["t"]),
             oh.make_node("Add", ["one", "t"], ["p"]), oh.make_node("Mul", ["h", "p"], ["y"])]
    m = make_model(nodes, [("x", [2, K])], [("y", [2, K])], {"one": np.float32(1), "half": np.float32(0.5)})
    src, out, pat = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "p.yaml"
    onnx.save(m, str(src))
    pat.write_text(USER_RULE)
    r = optimize(str(src), str(out), OptimizeOptions(patterns=[str(pat)], builtin=False, measure=False))
    assert r.fired == {}
    from onnxfuse import rules_from_yaml
    from onnxfuse.rewrite.engine import near_misses

    why = [m.reason for m in near_misses(Model(onnx.shape_inference.infer_shapes(m), "."), rules_from_yaml(USER_RULE), "cpu", min_progress=0)]
    assert any("no Exp or Sigmoid on the way to 'y'" in w for w in why), why
    # x / (1 + exp(-x)): no Sigmoid, but Exp
    nodes = [oh.make_node("Neg", ["x"], ["nx"]), oh.make_node("Exp", ["nx"], ["e"]),
             oh.make_node("Add", ["one", "e"], ["d"]), oh.make_node("Div", ["x", "d"], ["y"])]
    onnx.save(make_model(nodes, [("x", [2, K])], [("y", [2, K])], {"one": np.float32(1)}), str(src))
    r = optimize(str(src), str(out), OptimizeOptions(patterns=[str(pat)], builtin=False, measure=False))
    assert r.fired == {"my-silu": 1}
    nodes = [oh.make_node("Sigmoid", ["x"], ["s"]), oh.make_node("Mul", ["s", "x"], ["y"])]
    onnx.save(make_model(nodes, [("x", [2, K])], [("y", [2, K])], {}), str(src))
    r = optimize(str(src), str(out), OptimizeOptions(patterns=[str(pat)], builtin=False, measure=False))
    assert r.fired == {"my-silu": 1}
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["QuickGelu"]


def test_every_function_has_a_spelling_for_the_self_test():
    from onnxfuse.inspect.selftest_models import SPELLINGS

    assert set(SPELLINGS) == set(FUNCTIONS)


def test_explain_names_the_concept_for_a_norm_over_the_wrong_axis():
    why = why_not(_ln_sum_count(axis=1), "layernorm-decomposed")
    assert "off by" in why and "tolerance 1e-05" in why, why
