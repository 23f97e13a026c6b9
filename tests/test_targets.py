"""Kernels per target: the published table (generated from onnxruntime's OperatorKernels.md) against the live
CPU registry, the checks `--target` makes (op, opset, element type), per-target rule conditions, and an audit
of every built-in rule against the targets it declares."""

import ast
import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import ROOT, make_model, save
from onnx import TensorProto

from onnxfuse import OptimizeOptions, builtin_patterns_dir, load_rules, optimize
from onnxfuse.errors import PatternError
from onnxfuse.kernels.applicable import declared_dtypes, rule_issue, rule_usage
from onnxfuse.kernels.generate import parse, parse_types, parse_versions, to_json_text
from onnxfuse.patterns.parser import parse_text
from onnxfuse.targets import (
    OPEN,
    _live,
    available,
    facts_file,
    get,
    kernel_issue,
    kernel_source,
    table_source,
)

EXCERPT = """\
## Operators implemented by CPUExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *ai.onnx*||||
|Abs|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(double), tensor(float)|
|||[6, 12]|**T** = tensor(float)|
|Loop|*in* M:**I**<br> *out* v:**V**|19+|**I** = tensor(int64)<br/> **V** = seq(tensor(float)), optional(tensor(bool)), tensor(float), tensor(int8)|
|Upsample|*in* X:**T**<br> *out* Y:**T**|9|**T** = tensor(float)|
| |
| |
|**Operator Domain:** *ai.onnx.ml*||||
|Binarizer|*in* X:**T**<br> *out* Y:**T**|1+|**T** = tensor(float)|
| |
| |
|**Operator Domain:** *com.microsoft*||||
|FusedConv|*in* X:**T**<br> *in* W:**T**<br> *out* Y:**T**|1+|**T** = tensor(float)|
| |
| |

<a name="cudaexecutionprovider"/>

## Operators implemented by CUDAExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *ai.onnx*||||
|ThresholdedRelu|*in* X:**T**<br> *out* Y:**T**|10+|**T** = tensor(double), tensor(float16)|
|||1+|**T** = tensor(float)|
|**Operator Domain:** *com.microsoft*||||
|GroupNorm|*in* X:**T**<br> *in* gamma:**M**<br> *out* Y:**T**|1+|**M** = tensor(float)<br/> **T** = tensor(float), tensor(float16)|

## Operators implemented by DmlExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *ai.onnx*||||
|Abs|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(float)|
"""


# ----- the generator --------------------------------------------------------------------------------------
def test_generator_parses_an_excerpt_of_operator_kernels_md():
    t = parse(EXCERPT)
    assert set(t) == {"CPUExecutionProvider", "CUDAExecutionProvider"}  # DML left out
    cpu = t["CPUExecutionProvider"]
    assert set(cpu) == {"", "com.microsoft"}  # ai.onnx written "", ai.onnx.ml left out
    abs_ = cpu[""]["Abs"]
    assert [(k.since, k.until, k.types) for k in abs_] == [(13, None, {"T": ["double", "float"]}),
                                                          (6, 12, {"T": ["float"]})]
    loop = cpu[""]["Loop"][0]
    assert loop.types == {"I": ["int64"], "V": ["float", "int8"]}  # seq/optional types dropped
    assert (cpu[""]["Upsample"][0].since, cpu[""]["Upsample"][0].until) == (9, 9)
    assert cpu["com.microsoft"]["FusedConv"][0].types == {"T": ["float"]}
    cuda = t["CUDAExecutionProvider"]
    assert [(k.since, k.until) for k in cuda[""]["ThresholdedRelu"]] == [(10, None), (1, None)]
    assert cuda["com.microsoft"]["GroupNorm"][0].types == {"M": ["float"], "T": ["float", "float16"]}
    text = to_json_text(t, {"commit": "abc"})
    assert '"FusedConv": [[1,null,{"T":["float"]}]]' in text


def test_generator_cells():
    assert parse_versions("13+") == (13, None)
    assert parse_versions("[6, 12]") == (6, 12)
    assert parse_versions("9") == (9, 9)
    assert parse_types("**T1** = tensor(float)<br/> **T2** = map(int64,tensor(float)), tensor(int64)") == {
        "T1": ["float"], "T2": ["int64"]}


