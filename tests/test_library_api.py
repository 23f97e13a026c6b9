"""onnxfuse inside other pipelines (docs/library.md): rewrite_model on a ModelProto in memory, rules as objects,
and FusionPass in onnx-ir's PassManager; the page's examples run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import MODELS, ROOT, make_model, op_types, ort_run

import onnxfuse

ir = pytest.importorskip("onnx_ir")
import onnx_ir.passes.common  # noqa: E402

BERT = os.path.join(MODELS, "transformers", "bert_ts17.onnx")  # 2 layers, hidden 64: TorchScript exporter output
BERT_FUSED = {"com.microsoft.EmbedLayerNormalization", "com.microsoft.Attention",
              "com.microsoft.SkipLayerNormalization", "com.microsoft.BiasGelu"}
DOUBLE_NEG = """
rules:
- id: double-neg
  doc: -(-x) is x.
  match:
    Y: Neg(Neg(X))
  rewrite:
    Y: X
"""


def _conv_bn_relu() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             oh.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
             oh.make_node("Relu", ["n"], ["y"], name="relu")]
    inits = {"W": rng.standard_normal((4, 3, 3, 3)), "B": rng.standard_normal(4), "s": rng.uniform(0.5, 1.5, 4),
             "b": rng.standard_normal(4), "m": rng.standard_normal(4), "v": rng.uniform(0.5, 1.5, 4)}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], inits, opset=17)


def _neg_neg_relu() -> onnx.ModelProto:
    nodes = [oh.make_node("Neg", ["x"], ["a"], name="n1"), oh.make_node("Neg", ["a"], ["b"], name="n2"),
             oh.make_node("Relu", ["b"], ["y"], name="relu")]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def _bert_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((2, 16), np.int64)
    mask[1, -3:] = 0
    return {"input_ids": rng.integers(0, 128, (2, 16)), "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (2, 16))}


def _assert_same_outputs(a, b, feeds, rtol=1e-4, atol=1e-4) -> None:
    for x, y in zip(ort_run(a, feeds), ort_run(b, feeds), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


# ----- rewrite_model ----------------------------------------------------------------------------------------
def test_rewrite_model_fires_exactly_and_keeps_the_numerics():
    proto = _conv_bn_relu()
    result = onnxfuse.rewrite_model(proto)
    assert isinstance(result, onnxfuse.RewriteResult)
    assert result.fired == {"conv-bn-fold": 1, "conv-relu": 1} and result.changed
    assert op_types(result.model) == ["com.microsoft.FusedConv"]
    onnx.checker.check_model(result.model)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    _assert_same_outputs(result.model, proto, {"x": x}, rtol=1e-5, atol=1e-5)


def test_the_callers_proto_is_unchanged():
    for proto in (_conv_bn_relu(), onnx.load(BERT)):
        before = proto.SerializeToString()
        result = onnxfuse.rewrite_model(proto)
        assert result.fired and proto.SerializeToString() == before
        result.model.graph.node.pop()  # the result shares nothing with the input
        assert proto.SerializeToString() == before


def test_rewrite_model_is_optimize_without_validation_and_measuring():
    proto = onnx.load(os.path.join(MODELS, "cnn_small.onnx"))
    result = onnxfuse.rewrite_model(proto)
    full = onnxfuse.optimize(proto, options=onnxfuse.OptimizeOptions(validate=False, measure=False))
    assert result.fired == full.fired and result.cleanups == full.cleanups
    assert result.model.SerializeToString() == full.model.SerializeToString()


def test_nothing_to_rewrite_is_no_change():
    nodes = [oh.make_node("Relu", ["x"], ["y"], name="relu")]
    result = onnxfuse.rewrite_model(make_model(nodes, [("x", [2, 3])], [("y", [2, 3])]))
    assert result.fired == {} and not result.changed and op_types(result.model) == ["Relu"]


def test_external_data_is_read_from_base_dir():
    styles = os.path.join(MODELS, "styles")
    path = os.path.join(styles, "bert_ir7_op13_external_data.onnx")
    light = onnx.load(path, load_external_data=False)
    with pytest.raises(onnxfuse.ModelError, match="no base_dir") as e:
        onnxfuse.rewrite_model(light)
    assert "\n" not in str(e.value)
    result = onnxfuse.rewrite_model(light, base_dir=styles)
    assert "com.microsoft.Attention" in op_types(result.model)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in result.model.graph.initializer)
    assert result.fired == onnxfuse.rewrite_model(onnx.load(path)).fired


@pytest.mark.parametrize("call, message", [
    (lambda: onnxfuse.rewrite_model(BERT), "expected an onnx.ModelProto, got str"),
    (lambda: onnxfuse.rewrite_model(_conv_bn_relu(), target="tpu"), "target='tpu'"),
    (lambda: onnxfuse.rewrite_model(_conv_bn_relu(), [3]), "rules=3: expected a Rule or a pattern file path"),
    (lambda: onnxfuse.rewrite_model(_conv_bn_relu(), 3), "rules=3: expected Rule objects"),
    (lambda: onnxfuse.rewrite_model(_conv_bn_relu(), ["no/such.yaml"]), "no such pattern file"),
    (lambda: onnxfuse.rules_from_yaml(DOUBLE_NEG.replace("double-neg", "constant-fold")), "internal step"),
    (lambda: onnxfuse.rules_from_yaml("rules:\n- id: x\n  match: {Y: Nope(}\n"), "<yaml>:"),
])
def test_errors_are_one_line_onnxfuse_errors(call, message):
    with pytest.raises(onnxfuse.OnnxfuseError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


# ----- rules as objects ---------------------------------------------------------------------------------------
def test_a_rule_filtered_out_as_an_object_does_not_fire():
    proto = _conv_bn_relu()
    rules = onnxfuse.load_rules()
    kept = [r for r in rules if r.id != "conv-relu"]
    result = onnxfuse.rewrite_model(proto, kept)
    assert result.fired == {"conv-bn-fold": 1}
    assert op_types(result.model) == ["Conv", "Relu"]
    bert = onnxfuse.rewrite_model(onnx.load(BERT), [r for r in rules if r.id != "self-attention"])
    assert "self-attention" not in bert.fired


def test_rules_from_yaml_files_and_folders_mix_in_one_list(tmp_path):
    proto = _neg_neg_relu()
    assert onnxfuse.rewrite_model(proto).fired == {}
    mine = onnxfuse.rules_from_yaml(DOUBLE_NEG)
    assert [r.id for r in mine] == ["double-neg"] and isinstance(mine[0], onnxfuse.Rule)
    result = onnxfuse.rewrite_model(proto, onnxfuse.load_rules() + mine)
    assert result.fired == {"double-neg": 1} and op_types(result.model) == ["Relu"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    _assert_same_outputs(result.model, proto, {"x": x}, rtol=0, atol=0)
    (tmp_path / "neg.yaml").write_text(DOUBLE_NEG)
    for rules in (str(tmp_path / "neg.yaml"), [tmp_path], [*onnxfuse.load_rules(), str(tmp_path / "neg.yaml")]):
        assert onnxfuse.rewrite_model(proto, rules).fired == {"double-neg": 1}
    assert onnxfuse.rewrite_model(_conv_bn_relu(), [tmp_path]).fired == {}  # a path adds its own rules only
    with pytest.raises(onnxfuse.OnnxfuseError, match="'double-neg' is given twice"):
        onnxfuse.rewrite_model(proto, [*mine, tmp_path])


def test_the_list_order_is_the_file_order():
    """Rules given as objects are tried in the list's order (after match size), as files are."""
    text = DOUBLE_NEG + DOUBLE_NEG.replace("rules:\n", "").replace("double-neg", "double-neg-2")
    first, second = onnxfuse.rules_from_yaml(text)
    assert onnxfuse.rewrite_model(_neg_neg_relu(), [second, first]).fired == {"double-neg-2": 1}
    assert onnxfuse.rewrite_model(_neg_neg_relu(), [first, second]).fired == {"double-neg": 1}


