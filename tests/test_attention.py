"""Self-attention fuses into com.microsoft.Attention on real exports (models/transformers: Hugging Face BERT,
GPT-2 and ViT with random weights, TorchScript opset 17 and dynamo opset 18), with equal numerics, including
a sample whose attention mask is all zeros (the exports' NaN guard must survive the fusion)."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import ort_run

from onnxfuse import OptimizeOptions, optimize

CORPUS = Path(__file__).resolve().parent.parent / "models" / "transformers"
FUSED = ["bert_ts17", "bert_eager_ts17", "bert_dynamo18", "bert_eager_dynamo18", "gpt2_ts17", "gpt2_dynamo18",
         "vit_ts17", "vit_dynamo18"]


def _feeds(name: str, fully_masked: bool) -> dict[str, np.ndarray]:
    spec = json.loads((CORPUS / "inputs.json").read_text())[f"{name}.onnx"]
    rng = np.random.default_rng(0)
    feeds = {}
    for i in spec["inputs"]:
        shape = i["shape"]
        if i["kind"] == "ids":
            feeds[i["name"]] = rng.integers(i["low"], i["high"], shape).astype(i["dtype"])
        elif i["kind"] == "mask":
            m = np.ones(shape, i["dtype"])
            m[1, -3:] = 0
            if fully_masked:
                m[0, :] = 0
            feeds[i["name"]] = m
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(i["dtype"])
    return feeds


@pytest.mark.parametrize("name", FUSED)
def test_attention_fuses_with_equal_numerics(name, tmp_path):
    src = str(CORPUS / f"{name}.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False))
    assert r.validation == "passed"
    attention_rules = {k: v for k, v in r.fired.items() if k.startswith("self-attention")}
    assert sum(attention_rules.values()) == 2, r.fired  # one per layer
    got = onnx.load(out)
    ops = [n.op_type for n in got.graph.node]
    assert ops.count("Attention") == 2 and "Softmax" not in ops
    # the NaN guard stays only where the exported mask uses -inf (TorchScript SDPA); finfo.min masks drop it
    assert ops.count("IsNaN") == (2 if name in ("bert_ts17", "gpt2_ts17") else 0), ops.count("IsNaN")
    if name.startswith("bert"):  # word + token type + position embeddings and their LayerNorm
        assert ops.count("EmbedLayerNormalization") == 1 and r.fired["embed-layernorm"] == 1
    att = next(n for n in got.graph.node if n.op_type == "Attention")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in att.attribute}["num_heads"] == 4
    for fully_masked in (False, True):
        feeds = _feeds(name, fully_masked)
        want = ort_run(onnx.load(src), feeds)[0]
        have = ort_run(got, feeds)[0]
        assert np.isnan(want).sum() == np.isnan(have).sum() == 0
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)


def test_packed_qkv_bias_is_query_key_value_in_order(tmp_path):
    """The dynamo export names its biases: the packed bias is layer 0's query, key and value biases, in order."""
    src = CORPUS / "bert_dynamo18.onnx"
    out = tmp_path / "out.onnx"
    optimize(str(src), str(out), OptimizeOptions(measure=False))
    got = onnx.load(str(out))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in got.graph.initializer}
    orig = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(src)).graph.initializer}
    att = next(n for n in got.graph.node if n.op_type == "Attention")  # layer 0 comes first
    w, b = inits[att.input[1]], inits[att.input[2]]
    assert w.shape == (64, 192) and b.shape == (192,)
    prefix = "model.encoder.layer.0.attention.self."
    want = np.concatenate([orig[prefix + p + ".bias"] for p in ("query", "key", "value")])
    np.testing.assert_array_equal(b, want)


@pytest.mark.parametrize("name", ["llama_ts17", "llama_dynamo18"])
def test_llama_rotary_and_rmsnorm_fuse_with_equal_numerics(name, tmp_path):
    """Rotary embeddings (q and k in each of 2 layers) -> RotaryEmbedding with the model's own cos/sin as the
    cache (kept: shared by all layers); residual + RMSNorm -> SkipSimplifiedLayerNormalization."""
    src = str(CORPUS / f"{name}.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False))
    assert r.validation == "passed"
    assert r.fired["rotary-embedding"] == 4 and r.fired["skip-rmsnorm"] == 4, r.fired
    got = onnx.load(out)
    ops = [n.op_type for n in got.graph.node]
    assert ops.count("RotaryEmbedding") == 4 and ops.count("Cos") == 1 and ops.count("Sin") == 1
    assert "Neg" not in ops  # every rotate_half is gone
    # grouped-query attention after repeat_kv (heads already split); the head count comes from the output
    # projection's weight where every Reshape target was computed with -1 (TorchScript)
    assert ops.count("MultiHeadAttention") == 2 and "Softmax" not in ops
    feeds = _feeds(name, fully_masked=False)
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-4, atol=1e-4)


def test_shared_line_must_not_read_a_removed_line():
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.patterns.parser import parse_text

    text = """rules:
- id: r
  match:
    n: Neg(X)
    s: Sigmoid(n)
    Y: Mul(s, n)
  where:
    s: {shared: true}
  rewrite:
    Y: X
"""
    with pytest.raises(OnnxfuseError) as e:
        parse_text(text, "f.yaml")
    assert "f.yaml:5:16: error: shared line 's' reads line 'n', which is not shared" in str(e.value)


def test_classic_bert_row_mask_is_expanded_and_exact(tmp_path):
    """models/transformer_small.onnx: the additive mask is (1 - mask) * -10000 of shape [b, 1, 1, s]; it is
    expanded to every query row for Attention's attention_bias, so even a non-binary mask value gives the
    original's result."""
    src = str(CORPUS.parent / "transformer_small.onnx")
    out = str(tmp_path / "out.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False))
    assert r.fired.get("self-attention") == 1, r.fired
    assert any(n.op_type == "Expand" for n in onnx.load(out).graph.node)  # the mask, to every query row
    got = onnx.load(out)
    assert [n.op_type for n in got.graph.node].count("Attention") == 1
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    mask[0, 8:] = 0
    mask[1, :] = 0  # fully masked
    mask[1, 3] = 2  # not a 0/1 value: still exact
    feeds = {"input_ids": ids, "attention_mask": mask}
    np.testing.assert_allclose(ort_run(got, feeds)[0], ort_run(onnx.load(src), feeds)[0], rtol=1e-4, atol=1e-4)