def test_generator_refuses_a_file_without_the_sections():
    from onnxfuse.kernels.generate import TableError

    with pytest.raises(TableError, match="CUDAExecutionProvider"):
        parse(EXCERPT.split('<a name="cudaexecutionprovider"/>')[0])


def test_shipped_table_records_its_source():
    source, table = facts_file()
    assert source["repo"] == "microsoft/onnxruntime" and len(source["commit"]) == 40
    assert set(table) == {"CPUExecutionProvider", "CUDAExecutionProvider"}
    size = os.path.getsize(os.path.join(os.path.dirname(__file__), "..", "onnxfuse", "kernels", "ort_kernels.json"))
    assert size < 300_000


# ----- the table against the installed onnxruntime's CPU registry -------------------------------------------
def _overlapping(ks, since, until):
    return [k for k in ks if k.since <= until and since <= k.until]


def test_table_cpu_part_agrees_with_the_live_cpu_registry():
    """Every CPU kernel in the table is in the installed onnxruntime's registry, at an overlapping opset range,
    taking some of the same element types (the table may be older or newer than the installed onnxruntime, so
    overlap, not equality)."""
    _, table = facts_file()
    live = _live()["CPUExecutionProvider"]
    problems = []
    for (domain, op), ks in table["CPUExecutionProvider"].items():
        if (domain, op) not in live:
            problems.append(f"{domain}.{op}: not in the live registry")
            continue
        for k in ks:
            near = _overlapping(live[(domain, op)], k.since, k.until)
            if not near:
                problems.append(f"{domain}.{op} {k.opsets}: no live kernel at those opsets")
            elif k.types and all(n.types and not (k.types & n.types) for n in near):
                problems.append(f"{domain}.{op} {k.opsets}: no element type in common")
    assert not problems, problems[:20]
    assert len(table["CPUExecutionProvider"]) > 200  # both domains, not a sample


def _builtin_rules():
    return load_rules([os.path.join(builtin_patterns_dir(), "optional")])


def test_table_and_live_registry_agree_on_every_op_a_builtin_rule_emits():
    """For every com.microsoft op a built-in rule emits: the table and the live CPU registry agree on whether a
    CPU kernel exists, and on every dtype a rule declares for it."""
    table, live = table_source("cpu"), kernel_source("cpu")
    assert live.live and not table.live
    checked = 0
    for rule in _builtin_rules():
        for rn in rule.rewrite:
            if rn.call is None or rn.call.domain != "com.microsoft":
                continue
            d, op = rn.call.domain, rn.call.op
            assert (kernel_issue(d, op, "cpu", source=table) is None) == (kernel_issue(d, op, "cpu") is None), op
            for dtype, idx in declared_dtypes(rule, rn) or [(None, 0)]:
                a = kernel_issue(d, op, "cpu", dtype, None, idx, source=table)
                b = kernel_issue(d, op, "cpu", dtype, None, idx)
                assert (a is None) == (b is None), (rule.id, op, dtype, a, b)
                checked += 1
    assert checked > 20


# ----- what --target checks -----------------------------------------------------------------------------
def test_fusedgemm_has_no_cuda_kernel():
    issue = kernel_issue("com.microsoft", "FusedGemm", "cuda")
    assert issue is not None and issue.startswith("no CUDA kernel for com.microsoft.FusedGemm")
    assert kernel_issue("com.microsoft", "FusedGemm", "cpu") is None
    if not available("cuda"):
        assert "published kernel table" in issue


def test_a_float16_the_kernel_does_not_list_is_refused():
    """CUDA FusedConv is registered for float only; CUDA GroupQueryAttention's T is float16/bfloat16 only (its
    other constraints, such as a float scale, do not count for the query input)."""
    issue = kernel_issue("com.microsoft", "FusedConv", "cuda", TensorProto.FLOAT16)
    assert issue and "does not take float16" in issue and "it takes float" in issue
    assert kernel_issue("com.microsoft", "FusedConv", "cuda", TensorProto.FLOAT) is None
    assert kernel_issue("com.microsoft", "GroupQueryAttention", "cuda", TensorProto.FLOAT16) is None
    issue = kernel_issue("com.microsoft", "GroupQueryAttention", "cuda", TensorProto.FLOAT)
    assert issue and "does not take float " in issue
    issue = kernel_issue("com.microsoft", "Gelu", "cpu", TensorProto.FLOAT16)
    assert issue and "the installed onnxruntime" in issue