# ----- the onnx-ir pass -----------------------------------------------------------------------------------------
def test_fusion_pass_in_a_pass_manager_on_bert():
    model = ir.load(BERT)
    before = ir.serde.serialize_model(model).SerializeToString()
    fusion = onnxfuse.FusionPass()
    passes = ir.passes.PassManager([onnx_ir.passes.common.RemoveUnusedNodesPass(), fusion])
    result = passes(model)
    assert result.modified and result.model is not model
    fused = {f"{n.domain}.{n.op_type}" for n in result.model.graph if n.domain}
    assert fused == BERT_FUSED
    assert fusion.last_result.fired["self-attention"] == 2 and fusion.last_result.fired["skip-layernorm-bias"] == 4
    assert ir.serde.serialize_model(model).SerializeToString() == before  # functional: the input is as it was
    _assert_same_outputs(ir.serde.serialize_model(result.model), onnx.load(BERT), _bert_feeds())


def test_fusion_pass_takes_rules_as_objects_and_says_when_nothing_changed():
    neg = ir.serde.deserialize_model(_neg_neg_relu())
    fusion = onnxfuse.FusionPass(onnxfuse.rules_from_yaml(DOUBLE_NEG))
    result = fusion(neg)
    assert result.modified and [n.op_type for n in result.model.graph] == ["Relu"]
    again = fusion(result.model)
    assert not again.modified and again.model is not result.model  # a new model, as a FunctionalPass returns
    assert fusion.last_result.fired == {}


def test_fusion_pass_reads_external_data_from_its_folder():
    path = os.path.join(MODELS, "styles", "bert_ir7_op13_external_data.onnx")
    result = ir.passes.PassManager([onnxfuse.FusionPass()])(ir.load(path))
    assert result.modified and "Attention" in {n.op_type for n in result.model.graph}
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.integers(0, 2, (2, 8)) for i in onnx.load(path, load_external_data=False).graph.input}
    _assert_same_outputs(ir.serde.serialize_model(result.model), onnx.load(path), feeds)


def test_import_onnxfuse_leaves_onnx_ir_alone_and_a_missing_onnx_ir_is_one_line():
    code = ("import sys, onnxfuse\n"
            "onnxfuse.rewrite_model, onnxfuse.rules_from_yaml\n"
            "assert 'onnx_ir' not in sys.modules, 'imported onnx_ir'\n"
            "sys.modules['onnx_ir'] = None\n"
            "try:\n"
            "    onnxfuse.FusionPass\n"
            "except onnxfuse.OnnxfuseError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("onnxfuse.FusionPass needs the onnx-ir package, which is not installed "
                                  "(hint: pip install 'onnxfuse[ir]')")


# ----- docs/library.md ----------------------------------------------------------------------------------------
def test_the_library_page_examples_run(tmp_path, monkeypatch, capsys):
    text = open(os.path.join(ROOT, "docs", "library.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    shutil.copy(BERT, "model.onnx")
    scope: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/library.md block {i + 1}", "exec"), scope)  # noqa: S102 - the page's own examples
    assert scope["result"].modified and os.path.exists("model.fused.onnx")
    assert scope["fusion"].last_result.fired == onnxfuse.rewrite_model(onnx.load(BERT)).fired
    assert "'self-attention': 2" in capsys.readouterr().out
    fused = onnx.load("model.fused.onnx")
    assert BERT_FUSED <= set(op_types(fused))
    _assert_same_outputs(fused, onnx.load(BERT), _bert_feeds())
