"""Kernel facts for a target whose provider compiles graphs instead of registering kernels (OpenVINO): asked of
the provider itself, with that provider installed, and written beside the published table:

    python -m onnxfuse.inspect.kernel_probe openvino        # writes onnxfuse/kernels/openvino_kernels.json

For every built-in rule, at each opset and floating dtype its self-test builds, the rule is applied to its
generated model and each node it made is cut out into a one-node model (its inputs as they run on the CPU
provider, constants kept as initializers). The node is *claimed* when a session with the target's provider
alone, `session.disable_cpu_ep_fallback` set, loads and runs it; otherwise onnxruntime refuses the session
("nodes that are assigned to the default CPU EP") and the node is recorded as refused. The file records the
claimed opsets and input-0 element types per op (an opset where some node of the op was refused counts as
refused, a contrib op refused anywhere is refused), the refusals with onnxruntime's reason, and the source
(package, onnxruntime version, provider options). An op not probed has no facts: the target refuses it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata, resources

import numpy as np
import onnx

from ..ir import Model
from ..load.loader import merge_types
from ..match.matcher import Matcher
from ..model_proto import make_model
from ..opschema import input_type_str
from ..patterns.compute import ComputeError
from ..patterns.rules import Rule
from ..rewrite.apply import apply_match
from ..rewrite.ruleset import load_rules
from ..targets import HOST, elem_name, get, session_providers
from .selftest_models import Builder, Mutation, claimed_dtypes, instances, rule_opsets

REFUSED = "nodes that are assigned to the default CPU EP"  # onnxruntime's words when the provider left a node


@dataclass
class OpFacts:
    claimed: dict[int, set[str]] = field(default_factory=dict)  # opset -> input-0 element types claimed
    refused: dict[int, str] = field(default_factory=dict)  # opset -> why (first line)
    probed: set[int] = field(default_factory=set)


def _typed(model: onnx.ModelProto) -> Model:
    m = Model(model, ".")
    merge_types(m.graph, onnx.shape_inference.infer_shapes(model).graph)
    return m


def rewritten(rule: Rule, opset: int, elem: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]] | None:
    """The rule's generated model (first alternative) with the rule applied once: (model, feeds, names of the
    nodes it made); None when no model builds or the rule does not fire on it."""
    inst = instances(rule)[0][0]
    try:
        model, feeds = Builder(rule, inst, opset, True, Mutation(dtype=elem), np.random.default_rng(0)).build()
        m = _typed(model)
    except Exception:  # noqa: BLE001 - this opset or dtype cannot express the instance
        return None
    matcher = Matcher(rule, m.graph)
    for node in list(m.graph.live_nodes()):
        if (node.domain, node.op_type) in rule.root_ops() and (b := matcher.match(node)) is not None:
            try:
                app = apply_match(rule, m.graph, b)
            except ComputeError:
                return None
            return m.export(), feeds, set(app.created)
    return None


def _values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Every value of the model as the CPU provider computes it (None when it cannot run it)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for n in probe.graph.node:
        probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v) for v in n.output
                                  if v and v not in known)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), so, providers=session_providers(HOST))
        outs = sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - a fused op with no CPU kernel (CUDA-only): not probed
        return None
    return {**feeds, **{o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}}


def one_node_models(model: onnx.ModelProto, feeds: dict[str, np.ndarray], created: set[str]
                    ) -> Iterator[tuple[onnx.NodeProto, onnx.ModelProto, dict[str, np.ndarray]]]:
    values = _values(model, feeds)
    if values is None:
        return
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.name not in created:
            continue
        ins, init, node_feeds = [], [], {}
        for v in dict.fromkeys(i for i in node.input if i):
            if v in inits:
                init.append(inits[v])
            else:
                a = values[v]
                ins.append(onnx.helper.make_tensor_value_info(
                    v, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
                node_feeds[v] = a
        outs = [onnx.helper.make_tensor_value_info(o, onnx.helper.np_dtype_to_tensor_dtype(values[o].dtype),
                                                   values[o].shape) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "probe", ins, outs, init)
        yield node, make_model(graph, model.opset_import), node_feeds


def claims(target: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> str | None:
    """None when the target's provider alone loads and runs the model, else onnxruntime's reason."""
    import onnxruntime as ort

    t = get(target)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=[t.provider],
                                    provider_options=[dict(t.provider_options)])
        sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own types
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return "not claimed (onnxruntime assigned it to the CPU provider)" if REFUSED in text else text[:200]
    return None


def probe(target: str, rules: list[Rule] | None = None, log=None) -> dict[tuple[str, str], OpFacts]:
    facts: dict[tuple[str, str], OpFacts] = {}
    done: set[tuple[str, str, int, int]] = set()
    for rule in rules if rules is not None else load_rules():
        for elem in claimed_dtypes(rule):
            for opset in rule_opsets(rule):
                if all((d, o, opset, elem) in done for d, o in rule.output_ops()):
                    continue
                built = rewritten(rule, opset, elem)
                if built is None:
                    continue
                for node, model, feeds in one_node_models(*built):
                    key = (node.domain, node.op_type, opset, elem)
                    if key in done:
                        continue
                    done.add(key)
                    f = facts.setdefault((node.domain, node.op_type), OpFacts())
                    f.probed.add(opset)
                    why = claims(target, model, feeds)
                    if why is None:
                        first = next((i for i in node.input if i), None)
                        t = next((v.type.tensor_type.elem_type for v in [*model.graph.input]
                                  if v.name == first), None)
                        if t is None:
                            t = next((i.data_type for i in model.graph.initializer if i.name == first), elem)
                        f.claimed.setdefault(opset, set()).add(elem_name(t))
                    else:
                        f.refused.setdefault(opset, why)
                    if log:
                        log(f"{rule.id}: {node.domain + '.' if node.domain else ''}{node.op_type} opset {opset} "
                            f"{elem_name(elem)}: {'claimed' if why is None else why}")
    return facts


def claimed_ranges(claimed: set[int], probed: set[int]) -> list[tuple[int, int | None]]:
    """Runs of claimed opsets among the probed ones: [since, until] (until None past the last probed opset)."""
    out: list[tuple[int, int | None]] = []
    start = prev = None
    top = max(probed)
    for o in sorted(probed):
        if o in claimed:
            start = o if start is None else start
            prev = o
        elif start is not None:
            out.append((start, prev))
            start = None
    if start is not None:
        out.append((start, None if prev == top else prev))
    return out


def facts_json(target: str, facts: dict[tuple[str, str], OpFacts]) -> dict:
    import onnxruntime as ort

    t = get(target)
    try:
        package = next(d for d in ("onnxruntime-openvino", "onnxruntime-gpu", "onnxruntime")
                       if _installed(d))
    except StopIteration:
        package = "onnxruntime"
    kernels: dict[str, dict[str, list]] = {}
    refused: dict[str, str] = {}
    for (domain, op), f in sorted(facts.items()):
        qual = f"{domain}.{op}" if domain else op
        # an opset where one node was claimed and another refused (Expand: by its inputs) counts as refused, as
        # does a contrib op refused anywhere (its kernels are not versioned by the model's opset): only what the
        # provider always ran is written for it
        sure = {o for o in f.claimed if o not in f.refused}
        if sure and not (domain and f.refused):
            ks = []
            for since, until in (claimed_ranges(sure, f.probed) if not domain else [(1, None)]):
                types = sorted(set().union(*(ts for o, ts in f.claimed.items() if o in sure
                                             and o >= since and (until is None or o <= until))))
                con = input_type_str(domain, op, 0, since if not domain else None) or "T"
                ks.append([since, until, {} if con.startswith("tensor(") else {con: types}])
            kernels.setdefault(domain, {})[op] = ks
        if f.refused:
            refused[qual] = "; ".join(f"opset {o}: {why}" for o, why in sorted(f.refused.items()))
    return {
        "source": {
            "probe": f"python -m onnxfuse.inspect.kernel_probe {target}",
            "package": package, "onnxruntime": ort.__version__, "provider": t.provider,
            "provider_options": dict(t.provider_options),
            "how": "each node the built-in rules make, cut out of their self-test models into a one-node model, "
                   "claimed when a session with this provider alone (session.disable_cpu_ep_fallback=1) loads "
                   "and runs it; an op not listed under kernels is refused",
        },
        "kernels": {t.provider: kernels},
        "refused": refused,
    }


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("-o", "--output", help="default: the target's facts file in onnxfuse/kernels/")
    ap.add_argument("--rule", action="append", default=[], help="probe only these built-in rules' ops")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    t = get(a.target)
    if t.facts == "registry":
        print(f"{t.name}: its facts are onnxruntime's kernel registry (kernels/generate.py), not probed",
              file=sys.stderr)
        return 2
    import onnxruntime as ort

    if t.provider not in ort.get_available_providers():
        print(f"the installed onnxruntime has no {t.provider} (hint: {t.install})", file=sys.stderr)
        return 2
    rules = load_rules(only=a.rule) if a.rule else None
    facts = probe(a.target, rules, log=(lambda s: print(s, file=sys.stderr)) if a.verbose else None)
    out = a.output or str(resources.files("onnxfuse.kernels").joinpath(t.facts))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(facts_json(a.target, facts), f, indent=1, sort_keys=True)
        f.write("\n")
    claimed = sum(len(ops) for ops in facts_json(a.target, facts)["kernels"][t.provider].values())
    print(f"{out}: {claimed} of {len(facts)} ops claimed by {t.provider}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
