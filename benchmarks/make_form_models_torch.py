#!/usr/bin/env python3
"""Optional: tiny random HF BERT and GPT-2 exported with the TorchScript exporter (``dynamo=False``) at opset 11
and 14, the forms Hugging Face Optimum users get. Needs ``pip install torch==2.13.0 'transformers>=5,<6'``.

Usage::

    python benchmarks/make_form_models_torch.py [OUT_DIR]          # default /tmp/forms; updates forms.json
    python benchmarks/make_form_models.py --torch OUT_DIR          # the same, after the core corpus

Configs are built after ``torch.manual_seed(0)`` (nothing downloaded): hidden 64, 4 heads, 2 layers,
vocabulary 100, 64 positions. An export that fails is reported in one line and left out.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _export(model, args, names, out_names, dyn, path: Path, opset: int) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), input_names=names, output_names=out_names,
                          dynamic_axes=dyn, opset_version=opset, dynamo=False, do_constant_folding=True)


def export_all(out: Path) -> dict[str, dict]:
    import torch
    import transformers

    class Wrap(torch.nn.Module):
        """Positional inputs -> last_hidden_state (the exporter then never sees transformers' kwargs)."""

        def __init__(self, model, names):
            super().__init__()
            self.model, self.names = model, names

        def forward(self, *args):
            return self.model(**dict(zip(self.names, args, strict=True)), use_cache=False).last_hidden_state

    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, dict] = {}
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[-1, -2:] = 0
    for opset in (11, 14):
        for kind in ("bert", "gpt2"):
            name = f"hf_{kind}_ts{opset}"
            torch.manual_seed(0)
            try:
                if kind == "bert":
                    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=256,
                                                  max_position_embeddings=64, attn_implementation="eager")
                    model = transformers.BertModel(cfg).eval()
                    args = (ids, mask, torch.zeros_like(ids))
                    names = ["input_ids", "attention_mask", "token_type_ids"]
                else:
                    cfg = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                  attn_implementation="eager", use_cache=False)
                    model = transformers.GPT2Model(cfg).eval()
                    args = (ids, mask)
                    names = ["input_ids", "attention_mask"]
                dyn = {n: {0: "batch", 1: "seq"} for n in names}
                dyn["last_hidden_state"] = {0: "batch", 1: "seq"}
                path = out / f"{name}.onnx"
                _export(Wrap(model, names), args, names, ["last_hidden_state"], dyn, path, opset)
                res[name] = {"file": path.name, "form": f"HF {kind} TorchScript exporter opset {opset}",
                             "family": "attention", "model_type": kind, "num_heads": 4, "hidden_size": 64,
                             "opset": opset, "bytes": path.stat().st_size}
                print(f"{name:28} {path.stat().st_size / 1024:7.1f} KB")
            except Exception as exc:  # noqa: BLE001 - reported, left out
                print(f"{name}: export failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return res


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/forms")
    res = export_all(out)
    manifest_path = out / "forms.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    manifest["models"].update(res)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
