"""Self-tests in every claimed dtype: float16 models are built in float16, compared with validation's float16
tolerance, and held back (with the kernel registry's reason) where the fused op has no float16 CPU kernel; the
optimizer refuses such a match on the CPU target."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
from onnx import TensorProto

from onnxfuse import OptimizeOptions, builtin_patterns_dir, explain, optimize
from onnxfuse.inspect import selftest
from onnxfuse.inspect.selftest import check_rule, claimed_dtypes
from onnxfuse.patterns.parser import load_path
from onnxfuse.targets import kernel_issue
from onnxfuse.validate.compare import default_tolerance

F16, F32, F64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE
BUILTIN = {r.id: r for r in load_path(builtin_patterns_dir(), builtin=True)}


def _rule(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return load_path(str(path))[0]


def test_claimed_dtypes_come_from_the_rules_dtype_list():
    assert claimed_dtypes(BUILTIN["layernorm-decomposed"]) == [F32, F16]
    assert claimed_dtypes(BUILTIN["embed-layernorm"]) == [F32, F16]  # the int ids are not the model's float type
    assert claimed_dtypes(BUILTIN["hardswish"]) == [F32, F16, F64]
    assert claimed_dtypes(BUILTIN["transpose-cancel"]) == [F32]  # no dtype constraint: tested as float32


def test_float16_models_are_built_in_float16():
    rule = BUILTIN["skip-layernorm-bias"]
    inst = selftest.instances(rule)[0][0]
    model, feeds, _, err = selftest._valid_build(rule, inst, True, selftest.Mutation(dtype=F16))
    assert err is None
    # every input in float16, BIAS among them (the kernel takes it at run time: the self-test feeds it)
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {F16}
    assert [i.name for i in model.graph.input] == ["A", "BIAS", "S", "GAMMA", "BETA"] and not model.graph.initializer
    assert {a.dtype for a in feeds.values()} == {np.dtype(np.float16)}


def test_float16_with_a_cpu_kernel_is_validated():
    report = check_rule(BUILTIN["layernorm-decomposed"], [F16])
    assert report.ok, report.problems
    res = report.dtype("float16")
    # every instance the self-test builds (each alternative of the rule, two models each) ran in float16
    assert res.status == "validated" and not res.held_back
    assert res.instances == sum(len(x) for x in selftest.instances(BUILTIN["layernorm-decomposed"])) == 4
    # the reference ran too: its float16 ops without a CPU kernel go through onnxruntime's float32 Casts
    assert "ReduceMean" in res.reference


def test_float16_without_a_cpu_kernel_is_held_back_with_the_registrys_reason():
    report = check_rule(BUILTIN["erf-gelu"])
    assert report.ok, report.problems
    assert report.dtype("float32").status == "validated"
    res = report.dtype("float16")
    assert res.status == "not validated here" and res.instances >= 1
    assert res.held_back == kernel_issue("com.microsoft", "Gelu", "cpu", F16)  # the registry's own words
    assert f"float16: {res.instances} models fired once, not validated here ({res.held_back})" in report.summary
    assert report.status == "ok"  # float32 was compared; float16 is reported as not validated here


def test_selftest_uses_validations_tolerance():
    assert not hasattr(selftest, "_tolerance")  # one source: validate.default_tolerance
    tol16, tol32 = default_tolerance(F16), default_tolerance(F32)
    x = np.linspace(-2, 2, 16)
    assert selftest._difference(x.astype(np.float16), (x + tol16.atol / 2).astype(np.float16)) is None
    assert selftest._difference(x.astype(np.float16), (x + tol16.atol * 3).astype(np.float16))
    assert selftest._difference(x.astype(np.float32), (x + tol32.atol * 3).astype(np.float32))


def test_a_wrong_rewrite_in_float16_is_caught(tmp_path):
    # Identity has a float16 CPU kernel, so the float16 instances are compared (not held back), and they differ.
    rule = _rule(tmp_path, """rules:
- id: clip-is-identity
  doc: wrong on purpose
  match:
    Y: Clip(X, LO, HI)
  where:
    X: {dtype: [float32, float16]}
    LO: {constant: true, shape: []}
    HI: {constant: true, shape: []}
  rewrite:
    Y: Identity(X)
""")
    report = check_rule(rule, [F16])
    assert not report.ok and report.dtype("float16").status == "validated"
    assert any(p.startswith("[float16]") and "outputs differ" in p and "float16 tolerance rtol 0.01" in p
               for p in report.problems), report.problems


def test_a_cpu_only_rule_claiming_float16_without_a_kernel_fails(tmp_path):
    rule = _rule(tmp_path, """rules:
- id: silu-cpu
  doc: claims float16 on the CPU, which has no float16 QuickGelu kernel
  match:
    Y: Mul(X, Sigmoid(X))
  where:
    X: {dtype: [float32, float16]}
  rewrite:
    Y: com.microsoft.QuickGelu(X, alpha=1.0)
  targets: [cpu]
""")
    report = check_rule(rule)
    assert report.dtype("float32").status == "validated"
    assert not report.ok
    why = kernel_issue("com.microsoft", "QuickGelu", "cpu", F16)
    assert any(f"claims float16 but applies on none of its targets (cpu: {why})" in p for p in report.problems)


def _erf_gelu_f16(tmp_path) -> str:
    import onnx
    from onnx import numpy_helper

    nodes = [oh.make_node("Div", ["x", "sqrt2"], ["d"]), oh.make_node("Erf", ["d"], ["e"]),
             oh.make_node("Add", ["e", "one"], ["p"]), oh.make_node("Mul", ["x", "half"], ["xh"]),
             oh.make_node("Mul", ["xh", "p"], ["y"])]
    consts = {"sqrt2": 1.4142135, "one": 1.0, "half": 0.5}
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F16, [2, 8])],
                          [oh.make_tensor_value_info("y", F16, [2, 8])],
                          [numpy_helper.from_array(np.array(v, np.float16), k) for k, v in consts.items()])
    path = str(tmp_path / "gelu16.onnx")
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_optimizer_refuses_a_float16_match_on_cpu_without_a_kernel(tmp_path):
    path = _erf_gelu_f16(tmp_path)
    res = optimize(path, str(tmp_path / "out.onnx"), OptimizeOptions(target="cpu", measure=False, only=["erf-gelu"]))
    assert "erf-gelu" not in res.fired and "com.microsoft.Gelu" not in res.ops_after
    why = explain(path, target="cpu", rule="erf-gelu").near_misses
    assert any(kernel_issue("com.microsoft", "Gelu", "cpu", F16) in m.reason for m in why), why
