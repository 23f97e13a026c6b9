#!/usr/bin/env python3
"""Export a corpus of realistic-size ONNX models (random weights, seed 0, no downloads) to check onnxfuse's
input discovery and ``optimize`` on models the size of what people deploy.

Usage::

    python -m corpora.realistic [OUT_DIR]          # default: ~/.cache/onnxfuse-corpus
    python -m corpora.realistic --only bert_base,crnn --exporters ts
    python -m corpora.realistic --list

Needs ``pip install torch==2.13.0 'transformers>=5,<6' onnxscript``. The models are never committed: they
are 10-150 MB each (about 1.5 GB for the whole corpus with both exporters).

Every model is built from a config object after ``torch.manual_seed(0)`` (never ``from_pretrained``; nothing is
downloaded: ``HF_HUB_OFFLINE=1``) and exported with

* the TorchScript exporter (``dynamo=False``, opset 17, ``dynamic_axes``)   -> ``<name>_ts17.onnx``
* the dynamo exporter      (``dynamo=True``,  opset 18, ``dynamic_shapes``) -> ``<name>_dynamo18.onnx``

(models marked ``ts_only`` skip the dynamo exporter). Each export is checked: ``onnx.checker``, one
onnxruntime run on the export-time feeds, and the largest absolute difference to torch. An export that fails
is recorded with a one-line reason and skipped; the summary table and ``corpus.json`` (in OUT_DIR) list both.
``corpus.json`` also records, per file, the dynamic axes and the sizes each exported input was traced at.

Models (vocabularies are cut to 8192 so that each file stays under ~150 MB; everything else is the real
architecture at reduced depth):

============== ==========================================================================================
bert_base      BertModel: hidden 768, 4 layers, 12 heads, FFN 3072, max positions 512; ids/mask/token types
distilbert     DistilBertModel: dim 768, 4 layers, 12 heads, FFN 3072, max positions 512
vit_b16        ViTModel: 224x224, patch 16, hidden 768, 4 layers, 12 heads (dynamic batch only)
whisper_enc    WhisperEncoder (tiny-like): 80 mels x 3000 frames, d_model 384, 4 layers, 6 heads; batch dynamic
whisper_enc_dynT  the same with the frame axis exported dynamic (only 3000 frames run: the position table
               is added whole)
t5_enc         T5EncoderModel (small-like): d_model 512, 4 layers, 8 heads, FFN 2048; relative attention
               with a SMALL bucket setting (16 buckets, max distance 32)
bert_pos64     BertModel hidden 384, 4 layers, max_position_embeddings=64 (the position-table bound)
llama_kv       LlamaForCausalLM: hidden 512, 8 query / 2 KV heads, 4 layers, FFN 1536, with KV cache:
               input_ids, attention_mask, position_ids, past_key_values.N.key/value -> logits, present.N.*
llama_gqa      LlamaForCausalLM: hidden 1024, 16 query / 4 KV heads (grouped KV), 4 layers, FFN 2816, KV cache
               (the inputs of llama_kv)
llama_gqa_static  the same exported with static shapes (no dynamic axes): the dynamo export then merges
               repeat_kv's Reshape into the attention's key Reshape (a 5-D grouped key) and folds cos / sin
               into constants
gpt2_kv        GPT2LMHeadModel (small-like): n_embd 768, 4 layers, 12 heads, n_positions 1024, with KV cache
               (TorchScript only)
phi3_kv        Phi3ForCausalLM: hidden 512, 8 / 2 KV heads, 4 layers, max_position_embeddings 256, KV cache
crnn           PP-OCR-rec-like CRNN in plain torch: [batch, 3, 48, width] (width dynamic), strided convs,
               BiLSTM 2x256, Linear to 6625 classes
audio_pad64    Conv1d front end with reflect padding 64 (``F.pad(..., mode="reflect")`` needs length > 64),
               kernel 400 / stride 160, conv stack + GRU; [batch, samples] with samples dynamic
audio_frames480  frames of 480 samples cut by ``view(batch, -1, 480)``: only lengths divisible by 480 run
clip_text      CLIPTextModel: hidden 256, 2 layers, 4 heads, 77 positions; causal mask built in the graph + padding
bart_dec       BartDecoder: d_model 256, 2 layers, 4 heads: causal self-attention and cross-attention on
               encoder_hidden_states [batch, encoder_sequence, 256] with encoder_attention_mask
whisper_dec    WhisperDecoder: d_model 256, 2 layers, 4 heads, no cache: self + cross-attention
whisper_dec_kv the same, one step with a cache: past self key/values and the cross key/values as inputs
               (past_N_key/value/cross_key/cross_value) -> last_hidden_state, present_N_key/value
swin_tiny      SwinModel: 64x64 images, patch 4, embed 64, depths [2, 2], heads [2, 4], window 4 (windowed
               attention with relative position bias, shifted windows with a mask). The dynamo export fails
               (torch 2.13: "Cannot view a tensor ... as a tensor with shape", static shapes too)
segformer      SegformerModel: 64x64 images, 2 blocks, hidden [64, 128], heads [1, 2], sr ratios [4, 2]
               (efficient attention: K/V from a strided-conv-reduced sequence)
gpt2_lm        GPT2LMHeadModel (small-like): n_embd 768, 6 layers, 12 heads, n_positions 1024, NO KV cache:
               input_ids, attention_mask -> logits (batch and sequence dynamic); 6 layers make it the largest
               file (~190 MB dynamo, ~215 MB TorchScript, which stores the tied embedding twice)
mobilevit      MobileViTModel from the default MobileViTConfig (mobilevit-small-like): 256x256 images, hidden
               [144, 192, 240], MobileNetV2 blocks with BatchNorm (running statistics perturbed) around
               unfold-to-patches transformer blocks; last_hidden_state [batch, 640, 8, 8] (dynamic batch only)
============== ==========================================================================================

KV-cache exports (TorchScript) name their dims ``batch``, ``sequence``, ``past_sequence`` and
``past_sequence+sequence`` (mask and present). With dynamo, ``torch.export.Dim`` objects named ``batch``,
``sequence`` and ``past_sequence`` are used; the mask's length is its own dim ``total_sequence`` (a sum of two
dims cannot be expressed in ``dynamic_shapes``) and torch.export decides what it becomes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
import traceback
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
import torch.nn.functional as F  # noqa: E402

from models.make_transformer_models import _seq2seq_kv_forward  # noqa: E402  (one decoder step with a KV cache)

DEFAULT_OUT = Path.home() / ".cache" / "onnxfuse-corpus"
VOCAB = 8192
# Export-time sizes (the exported graphs are dynamic in the axes listed per input).
BATCH, SEQ, PAST = 2, 8, 16


# --------------------------------------------------------------------------- #
# Specs
# --------------------------------------------------------------------------- #
@dataclass
class In:
    name: str
    dtype: str
    shape: list[int]
    dynamic: dict[int, str]
    kind: str = "random"  # random | ids | mask | positions
    high: int = 2


@dataclass
class Spec:
    name: str
    build: Callable[[], torch.nn.Module]  # returns the module to export (positional inputs in `inputs` order)
    inputs: list[In]
    outputs: list[str]
    out_dynamic: dict[str, dict[int, str]]
    ts_only: bool = False
    note: str = ""
    kv_layers: int = 0  # > 0: the last 2 * kv_layers inputs are past key/values, passed as one list
    extra: dict[str, Any] = field(default_factory=dict)


def perturb_vectors(model: torch.nn.Module, std: float = 0.1) -> None:
    """HF inits biases to 0 and norm weights to 1; perturb every 1-D parameter so that a fusion that drops or
    swaps a bias / gamma / beta cannot pass a numerical check."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * std)


