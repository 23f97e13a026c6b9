"""FusionPass: onnxfuse's rules as an onnx-ir pass, for an `onnx_ir.passes.PassManager` (onnxscript's optimizer,
Olive, Optimum). It needs the optional extra `onnxfuse[ir]`; onnx_ir is imported only with this module, which
`import onnxfuse` leaves alone until `onnxfuse.FusionPass` is used."""

from __future__ import annotations

import os

from .errors import OnnxfuseError
from .options import check_target
from .rewrite.in_memory import RewriteResult, rewrite_model
from .rewrite.ruleset import RulesArg, chosen_rules
from .targets import HOST

try:
    import onnx_ir as ir
    import onnx_ir.passes  # noqa: F401  (onnx_ir.passes.FunctionalPass below)
except ImportError:
    raise OnnxfuseError("onnxfuse.FusionPass needs the onnx-ir package, which is not installed",
                        hint="pip install 'onnxfuse[ir]'") from None

__all__ = ["FusionPass"]


class FusionPass(ir.passes.FunctionalPass):
    """onnxfuse's rewrite (onnxfuse.rewrite_model: the rules to a fixed point with the exact cleanups; nothing
    validated or measured) as a functional onnx-ir pass: the input `onnx_ir.Model` is left as it is and
    `PassResult.model` is a new one, `modified` whether anything changed. The model goes through a ModelProto
    (onnx_ir.serde) both ways; tensors whose data is external are read into it from their folder.
    `rules`, `target` and `fold` as rewrite_model's; the rules are loaded and checked here, once.
    `last_result` is the RewriteResult of the latest call (what fired, what was skipped)."""

    def __init__(self, rules: RulesArg = None, *, target: str = HOST, fold: bool = True) -> None:
        super().__init__()
        self.rules = chosen_rules(rules)
        self.target = check_target("target", target)
        self.fold = fold
        self.last_result: RewriteResult | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        base_dir = _external_data_dir(model)
        result = rewrite_model(ir.serde.serialize_model(model), self.rules, target=self.target, fold=self.fold,
                               base_dir=base_dir)
        self.last_result = result
        if not result.changed:
            return ir.passes.PassResult(model.clone(), modified=False)
        return ir.passes.PassResult(ir.serde.deserialize_model(result.model), modified=True)


def _external_data_dir(model: ir.Model) -> str | None:
    """The one folder the model's external tensors are read from (ir.ExternalTensor.base_dir), None if none."""
    folders = {os.path.abspath(t.base_dir or ".") for t in _tensors(model.graph) if isinstance(t, ir.ExternalTensor)}
    if len(folders) > 1:
        raise OnnxfuseError(f"the model's external data lies in {len(folders)} folders ({', '.join(sorted(folders))})",
                            hint="load it into memory first: onnx_ir.external_data.load_to_model(model)")
    return folders.pop() if folders else None


def _tensors(graph: ir.Graph):
    """The initializers' and tensor attributes' values of `graph` and of its subgraphs."""
    for value in graph.initializers.values():
        if value.const_value is not None:
            yield value.const_value
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR:
                yield attr.value
            elif attr.type == ir.AttributeType.GRAPH:
                yield from (v.const_value for v in attr.value.initializers.values() if v.const_value is not None)
            elif attr.type == ir.AttributeType.GRAPHS:
                yield from (v.const_value for g in attr.value for v in g.initializers.values()
                            if v.const_value is not None)
