#!/usr/bin/env python3
"""Optional: tiny random HF BERT and GPT-2 exported with the TorchScript exporter (``dynamo=False``) at opset 11
and 14, the forms Hugging Face Optimum users get; and timm's Conv2dSame (run-time 'same' padding on a static
input) at opset 13 and 17. Needs ``pip install torch==2.13.0 'transformers>=5,<6'``.

Usage::

    python -m corpora.forms_torch [OUT_DIR]          # default /tmp/forms; updates forms.json
    python -m corpora.forms --torch OUT_DIR          # the same, after the core corpus

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


def export_same_pad(out: Path) -> dict[str, dict]:
    """timm's Conv2dSame (EfficientNet-B0 ported from TensorFlow): 'same' padding computed from x.shape at run time
    (ceil(ih / s), the clamp at 0, the halves; Shape/Gather/.../Concat/Pad after export), five such convolutions,
    exported with a static input shape at opset 13 and 17: every padding is a constant in fact."""
    import torch
    import torch.nn.functional as F

    def same_padding(x, k, s, d):   # timm.layers.padding.get_same_padding, the branch tracing takes
        return torch.clamp(((x / s).ceil() - 1) * s + (k - 1) * d + 1 - x, min=0)

    class Conv2dSame(torch.nn.Conv2d):   # timm.layers.conv2d_same.Conv2dSame with pad_same
        def forward(self, x):
            ih, iw = x.size()[-2:]
            ph = same_padding(ih, self.kernel_size[0], self.stride[0], self.dilation[0])
            pw = same_padding(iw, self.kernel_size[1], self.stride[1], self.dilation[1])
            x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
            return F.conv2d(x, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = Conv2dSame(3, 16, 3, stride=2)
            self.dw1 = Conv2dSame(16, 16, 3, groups=16)
            self.pw1 = torch.nn.Conv2d(16, 24, 1)
            self.dw2 = Conv2dSame(24, 24, 5, stride=2, groups=24)
            self.dw3 = Conv2dSame(24, 24, 3, stride=2, groups=24)
            self.dw4 = Conv2dSame(24, 24, 5, groups=24)

        def forward(self, x):
            x = torch.nn.functional.silu(self.stem(x))
            x = self.pw1(torch.nn.functional.silu(self.dw1(x)))
            x = torch.nn.functional.silu(self.dw2(x))
            return self.dw4(torch.nn.functional.silu(self.dw3(x)))

    res: dict[str, dict] = {}
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 65, 65)
    for opset in (13, 17):
        name = f"same_pad_ts{opset}"
        path = out / f"{name}.onnx"
        try:
            _export(net, (x,), ["pixel_values"], ["features"], None, path, opset)
        except Exception as exc:  # noqa: BLE001 - reported, left out
            print(f"{name}: export failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            continue
        res[name] = {"file": path.name, "form": f"timm Conv2dSame: run-time TF 'same' padding, static input, "
                     f"TorchScript opset {opset}", "family": "shape", "model_type": "bert", "num_heads": 0,
                     "hidden_size": 0, "opset": opset, "bytes": path.stat().st_size}
        print(f"{name:28} {path.stat().st_size / 1024:7.1f} KB")
    return res


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/forms")
    res = export_all(out)
    res.update(export_same_pad(out))
    manifest_path = out / "forms.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    manifest["models"].update(res)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
