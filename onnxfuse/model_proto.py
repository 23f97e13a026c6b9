"""Models onnxfuse builds itself (a probe, a self-test model, a region cut out, a graph to infer or fold): every
one is made by `make_model`, with the lowest IR version its opsets need."""

from __future__ import annotations

from collections.abc import Iterable

import onnx

__all__ = ["make_model", "min_ir_version"]


def make_model(graph: onnx.GraphProto, opsets: dict[str, int] | Iterable[onnx.OperatorSetIdProto],
               ir_version: int | None = None) -> onnx.ModelProto:
    """A model onnxfuse builds itself (a probe, a self-test model, a region cut out, a graph to infer or fold):
    every one is made here. Its IR version is `ir_version` (a model derived from the user's keeps the user's),
    else the lowest its opsets need: onnx.helper.make_model alone would write the installed onnx's newest IR,
    which an onnxruntime older than that onnx refuses ("Unsupported model IR version")."""
    imports = ([onnx.helper.make_opsetid(d, v) for d, v in sorted(opsets.items())] if isinstance(opsets, dict)
               else list(opsets))
    if ir_version is None:
        ir_version = min_ir_version(imports)
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def min_ir_version(imports: Iterable[onnx.OperatorSetIdProto]) -> int:
    """The lowest IR version these opset imports need (domains onnx does not know need none); at least 3, the
    first with opset imports."""
    norm = [onnx.helper.make_opsetid("" if o.domain == "ai.onnx" else o.domain, o.version) for o in imports]
    return max(3, onnx.helper.find_min_ir_version_for(norm, ignore_unknown=True))
