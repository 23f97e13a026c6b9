#!/usr/bin/env python3
"""Export a small corpus of Hugging Face transformer models to ONNX (random weights, no downloads).

Usage::

    python models/make_transformer_models.py [OUTPUT_DIR]      # default: models/transformers/
    python models/make_transformer_models.py --only bert,vit    # a subset (by family or variant name)

Every model is built from a config object with ``torch.manual_seed(0)`` (never ``from_pretrained``) and
exported twice:

* TorchScript exporter (``dynamo=False``, opset 17)  -> ``<name>_ts17.onnx``
* dynamo exporter      (``dynamo=True``,  opset 18)  -> ``<name>_dynamo18.onnx``

Variants: ``bert`` (BertModel, default = sdpa attention), ``bert_eager`` (BertModel with
``attn_implementation="eager"``), ``gpt2`` (GPT2Model, use_cache=False), ``vit`` (ViTModel, 32x32 image,
patch 8), ``llama`` (LlamaModel, use_cache=False, 4 heads / 2 kv heads = grouped-query attention),
``clip`` (CLIPTextModel: causal mask built in the graph, plus the padding mask), ``whisper_dec``
(WhisperDecoder, 1 layer to stay under 400 KB: causal self-attention, and cross-attention on ``encoder_hidden_states`` [batch, 12, 64] with no
mask and the scale in the query projection), ``segformer`` (SegformerModel, 32x32 image, 2 stages: attention
on a key / value sequence reduced by a strided conv).

Tiny versions of the families ``corpora/realistic.py`` exports at realistic size:
``llama_kv`` (LlamaForCausalLM, 2 layers, 4 heads / 2 kv heads, with a KV cache: inputs input_ids
[batch, sequence], attention_mask [batch, total] (TorchScript: ``past_sequence+sequence``, dynamo:
``total_sequence``), position_ids [batch, sequence], ``past_key_values.N.key/value`` [batch, kv heads,
past_sequence, 16]; outputs ``logits`` [batch, sequence, 128] and ``present.N.key/value``), ``phi_kv``
(PhiForCausalLM, Phi-2 style: rotary on half of each head, LayerNorm, attention and MLP in parallel; 2 layers,
4 heads / 4 kv heads; the inputs and outputs of llama_kv), ``t5_enc`` (T5EncoderModel, 2 layers: relative
attention bias with 16 buckets / max distance 32 computed in layer 0 and reused, no score scale, RMSNorm),
``bart_dec`` (BartDecoder, 1 layer: causal self-attention with ``attention_mask``, cross-attention on
``encoder_hidden_states`` [batch, 12, 64] with ``encoder_attention_mask``), ``whisper_dec_kv`` (the weights of
whisper_dec, one step with a cache: ``past_0_key/value`` [batch, 4, past_sequence, 16] and
``past_0_cross_key/cross_value`` [batch, 4, encoder_sequence, 16] as inputs -> ``last_hidden_state``,
``present_0_key/value``), ``swin`` (SwinModel, 32x32 image, patch 4, embed 32, 2 heads, depths [2], window 4:
windowed attention with a relative position bias, the second block on shifted windows with their mask).
KV-cache exports are traced with past 8 and position_ids ``arange(8, 8 + 16)`` (inputs.json kind
``positions``). The dynamo export fails for ``t5_enc`` and ``swin`` (torch 2.13: "Cannot view a tensor ... as
a tensor with shape"); only their TorchScript files exist.

Sizes: hidden 64, 2 layers, 4 heads (llama: 2 kv heads), intermediate 64, vocab 128, max positions 64
(200-370 KB a file; the whole corpus is about 7.5 MB). The only output is ``last_hidden_state`` (no pooler)
except for the KV-cache variants above. All weights are stored inside the .onnx file.

Each export is checked with ``onnx.checker.check_model``, run in onnxruntime CPU on the feeds described in
``inputs.json`` (batch 2, seq 16; attention_mask of ones with the last 3 positions of sample 1 set to 0) and
compared to the torch output (all outputs). A dynamo export that fails is recorded with a one-line reason and
skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

BATCH, SEQ = 2, 16
# Intermediate 128 and vocab 256 made every file 340-440 KB and the corpus 3.7 MB; intermediate 64 and
# vocab 128 bring it to ~2.8 MB without changing any graph structure.
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 64
VOCAB, MAX_POS = 128, 64
PAST, ENC_SEQ = 8, 12  # KV-cache variants: past length; decoders: encoder sequence
IMAGE, PATCH, CHANNELS = 32, 8, 3
INIT_RANGE = 0.1  # HF default 0.02 makes attention almost uniform; 0.1 gives peaked softmaxes
BIAS_STD = 0.1  # HF inits biases to 0 and norm weights to 1: perturb them so that a fusion that drops or
#                swaps a bias / gamma / beta cannot pass a numerical check (and no exporter folds them away)
MASKED_TAIL = 3  # attention_mask[1, -3:] = 0
DEFAULT_OUT = Path(__file__).resolve().parent / "transformers"


# --------------------------------------------------------------------------- #
# Model specs
# --------------------------------------------------------------------------- #
@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list[int]
    dynamic: dict[int, str]  # axis -> symbolic name
    high: int | None = None  # exclusive upper bound for integer ids
    kind: str = "random"  # random | ids | mask | zeros | positions
    start: int = 0  # positions: the first position (the past length)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": self.shape,
                               "dynamic_axes": {str(k): v for k, v in self.dynamic.items()}, "kind": self.kind}
        if self.kind == "ids":
            out["low"], out["high"] = 0, self.high
        elif self.kind == "mask":
            out["value"] = f"ones; [1, -{MASKED_TAIL}:] = 0"
            out["masked_tail"] = MASKED_TAIL
        elif self.kind == "zeros":
            out["value"] = "zeros"
        elif self.kind == "positions":
            out["value"] = "arange(start, start + shape[1]) in every row (no rng draw)"
            out["start"] = self.start
        elif self.kind == "random":
            out["value"] = "standard normal"
        return out


@dataclass
class ModelSpec:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: list[InputSpec]
    # outputs other than ``last_hidden_state`` (KV-cache variants), with their dynamic axes, and the module
    # that calls the model with ``inputs`` (default: chosen by ``wrap`` from the input names)
    outputs: list[str] = field(default_factory=lambda: ["last_hidden_state"])
    out_dynamic: dict[str, dict[int, str]] | None = None
    wrapper: Callable[[torch.nn.Module], torch.nn.Module] | None = None


class _LastHiddenState(torch.nn.Module):
    """Calls a HF model with keyword inputs and returns only ``last_hidden_state``.

    The subclasses spell out the input names in ``forward`` so that both exporters (and torch.export's
    ``dynamic_shapes``) see named positional inputs.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model