class LastHidden(torch.nn.Module):
    """Calls a HF encoder with keyword inputs named in ``names``; returns ``last_hidden_state``."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, args, strict=True))).last_hidden_state


def _named(cls_name: str, names: list[str], body: str) -> type:
    """A wrapper class whose ``forward`` spells out ``names`` (torch.export's dynamic_shapes and both exporters
    then see named positional inputs instead of ``*args``)."""
    src = f"def forward(self, {', '.join(names)}):\n    {body}\n"
    ns: dict[str, Any] = {}
    exec(src, {"torch": torch}, ns)  # noqa: S102 - fixed, local source text
    return type(cls_name, (torch.nn.Module,), {"forward": ns["forward"], "__init__": _wrapper_init})


def _wrapper_init(self: torch.nn.Module, model: torch.nn.Module, n_layers: int = 0) -> None:
    torch.nn.Module.__init__(self)
    self.model, self.n_layers = model, n_layers


def encoder_wrapper(model: torch.nn.Module, names: list[str]) -> torch.nn.Module:
    kw = ", ".join(f"{n}={n}" for n in names)
    cls = _named("Encoder", names, f"return self.model({kw}).last_hidden_state")
    return cls(model).eval()


def _causal_forward(self: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor | None, past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from transformers import DynamicCache

    cache = DynamicCache(config=self.model.config)
    for i in range(self.n_layers):
        cache.update(past[2 * i], past[2 * i + 1], i)
    kw: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "past_key_values": cache,
                          "use_cache": True}
    if position_ids is not None:
        kw["position_ids"] = position_ids
    out = self.model(**kw)
    present = out.past_key_values
    flat: list[torch.Tensor] = []
    for layer in present.layers[: self.n_layers]:
        flat += [layer.keys, layer.values]
    return (out.logits, *flat)


def causal_wrapper(model: torch.nn.Module, n_layers: int, with_positions: bool) -> torch.nn.Module:
    past = [f"past_key_values_{i}_{kv}" for i in range(n_layers) for kv in ("key", "value")]
    names = ["input_ids", "attention_mask", *(["position_ids"] if with_positions else []), *past]
    pos = "position_ids" if with_positions else "None"
    cls = _named("CausalLMWithPast", names,
                 f"return _causal(self, input_ids, attention_mask, {pos}, [{', '.join(past)}])")
    cls.forward.__globals__["_causal"] = _causal_forward
    return cls(model, n_layers).eval()


# ---- HF builders ------------------------------------------------------------ #
def _bert(hidden: int, layers: int, heads: int, ffn: int, max_pos: int) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=ffn, max_position_embeddings=max_pos, type_vocab_size=2)
        m = BertModel(cfg, add_pooling_layer=False).eval()
        perturb_vectors(m)
        return encoder_wrapper(m, ["input_ids", "attention_mask", "token_type_ids"])
    return build


def _distilbert() -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertModel
    cfg = DistilBertConfig(vocab_size=VOCAB, dim=768, n_layers=4, n_heads=12, hidden_dim=3072,
                           max_position_embeddings=512)
    m = DistilBertModel(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_ids", "attention_mask"])


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072,
                    image_size=224, patch_size=16, num_channels=3)
    m = ViTModel(cfg, add_pooling_layer=False).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["pixel_values"])


def _whisper_enc() -> torch.nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    cfg = WhisperConfig(num_mel_bins=80, d_model=384, encoder_layers=4, encoder_attention_heads=6,
                        encoder_ffn_dim=1536, max_source_positions=1500, vocab_size=VOCAB)
    m = WhisperEncoder(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_features"])


def _t5_enc() -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8,
                   relative_attention_num_buckets=16, relative_attention_max_distance=32,
                   feed_forward_proj="relu")
    m = T5EncoderModel(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_ids", "attention_mask"])


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=1536, max_position_embeddings=2048,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg).eval()
    perturb_vectors(m)
    return causal_wrapper(m, 4, with_positions=True)


def _llama_gqa() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                      num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=2048,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg).eval()
    perturb_vectors(m)
    return causal_wrapper(m, 4, with_positions=True)


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=4, n_head=12, n_positions=1024,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    m = GPT2LMHeadModel(cfg).eval()
    perturb_vectors(m)
    return causal_wrapper(m, 4, with_positions=True)


def _gpt2_lm() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=6, n_head=12, n_positions=1024,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    m = GPT2LMHeadModel(cfg).eval()
    perturb_vectors(m)
    cls = _named("CausalLM", ["input_ids", "attention_mask"],
                 "return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits")
    return cls(m).eval()


def _phi3() -> torch.nn.Module:
    from transformers import Phi3Config, Phi3ForCausalLM
    cfg = Phi3Config(vocab_size=VOCAB, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, intermediate_size=1536, max_position_embeddings=256,
                     original_max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     tie_word_embeddings=False)
    m = Phi3ForCausalLM(cfg).eval()
    perturb_vectors(m)
    return causal_wrapper(m, 4, with_positions=True)


def _clip_text() -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel
    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    m = CLIPTextModel(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_ids", "attention_mask"])


def _bart_dec() -> torch.nn.Module:
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartDecoder
    cfg = BartConfig(vocab_size=VOCAB, d_model=256, decoder_layers=2, decoder_attention_heads=4,
                     decoder_ffn_dim=1024, max_position_embeddings=256)
    m = BartDecoder(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask"])


def _whisper_dec() -> torch.nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperDecoder
    cfg = WhisperConfig(vocab_size=VOCAB, d_model=256, decoder_layers=2, decoder_attention_heads=4,
                        decoder_ffn_dim=1024, max_target_positions=128, max_source_positions=1500,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    m = WhisperDecoder(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["input_ids", "encoder_hidden_states"])


def _whisper_dec_kv() -> torch.nn.Module:
    m = _whisper_dec().model
    past = [f"past_{i}_{kv}" for i in range(2) for kv in ("key", "value", "cross_key", "cross_value")]
    cls = _named("DecoderWithPast", ["input_ids", *past],
                 f"return _s2s(self, input_ids, [{', '.join(past)}])")
    cls.forward.__globals__["_s2s"] = _seq2seq_kv_forward
    return cls(m, 2).eval()


def _swin() -> torch.nn.Module:
    from transformers import SwinConfig, SwinModel
    cfg = SwinConfig(image_size=64, patch_size=4, num_channels=3, embed_dim=64, depths=[2, 2], num_heads=[2, 4],
                     window_size=4, mlp_ratio=4.0)
    m = SwinModel(cfg, add_pooling_layer=False).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["pixel_values"])


def _segformer() -> torch.nn.Module:
    from transformers import SegformerConfig, SegformerModel
    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[2, 2], sr_ratios=[4, 2],
                          hidden_sizes=[64, 128], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                          mlp_ratios=[4, 4])
    m = SegformerModel(cfg).eval()
    perturb_vectors(m)
    return encoder_wrapper(m, ["pixel_values"])


def _mobilevit() -> torch.nn.Module:
    from transformers import MobileViTConfig, MobileViTModel
    cfg = MobileViTConfig()  # mobilevit-small: 256x256, hidden [144, 192, 240], neck up to 640
    m = MobileViTModel(cfg).eval()
    perturb_vectors(m)
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for bn in m.modules():
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.running_mean.normal_(0, 0.1)
                bn.running_var.uniform_(0.5, 1.5)
    return encoder_wrapper(m, ["pixel_values"])


# ---- plain torch models ----------------------------------------------------- #
class CRNN(torch.nn.Module):
    """PP-OCR-rec-like: conv stack that reduces height 48 -> 1 and width by 4, BiLSTM, Linear to classes."""

    def __init__(self, classes: int = 6625):
        super().__init__()

        def block(cin: int, cout: int, stride: tuple[int, int]) -> list[torch.nn.Module]:
            return [torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout),
                    torch.nn.Hardswish()]

        layers: list[torch.nn.Module] = []
        for cin, cout, s in [(3, 32, (2, 2)), (32, 64, (1, 1)), (64, 128, (2, 2)), (128, 128, (1, 1)),
                             (128, 256, (2, 1)), (256, 256, (1, 1)), (256, 512, (2, 1)), (512, 512, (1, 1))]:
            layers += block(cin, cout, s)
        self.backbone = torch.nn.Sequential(*layers)
        self.pool = torch.nn.MaxPool2d((3, 2), (3, 2), ceil_mode=False)  # height 3 -> 1, width /2
        self.lstm = torch.nn.LSTM(512, 256, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = torch.nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.backbone(x))           # [B, 512, 1, W/8]
        y = y.squeeze(2).permute(0, 2, 1)         # [B, T, 512]
        y, _ = self.lstm(y)
        return self.fc(y).softmax(-1)


class AudioPad64(torch.nn.Module):
    """Reflect-pad 64 (needs samples > 64), a strided Conv1d 'STFT-like' front end, conv stack, GRU."""

    def __init__(self):
        super().__init__()
        self.front = torch.nn.Conv1d(1, 256, 400, stride=160)
        self.convs = torch.nn.Sequential(
            torch.nn.ReLU(), torch.nn.Conv1d(256, 256, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv1d(256, 256, 3, stride=2, padding=1), torch.nn.ReLU())
        self.gru = torch.nn.GRU(256, 256, batch_first=True)
        self.head = torch.nn.Linear(256, 32)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = F.pad(audio.unsqueeze(1), (64, 64), mode="reflect")
        x = self.convs(torch.log1p(self.front(x).abs()))
        y, _ = self.gru(x.transpose(1, 2))
        return self.head(y)


class AudioFrames480(torch.nn.Module):
    """Cuts [B, samples] into frames of 480 with ``view`` (30 ms at 16 kHz): samples must divide by 480."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(480, 256)
        self.enc = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0), 2)
        self.head = torch.nn.Linear(256, 16)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        frames = audio.view(audio.shape[0], -1, 480)
        return self.head(self.enc(self.proj(frames)))