def test_opset_ranges_of_onnx_domain_kernels():
    assert kernel_issue("", "RMSNormalization", "cuda", opset=23) is None
    issue = kernel_issue("", "RMSNormalization", "cuda", opset=17)
    assert issue and "at opset 17" in issue and "23+" in issue
    assert kernel_issue("", "HardSwish", "cuda", opset=14) is None
    assert kernel_issue("", "HardSwish", "cuda", opset=13) is not None
    # inputs of a fixed type or of a constraint the kernel does not restrict
    assert kernel_issue("", "Reshape", "cpu", TensorProto.INT64, 17, input=1) is None
    assert kernel_issue("", "Where", "cpu", TensorProto.BOOL, 17, input=0) is None
    assert kernel_issue("", "Where", "cpu", TensorProto.FLOAT16, 17, input=1) is not None


def test_messages_name_their_source():
    import onnxruntime as ort

    assert f"the installed onnxruntime {ort.__version__}" in kernel_issue("com.microsoft", "NhwcConv", "cpu")
    issue = kernel_issue("com.microsoft", "NoSuchOp", "cuda")
    source, _ = facts_file()
    assert issue and (f"the installed onnxruntime {ort.__version__}" in issue if available("cuda")
                      else f"published kernel table, OperatorKernels.md at {source['commit'][:7]}" in issue)
    assert kernel_issue("ai.onnx.ml", "Binarizer", "cuda") is None or available("cuda")  # not covered


def test_rule_declaring_cuda_for_fusedgemm_is_skipped(tmp_path):
    yaml_text = """rules:
- id: my-gemm-relu
  match:
    g: Gemm(A, B, C?)
    Y: Relu(g)
  rewrite:
    Y: com.microsoft.FusedGemm(A, B, C?, activation="Relu", copy_attrs=g)
  targets: [cpu, cuda]
"""
    (tmp_path / "p.yaml").write_text(yaml_text)
    nodes = [oh.make_node("Gemm", ["a", "b"], ["g"]), oh.make_node("Relu", ["g"], ["y"])]
    src = save(make_model(nodes, [("a", [2, 4])], [("y", [2, 3])],
                          {"b": np.ones((4, 3), np.float32)}), tmp_path / "m.onnx")
    opts = dict(patterns=[str(tmp_path / "p.yaml")], builtin=False, measure=False, validate=False)
    r = optimize(src, str(tmp_path / "o.onnx"), OptimizeOptions(target="cuda", **opts))
    skipped = {s.rule: s.reason for s in r.skipped}
    assert skipped["my-gemm-relu"].startswith("no CUDA kernel for com.microsoft.FusedGemm")
    r = optimize(src, str(tmp_path / "o.onnx"), OptimizeOptions(target="cpu", **opts))
    assert r.fired == {"my-gemm-relu": 1}


# ----- per-target conditions ------------------------------------------------------------------------------
CONV_ANY = """rules:
- id: conv-any
  match:
    c: Conv(X, W, B?)
    Y: Relu(c) | Sigmoid(c)
  where:
    X: {dtype: float32}
  rewrite:
    Y: com.microsoft.FusedConv(X, W, B?, activation=Y.op_type, copy_attrs=c)
  targets:
    cpu: {}
    cuda: {require: ['Y.op_type == "Relu"']}
"""


def _two_convs(tmp_path):
    w = np.random.default_rng(0).standard_normal((3, 3, 3, 3)).astype(np.float32)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c1"], ["r"]),
             oh.make_node("Conv", ["r", "w"], ["c2"], pads=[1, 1, 1, 1]), oh.make_node("Sigmoid", ["c2"], ["y"])]
    return save(make_model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 3, 8, 8])], {"w": w}), tmp_path / "m.onnx")