class TextInputs(_LastHiddenState):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class TextTokenTypeInputs(_LastHiddenState):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state


class DecoderInputs(_LastHiddenState):
    def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states).last_hidden_state


class ImageInputs(_LastHiddenState):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


def wrap(model: torch.nn.Module, input_names: list[str]) -> _LastHiddenState:
    for cls in (TextInputs, TextTokenTypeInputs, DecoderInputs, ImageInputs, EncoderDecoderInputs):
        if list(cls.forward.__code__.co_varnames[1:cls.forward.__code__.co_argcount]) == input_names:
            return cls(model).eval()
    raise ValueError(f"no wrapper for inputs {input_names}")


class EncoderDecoderInputs(_LastHiddenState):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          encoder_hidden_states=encoder_hidden_states,
                          encoder_attention_mask=encoder_attention_mask).last_hidden_state


def _named(cls_name: str, names: list[str], body: str, helpers: dict[str, Any]) -> type:
    """A module class whose ``forward`` spells out ``names`` (both exporters and torch.export's
    ``dynamic_shapes`` then see named positional inputs, not ``*args``); ``helpers`` are globals of ``body``."""
    src = f"def forward(self, {', '.join(names)}):\n    {body}\n"
    ns: dict[str, Any] = {}
    exec(src, {"torch": torch, **helpers}, ns)  # noqa: S102 - fixed, local source text
    return type(cls_name, (torch.nn.Module,), {"forward": ns["forward"], "__init__": _wrapper_init})