def _plain(cls: type) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        m = cls().eval()
        perturb_vectors(m)
        if isinstance(m, CRNN):  # non-trivial BatchNorm statistics
            with torch.no_grad():
                for bn in m.modules():
                    if isinstance(bn, torch.nn.BatchNorm2d):
                        bn.running_mean.normal_(0, 0.1)
                        bn.running_var.uniform_(0.5, 1.5)
        return m
    return build


# ---- the corpus ------------------------------------------------------------- #
def _text(names: list[str], high: int = VOCAB, seq: int = SEQ) -> list[In]:
    dyn = {0: "batch", 1: "sequence"}
    kinds = {"input_ids": ("ids", high), "attention_mask": ("mask", 2), "token_type_ids": ("ids", 2)}
    return [In(n, "int64", [BATCH, seq], dyn, kinds[n][0], kinds[n][1]) for n in names]


def _kv_inputs(layers: int, kv_heads: int, head_dim: int, with_positions: bool = True) -> list[In]:
    tot = "past_sequence+sequence"
    ins = [In("input_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, "ids", VOCAB),
           In("attention_mask", "int64", [BATCH, PAST + SEQ], {0: "batch", 1: tot}, "mask")]
    if with_positions:
        ins.append(In("position_ids", "int64", [BATCH, SEQ], {0: "batch", 1: "sequence"}, "positions"))
    for i in range(layers):
        for kv in ("key", "value"):
            ins.append(In(f"past_key_values.{i}.{kv}", "float32", [BATCH, kv_heads, PAST, head_dim],
                          {0: "batch", 2: "past_sequence"}))
    return ins


def _kv_outputs(layers: int) -> tuple[list[str], dict[str, dict[int, str]]]:
    outs = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    dyn = {"logits": {0: "batch", 1: "sequence"}}
    dyn.update({o: {0: "batch", 2: "past_sequence+sequence"} for o in outs[1:]})
    return outs, dyn


def corpus() -> list[Spec]:
    enc = {"last_hidden_state": {0: "batch", 1: "sequence"}}
    kv_out, kv_dyn = _kv_outputs(4)
    return [
        Spec("bert_base", _bert(768, 4, 12, 3072, 512), _text(["input_ids", "attention_mask", "token_type_ids"]),
             ["last_hidden_state"], enc),
        Spec("distilbert", _distilbert, _text(["input_ids", "attention_mask"]), ["last_hidden_state"], enc),
        Spec("vit_b16", _vit, [In("pixel_values", "float32", [BATCH, 3, 224, 224], {0: "batch"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}),
        Spec("whisper_enc", _whisper_enc, [In("input_features", "float32", [1, 80, 3000], {0: "batch"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}),
        Spec("whisper_enc_dynT", _whisper_enc,
             [In("input_features", "float32", [1, 80, 3000], {0: "batch", 2: "frames"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}, ts_only=True,
             note="frames dynamic, but only 3000 runs (position table added whole)"),
        Spec("t5_enc", _t5_enc, _text(["input_ids", "attention_mask"]), ["last_hidden_state"], enc),
        Spec("bert_pos64", _bert(384, 4, 6, 1536, 64), _text(["input_ids", "attention_mask", "token_type_ids"]),
             ["last_hidden_state"], enc),
        Spec("llama_kv", _llama, _kv_inputs(4, 2, 64), kv_out, kv_dyn, kv_layers=4),
        Spec("llama_gqa", _llama_gqa, _kv_inputs(4, 4, 64), kv_out, kv_dyn, kv_layers=4),
        Spec("llama_gqa_static", _llama_gqa, _kv_inputs(4, 4, 64), kv_out, kv_dyn, kv_layers=4,
             extra={"static": True}, note="static shapes: only the export-time sizes run"),
        Spec("gpt2_kv", _gpt2, _kv_inputs(4, 12, 64), kv_out, kv_dyn, kv_layers=4, ts_only=True),
        Spec("phi3_kv", _phi3, _kv_inputs(4, 2, 64), kv_out, kv_dyn, kv_layers=4),
        Spec("crnn", _plain(CRNN), [In("x", "float32", [BATCH, 3, 48, 320], {0: "batch", 3: "width"})],
             ["probs"], {"probs": {0: "batch", 1: "time"}}),
        Spec("audio_pad64", _plain(AudioPad64), [In("audio", "float32", [BATCH, 16000], {0: "batch", 1: "samples"})],
             ["logits"], {"logits": {0: "batch", 1: "time"}}),
        Spec("audio_frames480", _plain(AudioFrames480),
             [In("audio", "float32", [BATCH, 9600], {0: "batch", 1: "samples"})],
             ["logits"], {"logits": {0: "batch", 1: "frames"}}, ts_only=True,
             note="samples must be a multiple of 480"),
        Spec("clip_text", _clip_text, _text(["input_ids", "attention_mask"], seq=16), ["last_hidden_state"], enc),
        Spec("bart_dec", _bart_dec,
             [*_text(["input_ids", "attention_mask"]),
              In("encoder_hidden_states", "float32", [BATCH, 12, 256], {0: "batch", 1: "encoder_sequence"}),
              In("encoder_attention_mask", "int64", [BATCH, 12], {0: "batch", 1: "encoder_sequence"}, "mask")],
             ["last_hidden_state"], enc),
        Spec("whisper_dec", _whisper_dec,
             [*_text(["input_ids"]),
              In("encoder_hidden_states", "float32", [BATCH, 30, 256], {0: "batch", 1: "encoder_sequence"})],
             ["last_hidden_state"], enc),
        Spec("whisper_dec_kv", _whisper_dec_kv,
             [*_text(["input_ids"]),
              *[In(f"past_{i}_{kv}", "float32", [BATCH, 4, 30 if "cross" in kv else PAST, 64],
                   {0: "batch", 2: "encoder_sequence" if "cross" in kv else "past_sequence"})
                for i in range(2) for kv in ("key", "value", "cross_key", "cross_value")]],
             ["last_hidden_state"] + [f"present_{i}_{kv}" for i in range(2) for kv in ("key", "value")],
             {"last_hidden_state": {0: "batch", 1: "sequence"},
              **{f"present_{i}_{kv}": {0: "batch", 2: "past_sequence+sequence"} for i in range(2)
                 for kv in ("key", "value")}},
             note="self-attention past and cross-attention key/values as inputs"),
        Spec("swin_tiny", _swin, [In("pixel_values", "float32", [BATCH, 3, 64, 64], {0: "batch"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}, ts_only=True,
             note="the dynamo export fails in the window view"),
        Spec("segformer", _segformer, [In("pixel_values", "float32", [BATCH, 3, 64, 64], {0: "batch"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}),
        Spec("gpt2_lm", _gpt2_lm, _text(["input_ids", "attention_mask"]), ["logits"],
             {"logits": {0: "batch", 1: "sequence"}}, note="no KV cache"),
        Spec("mobilevit", _mobilevit, [In("pixel_values", "float32", [BATCH, 3, 256, 256], {0: "batch"})],
             ["last_hidden_state"], {"last_hidden_state": {0: "batch"}}),
    ]


# --------------------------------------------------------------------------- #
# Feeds, export, checks
# --------------------------------------------------------------------------- #
def make_feeds(inputs: list[In], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for i in inputs:
        if i.kind == "ids":
            a = rng.integers(0, i.high, i.shape)
        elif i.kind == "mask":
            a = np.ones(i.shape)
        elif i.kind == "positions":  # the new tokens follow the past
            past = next((x.shape[2] for x in inputs if x.name.startswith("past_key_values")), 0)
            a = np.broadcast_to(np.arange(past, past + i.shape[1]), i.shape)
        else:
            a = rng.standard_normal(i.shape)
        feeds[i.name] = np.ascontiguousarray(a).astype(i.dtype)
    return feeds


def _args(spec: Spec, feeds: dict[str, np.ndarray]) -> tuple:
    return tuple(torch.from_numpy(feeds[i.name]) for i in spec.inputs)


def export_ts(module: torch.nn.Module, spec: Spec, args: tuple, path: Path) -> None:
    axes: dict[str, dict[int, str]] = {i.name: i.dynamic for i in spec.inputs}
    axes.update(spec.out_dynamic)
    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                      input_names=[i.name for i in spec.inputs], output_names=spec.outputs,
                      dynamic_axes=None if spec.extra.get("static") else axes, do_constant_folding=True)


def export_dynamo(module: torch.nn.Module, spec: Spec, args: tuple, path: Path) -> None:
    from torch.export import Dim

    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        name = {"past_sequence+sequence": "total_sequence"}.get(name, name)
        if name not in dims:
            hi = {"sequence": 512, "samples": 480_000, "width": 8192}.get(name, 4096)
            dims[name] = Dim(name, min=2 if name != "batch" else 1, max=hi)
        return dims[name]

    shapes = [{ax: dim(n) for ax, n in i.dynamic.items()} for i in spec.inputs]
    program = torch.onnx.export(module, args, dynamo=True, opset_version=18,
                                input_names=[i.name for i in spec.inputs], output_names=spec.outputs,
                                dynamic_shapes=None if spec.extra.get("static") else tuple(shapes),
                                external_data=False)
    proto = program.model_proto
    strip_metadata(proto)
    onnx.save_model(proto, str(path), save_as_external_data=False)


def strip_metadata(proto: onnx.ModelProto) -> None:
    """Drop the dynamo exporter's per-node debug metadata (stack traces with local paths)."""
    graphs = [proto.graph]
    while graphs:
        g = graphs.pop()
        for n in g.node:
            del n.metadata_props[:]
            graphs.extend(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
        for v in (*g.value_info, *g.input, *g.output, *g.initializer):
            del v.metadata_props[:]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (f"{type(exc).__name__}: " + (lines[0] if lines else ""))[:300]


@dataclass
class Row:
    file: str
    model: str
    exporter: str
    opset: int
    nodes: int | None = None
    size_mb: float | None = None
    max_abs_diff: float | None = None
    export_s: float | None = None
    error: str | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


def export_one(spec: Spec, exporter: str, out: Path) -> Row:
    opset = 17 if exporter == "ts" else 18
    fname = f"{spec.name}_{exporter}{opset}.onnx"
    path = out / fname
    row = Row(fname, spec.name, exporter, opset, note=spec.note,
              inputs=[{"name": i.name, "dtype": i.dtype, "export_shape": i.shape,
                       "dynamic_axes": {str(k): v for k, v in i.dynamic.items()}} for i in spec.inputs])
    torch.manual_seed(0)
    module = spec.build()
    feeds = make_feeds(spec.inputs)
    args = _args(spec, feeds)
    with torch.no_grad():
        expected = module(*args)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            (export_ts if exporter == "ts" else export_dynamo)(module, spec, args, path)
        row.export_s = time.perf_counter() - t0
        for extra in out.glob(fname + ".data"):
            extra.unlink()
        onnx.checker.check_model(str(path), full_check=True)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        got = sess.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
        diff = 0.0
        for g, e in zip(got, expected, strict=True):
            e = e.detach().numpy()
            if g.shape != e.shape:
                raise ValueError(f"shape {g.shape} != torch {e.shape}")
            diff = max(diff, float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64)))))
        row.max_abs_diff = diff
    except Exception as exc:  # noqa: BLE001 - record and continue
        row.error = one_line(exc)
        if os.environ.get("CORPUS_TRACEBACK"):
            traceback.print_exc()
        path.unlink(missing_ok=True)
        return row
    proto = onnx.load(str(path), load_external_data=False)
    row.nodes = len(proto.graph.node)
    row.size_mb = path.stat().st_size / 2**20
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--exporters", default="ts,dynamo", help="comma-separated: ts, dynamo")
    ap.add_argument("--list", action="store_true", help="print the model names and exit")
    a = ap.parse_args(argv)
    specs = corpus()
    if a.list:
        for s in specs:
            print(s.name, "(ts only)" if s.ts_only else "")
        return 0
    if a.only:
        wanted = set(a.only.split(","))
        unknown = wanted - {s.name for s in specs}
        if unknown:
            ap.error(f"unknown model(s): {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.name in wanted]
    out = Path(a.out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ort.set_default_logger_severity(3)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows: list[Row] = []
    for spec in specs:
        for exp in a.exporters.split(","):
            if exp == "dynamo" and spec.ts_only:
                continue
            r = export_one(spec, exp, out)
            msg = r.error or f"{r.nodes} nodes, {r.size_mb:.1f} MB, diff {r.max_abs_diff:.1e}, {r.export_s:.0f} s"
            print(f"{r.file}: {msg}", file=sys.stderr, flush=True)
            rows.append(r)
    meta_path = out / "corpus.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    for r in rows:
        meta[r.file] = r.__dict__
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print("| file | nodes | MB | max abs diff vs torch | export s | status |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r.error:
            print(f"| {r.file} | - | - | - | - | FAILED: {r.error} |")
        else:
            print(f"| {r.file} | {r.nodes} | {r.size_mb:.1f} | {r.max_abs_diff:.1e} | {r.export_s:.0f} | ok {r.note} |")
    print(f"\nwrote {sum(not r.error for r in rows)} of {len(rows)}; metadata: {meta_path}")
    return 1 if rows and all(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