def test_a_target_condition_limits_the_rule_on_that_target_only(tmp_path):
    (tmp_path / "p.yaml").write_text(CONV_ANY)
    src = _two_convs(tmp_path)
    opts = dict(patterns=[str(tmp_path / "p.yaml")], builtin=False, measure=False)
    r = optimize(src, str(tmp_path / "cpu.onnx"), OptimizeOptions(target="cpu", **opts))
    assert r.fired == {"conv-any": 2} and r.validation.startswith("passed")
    r = optimize(src, str(tmp_path / "cuda.onnx"), OptimizeOptions(target="cuda", validate=False, **opts))
    assert r.fired == {"conv-any": 1}
    fused = [n for n in onnx.load(str(tmp_path / "cuda.onnx")).graph.node if n.op_type == "FusedConv"]
    assert [oh.get_attribute_value(a) for n in fused for a in n.attribute if a.name == "activation"] == [b"Relu"]


def test_target_conditions_are_parsed_and_checked():
    rule = parse_text(CONV_ANY, "p.yaml")[0]
    assert rule.targets == ("cpu", "cuda")
    assert [t for _, t in rule.conditions["cuda"]] == ['Y.op_type == "Relu"']
    assert rule.for_target("cpu") is rule
    assert rule.for_target("cuda").require[-1][1] == 'Y.op_type == "Relu" (on cuda)'
    u = rule_usage(rule, "cuda")
    assert u.used == "partly" and 'only when Y.op_type == "Relu"' in u.why
    bad = {"unknown target 'tpu'": "    tpu: {}\n", "unknown key 'requires' for target 'cuda'": "    cuda: {requires: []}\n",
           "undefined name 'Z' in the cuda condition": "    cuda: {require: ['Z.op_type == 1']}\n"}
    head = CONV_ANY.split("  targets:\n")[0] + "  targets:\n"
    for message, body in bad.items():
        with pytest.raises(PatternError, match=message):
            parse_text(head + body, "p.yaml")


# ----- the audit of the built-in rules -------------------------------------------------------------------
# What the kernel tables cannot say: attribute values a kernel accepts. CUDA FusedConv maps only activation
# "Relu" to cuDNN (onnxruntime/contrib_ops/cuda/fused_conv.cc, MapMode) and fails without one.
CUDA_ATTRIBUTE_LIMITS = {("com.microsoft", "FusedConv"): ("activation", {"Relu"})}


def test_every_builtin_rule_has_kernels_on_the_targets_it_declares():
    """For every built-in rule and target it declares: every op it emits has a kernel there (at some opset of
    the rule's range), taking at least one of the dtypes the rule declares for it; every declared dtype runs on
    at least one declared target; and attribute values stay within what the CUDA kernels accept."""
    problems = []
    for rule in _builtin_rules():
        # a rule that declares no targets is for every one: a probed target (openvino) uses it where its facts
        # allow; onnxruntime's registry targets (cpu, cuda) are held to it as before
        audited = rule.targets if rule.declared else tuple(t for t in rule.targets if get(t).facts == "registry")
        for target in audited:
            issue = rule_issue(rule, target, None)
            if issue:
                problems.append(f"{rule.id} on {target}: {issue}")
        for rn in rule.rewrite:
            if rn.call is None:
                continue
            for dtype, idx in declared_dtypes(rule, rn):
                if all(kernel_issue(rn.call.domain, rn.call.op, t, dtype, None, idx) for t in audited):
                    problems.append(f"{rule.id}: {rn.call.op} runs {TensorProto.DataType.Name(dtype)} on none "
                                    f"of {audited}")
            limit = CUDA_ATTRIBUTE_LIMITS.get((rn.call.domain, rn.call.op))
            if limit and "cuda" in rule.targets and not rule.conditions.get("cuda"):
                expr = rn.attrs.get(limit[0])
                value = expr.node.value if expr is not None and isinstance(expr.node, ast.Constant) else None
                if value not in limit[1]:
                    wrote = ast.unparse(expr.node) if expr is not None else "none"
                    problems.append(f"{rule.id}: CUDA {rn.call.op} takes {limit[0]} in {sorted(limit[1])}, the "
                                    f"rule writes {wrote} (declare cpu only, or a cuda condition)")
    assert not problems, problems