def _wrapper_init(self: torch.nn.Module, model: torch.nn.Module, n_layers: int = 0) -> None:
    torch.nn.Module.__init__(self)
    self.model, self.n_layers = model, n_layers


def _causal_forward(self: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """A causal LM step with a KV cache: ``past`` holds key, value per layer; returns logits and the presents."""
    from transformers import DynamicCache

    cache = DynamicCache(config=self.model.config)
    for i in range(self.n_layers):
        cache.update(past[2 * i], past[2 * i + 1], i)
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=cache, use_cache=True)
    flat: list[torch.Tensor] = []
    for layer in out.past_key_values.layers[: self.n_layers]:
        flat += [layer.keys, layer.values]
    return (out.logits, *flat)


def causal_wrapper(n_layers: int) -> Callable[[torch.nn.Module], torch.nn.Module]:
    past = [f"past_key_values_{i}_{kv}" for i in range(n_layers) for kv in ("key", "value")]
    cls = _named("CausalLMWithPast", ["input_ids", "attention_mask", "position_ids", *past],
                 f"return _causal(self, input_ids, attention_mask, position_ids, [{', '.join(past)}])",
                 {"_causal": _causal_forward})
    return lambda model: cls(model, n_layers).eval()


def _seq2seq_kv_forward(self: torch.nn.Module, input_ids: torch.Tensor, past: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, ...]:
    """A decoder step with self-attention past key/values and the cross-attention key/values of the encoder
    output (4 tensors per layer: self key, self value, cross key, cross value)."""
    from transformers import DynamicCache, EncoderDecoderCache

    cfg = self.model.config
    self_cache, cross_cache = DynamicCache(config=cfg), DynamicCache(config=cfg)
    for i in range(self.n_layers):
        self_cache.update(past[4 * i], past[4 * i + 1], i)
        cross_cache.update(past[4 * i + 2], past[4 * i + 3], i)
    # the cross-attention reads its cached key/values; encoder_hidden_states must be given (else the decoder
    # skips cross-attention) but its values are not read
    enc = torch.zeros(input_ids.shape[0], 1, cfg.d_model)
    out = self.model(input_ids=input_ids, encoder_hidden_states=enc,
                     cache=EncoderDecoderCache(self_cache, cross_cache), use_cache=True)
    flat: list[torch.Tensor] = []
    for layer in out.past_key_values.self_attention_cache.layers[: self.n_layers]:
        flat += [layer.keys, layer.values]
    return (out.last_hidden_state, *flat)


def seq2seq_kv_wrapper(n_layers: int) -> Callable[[torch.nn.Module], torch.nn.Module]:
    past = [f"past_{i}_{kv}" for i in range(n_layers) for kv in ("key", "value", "cross_key", "cross_value")]
    cls = _named("DecoderWithPast", ["input_ids", *past], f"return _s2s(self, input_ids, [{', '.join(past)}])",
                 {"_s2s": _seq2seq_kv_forward})
    return lambda model: cls(model, n_layers).eval()


def _text_inputs(with_token_types: bool = False) -> list[InputSpec]:
    dyn = {0: "batch", 1: "sequence"}
    specs = [InputSpec("input_ids", "int64", [BATCH, SEQ], dyn, high=VOCAB, kind="ids"),
             InputSpec("attention_mask", "int64", [BATCH, SEQ], dyn, kind="mask")]
    if with_token_types:
        specs.append(InputSpec("token_type_ids", "int64", [BATCH, SEQ], dyn, high=2, kind="ids"))
    return specs


def _bert(attn: str | None) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import BertConfig, BertModel
        kw = {"attn_implementation": attn} if attn else {}
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                         max_position_embeddings=MAX_POS, type_vocab_size=2,
                         initializer_range=INIT_RANGE, **kw)
        return BertModel(cfg, add_pooling_layer=False)
    return build


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
                     n_positions=MAX_POS, use_cache=False, initializer_range=INIT_RANGE,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2Model(cfg)


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    intermediate_size=INTERMEDIATE, image_size=IMAGE, patch_size=PATCH, num_channels=CHANNELS,
                    initializer_range=INIT_RANGE)
    return ViTModel(cfg, add_pooling_layer=False)


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE,
                      max_position_embeddings=MAX_POS, use_cache=False, initializer_range=INIT_RANGE)
    return LlamaModel(cfg)


