"""Which fused ops each execution provider can run, asked of the installed onnxruntime's kernel registry."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

# Used only when the installed onnxruntime has no CUDA provider (CPU-only wheel), so `--target cuda` can still
# plan rewrites. Contrib ops with CUDA kernels in onnxruntime 1.18+ (com.microsoft domain).
CUDA_FALLBACK_CONTRIB = frozenset({
    "FusedConv", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization", "LayerNormalization",
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "Attention", "MultiHeadAttention",
    "EmbedLayerNormalization", "FusedMatMul", "BiasAdd", "BiasSoftmax", "GroupNorm", "NhwcConv", "BiasSplitGelu",
    "RotaryEmbedding", "GroupQueryAttention", "TransposeMatMul", "FusedGemm",
})


@dataclass(frozen=True)
class KernelInfo:
    types: tuple[frozenset[str], ...]  # per kernel: every type string any of its constraints accepts


@functools.cache
def _registry() -> dict[tuple[str, str, str], KernelInfo]:
    import onnxruntime.capi.onnxruntime_pybind11_state as C

    acc: dict[tuple[str, str, str], list[frozenset[str]]] = {}
    for k in C.get_all_opkernel_def():
        domain = "" if k.domain in ("", "ai.onnx") else k.domain
        types = frozenset(t for lst in k.type_constraints.values() for t in lst)
        acc.setdefault((k.provider, domain, k.op_name), []).append(types)
    return {key: KernelInfo(tuple(v)) for key, v in acc.items()}


@functools.cache
def provider_registered(target: str) -> bool:
    provider = PROVIDERS[target]
    return any(p == provider for p, _, _ in _registry())


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _type_string(elem_type: int) -> str:
    return f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})"


def kernel_issue(domain: str, op: str, target: str, elem_type: int | None = None) -> str | None:
    """Why `domain.op` cannot run on `target` (None when it can, or when we cannot tell)."""
    provider = PROVIDERS[target]
    qual = f"{domain}.{op}" if domain else op
    if not provider_registered(target):
        if target == "cuda" and domain == "com.microsoft" and op not in CUDA_FALLBACK_CONTRIB:
            return f"no CUDA kernel for {qual} (built-in table; install onnxruntime-gpu to ask its registry)"
        return None
    info = _registry().get((provider, domain, op))
    if info is None:
        return f"no {target.upper()} kernel for {qual} in the installed onnxruntime"
    if elem_type:
        t = _type_string(elem_type)
        if not any(t in types or not types for types in info.types):
            return f"the {target.upper()} kernel for {qual} does not take {t}"
    return None
