"""The target registry (onnxfuse.targets.REGISTRY): every registered target's fields hold together, every other
module reads them (no provider spelled elsewhere), an unknown name is one line listing the registered ones, and
a target whose provider is missing here validates elsewhere and is not measured."""

import ast
import json
import pathlib
import re
from importlib import resources

import onnx
import pytest

from onnxfuse import OptimizeOptions, load_rules, optimize
from onnxfuse.errors import OnnxfuseError
from onnxfuse.kernels.applicable import rule_issue
from onnxfuse.patterns.spec import json_schema
from onnxfuse.targets import (
    HOST,
    REGISTRY,
    available,
    facts_file,
    get,
    kernel_issue,
    kernel_source,
    names,
    runs_on,
    session_providers,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CNN = str(ROOT / "models" / "cnn_small.onnx")
LAYOUTS = {"nchw", "nchwc", "nhwc"}


@pytest.mark.parametrize("name", names())
def test_each_registered_target_is_whole(name):
    t = REGISTRY[name]
    assert t.name == name and t.label
    assert t.provider.endswith("ExecutionProvider")
    providers = {u.provider for u in REGISTRY.values()}
    assert set(t.fallback) <= providers and t.provider not in t.fallback
    assert t.layout in LAYOUTS
    assert t.vector_width is None or t.vector_width > 0
    if t.runs_elsewhere is not None:
        assert t.runs_elsewhere in REGISTRY and REGISTRY[t.runs_elsewhere].runs_elsewhere is None
        assert t.install, "a target that can be missing says how to get it"
    if t.facts == "registry":
        src = kernel_source(name)
        assert src.kernels, f"{name}: no kernels in {src.label}"
    else:
        source, table = facts_file(t.facts)
        assert source["provider"] == t.provider and source["onnxruntime"] and source["probe"].endswith(name)
        assert set(table) == {t.provider} and table[t.provider]
        assert t.facts in kernel_source(name).label


def test_the_host_target_runs_here_and_needs_nothing_else():
    host = get(HOST)
    assert available(HOST) and runs_on(HOST) == HOST and host.runs_elsewhere is None and not host.fallback
    assert session_providers(HOST) == [host.provider]


@pytest.mark.parametrize("name", [n for n in names() if not available(n)])
def test_a_target_missing_here_runs_elsewhere_and_sessions_on_it_are_refused(name):
    t = get(name)
    assert runs_on(name) == t.runs_elsewhere
    with pytest.raises(OnnxfuseError, match=re.escape(t.install)):
        session_providers(name)


def test_session_providers_list_the_options_and_the_fallback(monkeypatch):
    from onnxfuse import targets

    t = get("openvino")
    monkeypatch.setattr(targets, "_available_providers", lambda: frozenset({t.provider, "CPUExecutionProvider"}))
    assert session_providers("openvino") == [(t.provider, {"device_type": "CPU"}), "CPUExecutionProvider"]
    # its own thread pool follows --threads (onnxruntime's intra-op count does not bound a compiled graph)
    assert session_providers("openvino", 1) == [(t.provider, {"device_type": "CPU", "num_of_threads": "1"}),
                                                "CPUExecutionProvider"]
    assert session_providers(HOST, 4) == ["CPUExecutionProvider"]


def test_an_unknown_target_is_one_line_naming_the_registered_ones(cli):
    code, out, err = cli("optimize", CNN, "o.onnx", "--target", "tpu")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"onnxfuse: error: --target tpu: expected one of the registered targets: {', '.join(names())}"]
    with pytest.raises(OnnxfuseError, match=r"^target='x': expected one of the registered targets: cpu, cuda, "
                                            r"openvino$"):
        OptimizeOptions(target="x").check()


def test_rules_and_their_schema_name_every_registered_target():
    target_schema = json_schema()["definitions"]["rule"]["properties"]["targets"]["oneOf"]
    assert target_schema[0]["items"]["enum"] == list(names())
    # a rule that does not say is for every target: its facts decide
    assert all(set(r.targets) == set(names()) for r in load_rules() if r.id == "reducemean-global-pool")


def _spelled(tree: ast.AST) -> list[ast.Constant]:
    """String constants naming a provider; a target's name compared with a target or provider, as a default, an
    annotated assignment's value or a call's argument."""
    def about_target(n: ast.AST) -> bool:
        text = ast.unparse(n)
        return "target" in text or "provider" in text

    found = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and n.value.endswith("ExecutionProvider")]
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and about_target(n):
            found += [c for c in [n.left, *n.comparators] for c in ast.walk(c)
                      if isinstance(c, ast.Constant) and c.value in REGISTRY]
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = n.args.posonlyargs + n.args.args
            pairs = list(zip(args[len(args) - len(n.args.defaults):], n.args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(n.args.kwonlyargs, n.args.kw_defaults, strict=True) if d is not None]
            found += [d for a, d in pairs if isinstance(d, ast.Constant) and d.value in REGISTRY]
        elif isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Constant) and n.value.value in REGISTRY:
            found.append(n.value)
        elif isinstance(n, ast.Call):
            found += [a for a in [*n.args, *(k.value for k in n.keywords)]
                      if isinstance(a, ast.Constant) and a.value in REGISTRY]
    return found