def _clip() -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel
    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=MAX_POS,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=INIT_RANGE)
    return CLIPTextModel(cfg)


def _whisper_dec() -> torch.nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperDecoder
    cfg = WhisperConfig(vocab_size=VOCAB, d_model=HIDDEN, decoder_layers=1, decoder_attention_heads=HEADS,
                        decoder_ffn_dim=INTERMEDIATE, max_target_positions=MAX_POS, max_source_positions=MAX_POS,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                        init_std=INIT_RANGE)
    return WhisperDecoder(cfg)


def _segformer() -> torch.nn.Module:
    from transformers import SegformerConfig, SegformerModel
    cfg = SegformerConfig(num_channels=CHANNELS, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                          hidden_sizes=[32, HIDDEN], patch_sizes=[3, 3], strides=[2, 2], num_attention_heads=[1, 2],
                          mlp_ratios=[2, 2], initializer_range=INIT_RANGE)
    return SegformerModel(cfg)


KV_LAYERS = 2  # llama_kv, phi_kv


def _llama_kv() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=KV_LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE,
                      max_position_embeddings=MAX_POS, tie_word_embeddings=False, initializer_range=INIT_RANGE,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg)


def _phi_kv() -> torch.nn.Module:
    from transformers import PhiConfig, PhiForCausalLM
    # Phi-2 style: rotary on half of each head (partial_rotary_factor 0.5), LayerNorm with bias, attention and
    # MLP in parallel on the same normed input, gelu_new MLP, dense biases
    cfg = PhiConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=KV_LAYERS, num_attention_heads=HEADS,
                    num_key_value_heads=HEADS, intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POS,
                    partial_rotary_factor=0.5, tie_word_embeddings=False, initializer_range=INIT_RANGE,
                    pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return PhiForCausalLM(cfg)


def _t5_enc() -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=INTERMEDIATE, num_layers=LAYERS,
                   num_heads=HEADS, relative_attention_num_buckets=16, relative_attention_max_distance=32,
                   feed_forward_proj="relu", initializer_factor=1.0, pad_token_id=0, eos_token_id=1)
    return T5EncoderModel(cfg)