def test_builtin_kernel_usage_per_target():
    """The rules a CPU-only onnxruntime plans for CUDA: FusedGemm and the non-Relu FusedConv rules are not used,
    NhwcConv and HardSwish are."""
    rules = {r.id: r for r in _builtin_rules()}
    assert rule_usage(rules["gemm-activation"], "cuda").used == "no"
    assert "no CUDA kernel for com.microsoft.FusedGemm" in rule_usage(rules["gemm-activation"], "cuda").why
    assert rule_usage(rules["conv-relu"], "cuda").used == "yes"
    assert rule_usage(rules["conv-activation"], "cuda").why.startswith("declared for cpu only")
    assert rule_usage(rules["conv-nhwc"], "cuda").used == "yes"
    assert "no CPU kernel for com.microsoft.NhwcConv" in rule_usage(rules["conv-nhwc"], "cpu").why
    assert rule_usage(rules["hardswish"], "cuda").used == "yes"
    assert kernel_source("cuda").label and OPEN > 10**9


@pytest.mark.parametrize("name", sorted(
    [f for f in os.listdir(os.path.join(ROOT, "models")) if f.endswith(".onnx")]
    + [os.path.join("transformers", f) for f in os.listdir(os.path.join(ROOT, "models", "transformers"))
       if f.endswith(".onnx")]))
def test_cuda_outputs_have_a_kernel_for_every_created_node(tmp_path, name):
    """--target cuda on the bundled models: every node onnxfuse creates has a CUDA kernel (per the published
    table, no GPU needed) at the model's opset and for the element type of its first input."""
    r = optimize(os.path.join(ROOT, "models", name), None,
                 OptimizeOptions(target="cuda", validate=False, measure=False))
    m = onnx.shape_inference.infer_shapes(r.model)
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.value_info) + list(m.graph.input)
             + list(m.graph.output)}
    types.update({t.name: t.data_type for t in m.graph.initializer})
    created = [n for n in m.graph.node if n.doc_string.startswith("onnxfuse: rule=") and n.op_type != "Constant"]
    problems = [f"{n.name}: {issue}" for n in created
                if (issue := kernel_issue(n.domain, n.op_type, "cuda", types.get(n.input[0]) if n.input else None,
                                          opset=opset, source=table_source("cuda")))]
    assert problems == []


def _loaded_models(monkeypatch) -> list:
    """Every model handed to onnxruntime from now on (bytes or a path), as loaded."""
    import onnx
    import onnxruntime as ort

    seen: list = []
    real = ort.InferenceSession

    def spy(model, *args, **kwargs):
        seen.append(onnx.load_from_string(model) if isinstance(model, bytes)
                    else onnx.load(str(model), load_external_data=False))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    return seen


def test_models_onnxfuse_builds_pin_the_lowest_ir_their_opsets_need(monkeypatch):
    """The NCHWc probe and the self-test's models are built by onnxfuse itself: they carry the IR version their
    opsets need (opset 13: IR 7), not the installed onnx's newest, which an older onnxruntime refuses."""
    import onnx

    from onnxfuse.inspect.selftest import check_rule
    from onnxfuse.model_proto import min_ir_version
    from onnxfuse.patterns.parser import load_path

    seen = _loaded_models(monkeypatch)
    from onnxfuse import targets

    targets._probe_nchwc.__wrapped__()  # the cached probe, run again
    assert [m.ir_version for m in seen] == [7] and onnx.IR_VERSION > 7
    del seen[:]
    rule = next(r for r in load_path(os.path.join(ROOT, "patterns", "activation.yaml")) if r.id == "silu")
    assert check_rule(rule).ok
    assert seen, "the self-test ran no model"
    assert all(m.ir_version == min_ir_version(m.opset_import) < onnx.IR_VERSION for m in seen), \
        sorted({(m.ir_version, tuple((o.domain, o.version) for o in m.opset_import)) for m in seen})