def test_no_module_but_targets_spells_a_provider_or_a_target():
    """Every other module reads the registry: no comparison, default or argument names a target, and no string
    names a provider, outside targets.py."""
    spelled = []
    for p in (ROOT / "onnxfuse").rglob("*.py"):
        if p.name == "targets.py":
            continue
        spelled += [f"{p.relative_to(ROOT)}:{n.lineno}: {n.value!r}" for n in _spelled(ast.parse(p.read_text()))]
    assert spelled == []


def test_the_spelling_check_finds_what_it_looks_for():
    code = ('def f(target: str = "cpu"):\n    if provider == "cuda": pass\n    return ["CPUExecutionProvider", '
            'kernel_issue("", "Relu", "openvino")]\nCPU = "cpu"\n')
    assert sorted(n.value for n in _spelled(ast.parse(code))) == ["CPUExecutionProvider", "cpu", "cuda", "openvino"]


def test_openvino_facts_refuse_what_the_provider_did_not_claim():
    """Read from the probed facts, not from onnxruntime here: a refused op gives the facts file as its source."""
    _, table = facts_file(get("openvino").facts)
    data = resources.files("onnxfuse.kernels").joinpath(get("openvino").facts).read_text()
    never = [q for q in json.loads(data)["refused"]
             if (("" if "." not in q else q.rpartition(".")[0]), q.rpartition(".")[2])
             not in table["OpenVINOExecutionProvider"]]
    assert never, "the probe refused nothing"
    for qual in never:
        domain, _, op = qual.rpartition(".")
        issue = kernel_issue(domain, op, "openvino", onnx.TensorProto.FLOAT, 17)
        assert issue and issue.startswith(f"no OpenVINO kernel for {qual}") and "openvino_kernels.json" in issue
    # an op nobody probed has no facts: refused, not assumed
    assert kernel_issue("com.microsoft", "GroupNorm", "openvino")
    # and the rules that make a refused op are not used on openvino, with that reason
    makers = [r for r in load_rules() if any((f"{d}.{o}" if d else o) in never for d, o in r.output_ops())
              and "openvino" in r.targets]
    assert makers
    for r in makers:
        assert "no OpenVINO kernel for" in (rule_issue(r, "openvino", None) or ""), r.id


def test_openvino_without_its_provider_validates_on_cpu_and_is_not_measured(tmp_path):
    if available("openvino"):
        pytest.skip("the installed onnxruntime has the OpenVINO provider")
    res = optimize(CNN, tmp_path / "o.onnx", OptimizeOptions(target="openvino", measure_budget_s=1))
    assert res.validation.startswith("passed on CPU (the installed onnxruntime has no OpenVINO execution "
                                            "provider)")
    assert res.measure.note == "not measured: the installed onnxruntime has no OpenVINO execution provider"
    made = {op for a in res.applications for op in a.ops}
    assert made, "nothing rewritten for openvino on the CNN"
    for qual in made:
        domain, _, op = qual.rpartition(".")
        assert kernel_issue(domain, op, "openvino") is None, qual


def test_docs_targets_table_lists_every_registered_target():
    page = (ROOT / "docs" / "targets.md").read_text()
    for name, t in REGISTRY.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/targets.md has no row for {name}"
        assert f"`{t.provider}`" in row
        if t.facts != "registry":
            assert f"kernels/{t.facts}" in row


def test_probed_facts_keep_only_what_the_provider_always_claimed():
    """kernel_probe's merge: runs of claimed opsets among the probed ones (open past the last probed), an opset
    where one node was claimed and another refused counts as refused, a contrib op refused anywhere is refused."""
    from onnxfuse.inspect.kernel_probe import OpFacts, claimed_ranges, facts_json

    assert claimed_ranges({13, 17}, {11, 13, 17, 21}) == [(13, 17)]
    assert claimed_ranges({17, 21}, {11, 17, 21}) == [(17, None)]
    assert claimed_ranges({11, 21}, {11, 17, 21}) == [(11, 11), (21, None)]
    f = {"float"}
    facts = {("", "Relu"): OpFacts({13: f, 17: f}, {}, {13, 17}),
             ("", "Expand"): OpFacts({13: f, 17: f}, {13: "not claimed"}, {13, 17}),
             ("com.microsoft", "FastGelu"): OpFacts({13: f}, {17: "not claimed"}, {13, 17}),
             ("com.microsoft", "Gelu"): OpFacts({13: f, 17: {"float16"}}, {}, {13, 17})}
    out = facts_json("openvino", facts)
    kernels = out["kernels"][get("openvino").provider]
    assert kernels[""] == {"Relu": [[13, None, {"T": ["float"]}]], "Expand": [[17, None, {"T": ["float"]}]]}
    assert kernels["com.microsoft"] == {"Gelu": [[1, None, {"T": ["float", "float16"]}]]}
    assert set(out["refused"]) == {"Expand", "com.microsoft.FastGelu"}
    assert out["source"]["provider"] == get("openvino").provider