def _bart_dec() -> torch.nn.Module:
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartDecoder
    cfg = BartConfig(vocab_size=VOCAB, d_model=HIDDEN, decoder_layers=1, decoder_attention_heads=HEADS,
                     decoder_ffn_dim=INTERMEDIATE, max_position_embeddings=MAX_POS, use_cache=False,
                     init_std=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return BartDecoder(cfg)


def _swin() -> torch.nn.Module:
    from transformers import SwinConfig, SwinModel
    # 32x32 image, patch 4 -> 8x8 tokens, window 4: 4 windows; the second block of the stage shifts them by 2
    # (roll + the shifted-window mask). Embed 32 (2 heads of 16, MLP 64) keeps the file near 150 KB.
    cfg = SwinConfig(image_size=IMAGE, patch_size=4, num_channels=CHANNELS, embed_dim=32, depths=[2],
                     num_heads=[2], window_size=4, mlp_ratio=INTERMEDIATE / 32, initializer_range=INIT_RANGE)
    return SwinModel(cfg, add_pooling_layer=False)


def perturb_vectors(model: torch.nn.Module) -> None:
    """Add N(0, BIAS_STD) noise to every 1-D parameter (biases, LayerNorm/RMSNorm weights and biases)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * BIAS_STD)


def model_specs() -> list[ModelSpec]:
    return [
        ModelSpec("bert", _bert(None), _text_inputs(with_token_types=True)),
        ModelSpec("bert_eager", _bert("eager"), _text_inputs(with_token_types=True)),
        ModelSpec("gpt2", _gpt2, _text_inputs()),
        ModelSpec("vit", _vit, [InputSpec("pixel_values", "float32", [BATCH, CHANNELS, IMAGE, IMAGE],
                                          {0: "batch"}, kind="random")]),
        ModelSpec("llama", _llama, _text_inputs()),
        ModelSpec("clip", _clip, _text_inputs()),
        ModelSpec("whisper_dec", _whisper_dec,
                  [InputSpec("input_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, high=VOCAB, kind="ids"),
                   InputSpec("encoder_hidden_states", "float32", [BATCH, 12, HIDDEN],
                             {0: "batch", 1: "encoder_sequence"})]),
        ModelSpec("segformer", _segformer, [InputSpec("pixel_values", "float32", [BATCH, CHANNELS, IMAGE, IMAGE],
                                                      {0: "batch"}, kind="random")]),
        ModelSpec("llama_kv", _llama_kv, _kv_inputs(KV_HEADS), *_kv_outputs(), wrapper=causal_wrapper(KV_LAYERS)),
        ModelSpec("phi_kv", _phi_kv, _kv_inputs(HEADS), *_kv_outputs(), wrapper=causal_wrapper(KV_LAYERS)),
        ModelSpec("t5_enc", _t5_enc, _text_inputs()),
        ModelSpec("bart_dec", _bart_dec,
                  [*_text_inputs(),
                   InputSpec("encoder_hidden_states", "float32", [BATCH, ENC_SEQ, HIDDEN],
                             {0: "batch", 1: "encoder_sequence"}),
                   InputSpec("encoder_attention_mask", "int64", [BATCH, ENC_SEQ],
                             {0: "batch", 1: "encoder_sequence"}, kind="mask")]),
        ModelSpec("whisper_dec_kv", _whisper_dec,
                  [InputSpec("input_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, high=VOCAB, kind="ids"),
                   *[InputSpec(f"past_0_{kv}", "float32", [BATCH, HEADS, ENC_SEQ if "cross" in kv else PAST,
                                                           HIDDEN // HEADS],
                               {0: "batch", 2: "encoder_sequence" if "cross" in kv else "past_sequence"})
                     for kv in ("key", "value", "cross_key", "cross_value")]],
                  ["last_hidden_state", "present_0_key", "present_0_value"],
                  {"last_hidden_state": {0: "batch", 1: "sequence"},
                   **{f"present_0_{kv}": {0: "batch", 2: TOTAL} for kv in ("key", "value")}},
                  wrapper=seq2seq_kv_wrapper(1)),
        ModelSpec("swin", _swin, [InputSpec("pixel_values", "float32", [BATCH, CHANNELS, IMAGE, IMAGE],
                                            {0: "batch"}, kind="random")]),
    ]


TOTAL = "past_sequence+sequence"  # the TorchScript name of the mask / present length (dynamo: total_sequence)


def _kv_inputs(kv_heads: int) -> list[InputSpec]:
    """input_ids, attention_mask over past + new tokens, position_ids of the new tokens, past key/values."""
    ins = [InputSpec("input_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, high=VOCAB, kind="ids"),
           InputSpec("attention_mask", "int64", [BATCH, PAST + SEQ], {0: "batch", 1: TOTAL}, kind="mask"),
           InputSpec("position_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, kind="positions",
                     start=PAST)]
    for i in range(KV_LAYERS):
        for kv in ("key", "value"):
            ins.append(InputSpec(f"past_key_values.{i}.{kv}", "float32", [BATCH, kv_heads, PAST, HIDDEN // HEADS],
                                 {0: "batch", 2: "past_sequence"}))
    return ins


def _kv_outputs() -> tuple[list[str], dict[str, dict[int, str]]]:
    outs = ["logits"] + [f"present.{i}.{kv}" for i in range(KV_LAYERS) for kv in ("key", "value")]
    dyn = {"logits": {0: "batch", 1: "sequence"}}
    dyn.update({o: {0: "batch", 2: TOTAL} for o in outs[1:]})
    return outs, dyn


# --------------------------------------------------------------------------- #
# Feeds
# --------------------------------------------------------------------------- #
def make_feeds(inputs: list[InputSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic feeds for ``inputs`` (the same rules other tools apply to inputs.json)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.kind == "ids":
            arr = rng.integers(0, spec.high or 2, spec.shape)
        elif spec.kind == "mask":
            arr = np.ones(spec.shape)
            arr[1, -MASKED_TAIL:] = 0
        elif spec.kind == "zeros":
            arr = np.zeros(spec.shape)
        elif spec.kind == "positions":  # the new tokens follow the past
            arr = np.broadcast_to(np.arange(spec.start, spec.start + spec.shape[1]), spec.shape)
        else:
            arr = rng.standard_normal(spec.shape)
        feeds[spec.name] = np.ascontiguousarray(arr).astype(spec.dtype)
    return feeds


# --------------------------------------------------------------------------- #
# Export
# --------------------------------------------------------------------------- #
def _one_line(exc: BaseException) -> str:
    """The most informative single line of an exception (torch.export wraps the real one)."""
    text = str(exc)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (f"{type(exc).__name__}: " + (lines[0] if lines else ""))[:240]


def export_ts(module: torch.nn.Module, args: tuple, spec: ModelSpec, path: Path) -> None:
    names = [i.name for i in spec.inputs]
    dynamic_axes: dict[str, dict[int, str]] = {i.name: i.dynamic for i in spec.inputs}
    dynamic_axes.update(spec.out_dynamic or {"last_hidden_state": dict(spec.inputs[0].dynamic)})
    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=names,
                      output_names=spec.outputs, dynamic_axes=dynamic_axes, do_constant_folding=True)


def export_dynamo(module: torch.nn.Module, args: tuple, spec: ModelSpec, path: Path) -> None:
    from torch.export import Dim

    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        name = {TOTAL: "total_sequence"}.get(name, name)  # a sum of two dims cannot be a Dim
        if name not in dims:
            dims[name] = Dim(name, min=1, max=MAX_POS) if name == "sequence" else Dim(name, min=1, max=1024)
        return dims[name]

    dynamic_shapes = tuple({ax: dim(n) for ax, n in i.dynamic.items()} for i in spec.inputs)
    program = torch.onnx.export(module, args, dynamo=True, opset_version=18, input_names=[i.name for i in spec.inputs],
                                output_names=spec.outputs, dynamic_shapes=dynamic_shapes,
                                external_data=False)
    proto = program.model_proto
    strip_metadata(proto)
    # Save through onnx so that all weights end up inside the one file.
    onnx.save_model(proto, str(path), save_as_external_data=False)


KEEP_METADATA = {"pkg.torch.onnx.name_scopes"}


def strip_metadata(proto: onnx.ModelProto) -> None:
    """Drop the dynamo exporter's per-node debug metadata (stack traces with local paths, fx nodes, class
    hierarchies: about half the file) but keep ``pkg.torch.onnx.name_scopes`` so module names survive."""
    def strip(props: Any) -> None:
        keep = [(p.key, p.value) for p in props if p.key in KEEP_METADATA]
        del props[:]
        for k, v in keep:
            props.add(key=k, value=v)

    graphs = [proto.graph]
    while graphs:
        g = graphs.pop()
        for n in g.node:
            strip(n.metadata_props)
            graphs.extend(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
            graphs.extend(sub for a in n.attribute if a.type == onnx.AttributeProto.GRAPHS for sub in a.graphs)
        for v in (*g.value_info, *g.input, *g.output, *g.initializer):
            strip(v.metadata_props)


EXPORTERS: dict[str, tuple[Callable[..., None], int]] = {"ts": (export_ts, 17), "dynamo": (export_dynamo, 18)}


# --------------------------------------------------------------------------- #
# Checks
# --------------------------------------------------------------------------- #
def check_onnx(path: Path, feeds: dict[str, np.ndarray], expected: list[np.ndarray], outputs: list[str]) -> float:
    """The largest absolute difference to torch over all ``outputs``."""
    onnx.checker.check_model(str(path), full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diff = 0.0
    for got, want in zip(sess.run(outputs, feeds), expected, strict=True):
        if got.shape != want.shape:
            raise ValueError(f"shape {got.shape} != torch {want.shape}")
        diff = max(diff, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))))
    return diff


@dataclass
class Row:
    file: str
    exporter: str
    opset: int
    nodes: int | None = None
    size_kb: float | None = None
    max_abs_diff: float | None = None
    error: str | None = None
    attn: str = ""  # the attention implementation transformers used


def export_one(spec: ModelSpec, exporter: str, out_dir: Path) -> Row:
    fn, opset = EXPORTERS[exporter]
    fname = f"{spec.name}_{exporter}{opset}.onnx"
    path = out_dir / fname
    torch.manual_seed(0)
    model = spec.build().eval()
    row = Row(fname, exporter, opset, attn=str(getattr(model.config, "_attn_implementation", None)))
    perturb_vectors(model)
    module = spec.wrapper(model) if spec.wrapper else wrap(model, [i.name for i in spec.inputs])
    feeds = make_feeds(spec.inputs)
    args = tuple(torch.from_numpy(feeds[i.name]) for i in spec.inputs)
    with torch.no_grad():
        out = module(*args)
    expected = [t.numpy() for t in ((out,) if isinstance(out, torch.Tensor) else out)]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            fn(module, args, spec, path)
        for extra in out_dir.glob(fname + ".data"):  # never leave external data behind
            extra.unlink()
        row.max_abs_diff = check_onnx(path, feeds, expected, spec.outputs)
    except Exception as exc:  # noqa: BLE001 - record and continue
        row.error = _one_line(exc)
        path.unlink(missing_ok=True)
        return row
    row.nodes = len(onnx.load(str(path)).graph.node)
    row.size_kb = path.stat().st_size / 1024
    return row


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def print_table(rows: list[Row]) -> None:
    print("| file | exporter | opset | attention | nodes | size KB | max abs diff vs torch |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        head = f"| {r.file} | {r.exporter} | {r.opset} | {r.attn} |"
        if r.error:
            print(f"{head} - | - | FAILED: {r.error} |")
        else:
            print(f"{head} {r.nodes} | {r.size_kb:.1f} | {r.max_abs_diff:.2e} |")
    total = sum(r.size_kb or 0 for r in rows)
    print(f"\n{sum(not r.error for r in rows)} files, total {total:.1f} KB ({total / 1024:.2f} MB)")


def write_inputs_json(specs: list[ModelSpec], rows: list[Row], out_dir: Path) -> Path:
    path = out_dir / "inputs.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("_about", {
        "feeds": "batch 2, seq 16; ids: uniform integers in [low, high) from numpy default_rng(0) drawn in "
                 "input order; mask: ones with the last `masked_tail` positions of sample 1 set to 0; "
                 "random: standard normal (same rng)",
        "generator": "models/make_transformer_models.py (make_feeds)",
    })
    by_name = {s.name: s for s in specs}
    for r in rows:
        if r.error:
            data.pop(r.file, None)
            continue
        spec = by_name[r.file.rsplit("_", 1)[0]]
        data[r.file] = {"model": spec.name, "exporter": r.exporter, "opset": r.opset, "attn_implementation": r.attn,
                        "inputs": [i.to_json() for i in spec.inputs],
                        "outputs": [{"name": o, "dtype": "float32"} for o in spec.outputs]}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    ap.add_argument("--only", default="", help="comma-separated variant names (bert, bert_eager, gpt2, vit, llama, "
                                               "clip, whisper_dec, segformer, llama_kv, phi_kv, t5_enc, "
                                               "bart_dec, whisper_dec_kv, swin)")
    ap.add_argument("--exporters", default="ts,dynamo", help="comma-separated: ts, dynamo")
    a = ap.parse_args(argv)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ort.set_default_logger_severity(3)
    specs = model_specs()
    if a.only:
        wanted = set(a.only.split(","))
        specs = [s for s in specs if s.name in wanted]
    rows: list[Row] = []
    for spec in specs:
        for exporter in a.exporters.split(","):
            row = export_one(spec, exporter, out_dir)
            status = row.error or f"{row.nodes} nodes, {row.size_kb:.0f} KB, diff {row.max_abs_diff:.1e}"
            print(f"{row.file}: {status}", file=sys.stderr, flush=True)
            rows.append(row)
    print_table(rows)
    print(f"inputs: {write_inputs_json(model_specs(), rows, out_dir)}")
    return 1 if all(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
