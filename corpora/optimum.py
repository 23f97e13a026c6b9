"""Export small transformers through Hugging Face Optimum (`optimum-onnx`), the way its users get them: a corpus of
graphs written by another tool than onnxfuse's own generators, for the attention/norm/GELU concept rules.

Each model is built from a small config with random weights (seeded, biases non-zero as in a trained model;
nothing is downloaded) and exported with
`optimum.exporters.onnx.onnx_export_from_model`, Optimum's default post-processing and opset. Needs a Python with
torch, transformers and optimum-onnx (not onnxfuse's dependencies):

    python -m venv /tmp/venv-optimum && /tmp/venv-optimum/bin/pip install torch==2.13.0 optimum-onnx
    /tmp/venv-optimum/bin/python -m corpora.optimum /tmp/optimum [--only bert,gpt2]

Writes DIR/<name>.onnx (the main graph of each export; decoders with past are exported with_past and the
merged or decoder file is taken), DIR/forms.json in the format of corpora/forms.py (so that
benchmarks/forms_table.py runs on it), and prints one line per model. About 1-2 minutes for the whole list on 2 cores.
Then `python -m benchmarks.forms_table DIR` (or `onnxfuse explain`) shows what each tool fuses.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile

SMALL = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
             max_position_embeddings=128, vocab_size=512)

# name: (transformers config class, model class, task, extra config fields)
ARCHS = {
    "bert": ("BertConfig", "BertModel", "feature-extraction", {}),
    "roberta": ("RobertaConfig", "RobertaModel", "feature-extraction", {"max_position_embeddings": 130}),
    "distilbert": ("DistilBertConfig", "DistilBertModel", "feature-extraction",
                   {"dim": 64, "n_heads": 4, "hidden_dim": 128, "n_layers": 2}),
    "albert": ("AlbertConfig", "AlbertModel", "feature-extraction", {"embedding_size": 32}),
    "electra": ("ElectraConfig", "ElectraModel", "feature-extraction", {"embedding_size": 32}),
    "mpnet": ("MPNetConfig", "MPNetModel", "feature-extraction", {}),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaModel", "feature-extraction", {"max_position_embeddings": 130}),
    "deberta_v2": ("DebertaV2Config", "DebertaV2Model", "feature-extraction", {}),
    "vit": ("ViTConfig", "ViTModel", "feature-extraction", {"image_size": 32, "patch_size": 8}),
    "clip": None,  # text and vision towers in one graph (the text tower's causal mask is built from Shape)
    "gpt2": ("GPT2Config", "GPT2Model", "feature-extraction", {"n_embd": 64, "n_head": 4, "n_layer": 2,
                                                                 "n_positions": 128}),
    "gpt2_past": ("GPT2Config", "GPT2LMHeadModel", "text-generation-with-past",
                  {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128}),
    "llama_past": ("LlamaConfig", "LlamaForCausalLM", "text-generation-with-past",
                   {"num_key_value_heads": 2}),
    "qwen2_past": ("Qwen2Config", "Qwen2ForCausalLM", "text-generation-with-past", {"num_key_value_heads": 2}),
    "whisper_encoder": None,  # encoder-decoder: the encoder file of the export
}

# onnxruntime's transformers optimizer model_type for each family (forms_table.py falls back to bert)
ORT_MODEL_TYPE = {"gpt2": "gpt2", "vit": "vit", "clip": "clip", "whisper": "bart", "llama": "gpt2",
                  "qwen2": "gpt2"}


def _export(name: str, out_dir: str) -> str:
    import torch
    import transformers
    from optimum.exporters.onnx import onnx_export_from_model

    torch.manual_seed(0)
    if name == "whisper_encoder":
        cfg = transformers.WhisperConfig(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                                         encoder_layers=2, decoder_layers=2, encoder_ffn_dim=128,
                                         decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=1500,
                                         vocab_size=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         decoder_start_token_id=1)
        model, task = transformers.WhisperForConditionalGeneration(cfg), "automatic-speech-recognition"
    elif name == "clip":
        text = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                    max_position_embeddings=77, vocab_size=512)
        vision = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                      image_size=32, patch_size=8)
        cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
        model, task = transformers.CLIPModel(cfg), "feature-extraction"
    else:
        cfg_cls, model_cls, task, extra = ARCHS[name]
        cfg = getattr(transformers, cfg_cls)(**{**SMALL, **extra})
        model = getattr(transformers, model_cls)(cfg)
    model.eval()
    with torch.no_grad():  # trained models have non-zero biases (transformers initializes them to 0, and a rule
        for p in model.parameters():  # that drops an Add of zeros would hide the bias fusions)
            p.add_(torch.randn_like(p) * 0.02)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_export_from_model(model, tmp, task=task, do_validation=False)
        files = sorted(glob.glob(os.path.join(tmp, "*.onnx")))
        prefer = [f for f in files if os.path.basename(f) in ("model.onnx", "encoder_model.onnx",
                                                               "decoder_model_merged.onnx")]
        src = (prefer or files)[0]
        dst = os.path.join(out_dir, f"{name}.onnx")
        if glob.glob(src + "*data"):
            import onnx
            onnx.save(onnx.load(src), dst)
        else:
            shutil.copyfile(src, dst)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    names = [n for n in ARCHS if not args.only or n in args.only.split(",")]
    failed = 0
    manifest_path = os.path.join(args.out_dir, "forms.json")
    manifest = {}
    if os.path.exists(manifest_path) and args.only:
        manifest = json.load(open(manifest_path))["models"]
    for name in names:
        try:
            path = _export(name, args.out_dir)
            print(f"{name}: {path} ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
            import onnx
            opset = next((o.version for o in onnx.load(path, load_external_data=False).opset_import
                          if o.domain in ("", "ai.onnx")), None)
            manifest[name] = {"file": os.path.basename(path), "form": f"optimum {name}", "family": "optimum",
                              "model_type": ORT_MODEL_TYPE.get(name.split("_")[0], "bert"), "num_heads": 4,
                              "hidden_size": 64, "opset": opset, "bytes": os.path.getsize(path)}
        except Exception as e:  # one architecture the installed versions cannot export does not stop the rest
            failed += 1
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    with open(manifest_path, "w") as f:
        json.dump({"dims": {}, "models": manifest}, f, indent=1)
    return 1 if failed == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
