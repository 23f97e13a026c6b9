"""Read ONNX models: external data, >2 GB, shape inference, clear errors (writing: write.py; weights read lazily
from the model file: lazy.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..files import not_regular
from ..ir import Graph, Model, shell_copy
from ..opschema import runtime_only
from ..tensors import all_tensors, external_ref, iter_nodes, type_from_proto
from .lazy import lazy_weights
from .ort_check import OrtProbe, file_key, ort_probe
from .repair import repair_model, unrepairable
from .shape_values import slice_types


@dataclass(frozen=True)
class LoadInfo:
    path: str
    size_bytes: int
    external_data: bool
    external_bytes: int
    repairs: tuple[str, ...] = ()  # harmless defects repaired in the loaded copy (repair.py), one line each
    notes: tuple[str, ...] = ()  # what loading noticed and kept as it is
    lazy: bool = False  # embedded weights are read from the model file itself when needed (lazy_weights)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def load_model(path: str) -> tuple[Model, LoadInfo]:
    """Load a model without pulling external data into memory; repair harmless defects onnxruntime tolerates
    (repair.py); run shape inference for value types.

    A model onnx.checker rejects is accepted when onnxruntime creates a session for it (CPU, ORT_DISABLE_ALL)
    and the repairs make the checker pass; otherwise one ModelError line says why."""
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelError(f"{path}: is a directory, expected an .onnx file")
    kind = not_regular(os.stat(path).st_mode)
    if kind is not None:  # a FIFO or a device: never opened (a FIFO would wait for a writer, /dev/zero never ends)
        raise ModelError(f"{path}: is {kind}, not an ONNX model file (a model must be a regular file)")
    if not os.access(path, os.R_OK):
        raise ModelError(f"{path}: permission denied")
    size = os.path.getsize(path)
    if size == 0:
        raise ModelError(f"{path}: empty file, not an ONNX model")
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        raise ModelError(f"{path}: not a valid ONNX model ({_first_line(e)})") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelError(f"{path}: not a valid ONNX model (no graph)")
    base_dir = os.path.dirname(os.path.abspath(path))
    ext_bytes = _check_external_data(proto, base_dir, path)
    return checked_model(proto, path, base_dir, ext_bytes, lambda: ort_probe(path), file_key(path), size,
                         lazy_file=path)


def checked_model(proto: onnx.ModelProto, shown: str, base_dir: str, ext_bytes: int, probe: Callable[[], OrtProbe],
                  key: tuple | None, size: int, lazy_file: str | None = None) -> tuple[Model, LoadInfo]:
    """The loader's checks, repairs and shape inference on `proto`, the loader's own copy (repaired in place), read
    from `shown` (its file, or a name for a model in memory: load/from_proto.py). `probe` asks onnxruntime about the
    original as it was read; `key` caches per file (None: nothing cached); `lazy_file`: the file its large
    embedded weights may be read from lazily (lazy.py)."""
    refused = _check_model(proto, shown, ext_bytes > 0)
    if refused:  # onnx.checker rejects it: the bar is whether onnxruntime loads it
        found = probe()
        if found.error:
            raise ModelError(f"{shown}: invalid model: onnxruntime cannot load it ({found.error})")
    fixed = repair_model(proto, probe if refused else None, key)
    if fixed.suspect and not refused:  # defects onnxruntime usually refuses: it says so in one line
        found = probe()
        if found.error:
            raise ModelError(f"{shown}: invalid model: onnxruntime cannot load it ({found.error})")
    if refused or fixed.done:
        _recheck(proto, shown, refused)
    lazy = lazy_file is not None and ext_bytes == 0 and lazy_weights(proto, lazy_file)
    if lazy:  # the parsed weights are freed: the stripped model is parsed again on its own
        proto = onnx.load_from_string(proto.SerializeToString())
    inferred = infer_types(proto)
    model = Model(proto, base_dir)
    model.names.update(n.name for n in iter_nodes(proto.graph))  # node names given by a repair stay unique
    if inferred is not None:
        merge_types(model.graph, inferred.graph)
    model.graph.types.update(slice_types(model.graph, [n.proto for n in model.graph.nodes]))
    return model, LoadInfo(shown, size, ext_bytes > 0, ext_bytes, tuple(fixed.done), tuple(fixed.notes), lazy)


def _recheck(proto: onnx.ModelProto, path: str, refused: str | None) -> None:
    """The repaired copy must pass onnx.checker (the output is checked with it too)."""
    left = unrepairable(proto)
    if left:
        raise ModelError(f"{path}: {left[0]}", hint=left[1])
    error = checker_error(proto)
    error = error and error.splitlines()[0]
    if error and refused:
        before = f" (before repair: {refused})" if refused != error else ""
        raise ModelError(f"{path}: invalid model: onnxruntime loads it, but onnx.checker still rejects it after "
                         f"repair: {error}{before}")
    if error:
        raise ModelError(f"{path}: invalid model: onnx.checker rejects the repaired copy: {error}")


def _check_external_data(proto: onnx.ModelProto, base_dir: str, path: str) -> int:
    """Every external tensor's fields are well formed (tensors.external_ref), its file is a regular file inside
    the model's folder, and it holds the bytes; returns their total."""
    total = 0
    for t in all_tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        try:
            ref = external_ref(t)
        except ModelError as e:
            raise ModelError(f"{path}: {e.message}") from None
        loc = ref.location
        full = os.path.join(base_dir, loc)
        if os.path.isabs(loc) or os.path.normpath(loc).split(os.sep)[0] == os.pardir:
            raise ModelError(
                f"{path}: tensor {t.name!r} has external data location {loc!r} outside the model's folder (refused)"
            )
        # through symbolic links, as onnxruntime checks it: the data's real file inside the model file's real
        # folder (the Hugging Face hub cache links snapshots/<rev>/model.onnx and model.onnx_data into blobs/)
        real_dir = os.path.dirname(os.path.realpath(path))
        if os.path.exists(full) and os.path.commonpath([real_dir, os.path.realpath(full)]) != real_dir:
            raise ModelError(
                f"{path}: tensor {t.name!r} has external data {loc!r} that a symbolic link places outside the model "
                f"file's real folder {real_dir} (onnxruntime refuses it too)",
                hint="link the folder instead of each file, or put the data file beside the model's real file")
        if not os.path.exists(full):
            raise ModelError(f"{path}: external data file {loc!r} for tensor {t.name!r} is missing")
        if not os.path.isfile(full):
            raise ModelError(f"{path}: external data file {loc!r} for tensor {t.name!r} is not a regular file")
        size = os.path.getsize(full)
        length = size - ref.offset if ref.length is None else ref.length
        if ref.offset + max(length, 0) > size or length < 0:
            raise ModelError(
                f"{path}: external data file {loc!r} is truncated (tensor {t.name!r} needs bytes "
                f"{ref.offset}..{ref.offset + max(length, 0)}, file has {size})"
            )
        total += length
    return total


def _check_model(proto: onnx.ModelProto, path: str, external: bool) -> str | None:
    """Raise for what onnxfuse cannot handle; return onnx.checker's complaint (first line), None if it passes."""
    max_opset = onnx.defs.onnx_opset_version()
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > max_opset:
            raise ModelError(
                f"{path}: model uses opset {o.version}, newer than the installed onnx supports ({max_opset})",
                hint="upgrade the onnx package",
            )
    _check_graph_structure(proto.graph, path, set())
    # with external data the checker must see the file's folder to resolve data locations
    # on a copy without the weights: the checker serializes what it is given (external data was checked above)
    error = checker_error(proto)
    return error and error.splitlines()[0]


def _checker_error(model: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(runtime_only_masked(model))
    except onnx.checker.ValidationError as e:
        if "topologically sorted" in str(e):
            return None  # acyclic (checked before) but out of order: the writer emits a sorted graph
        return str(e).strip()
    return None


def checker_error(proto: onnx.ModelProto) -> str | None:
    """onnx.checker's complaint about `proto` (its whole text: the first line says what, a later one may name the
    node), None when it passes. It runs on a weightless copy, and nodes onnxruntime registers in the ONNX domain
    where ONNX has no schema (opschema.runtime_only: a LayerNormalization at opset 16) are carried through
    unchecked: onnxruntime, which validation runs next, is their judge."""
    return _checker_error(weightless(proto))


MASK_DOMAIN = "onnxfuse.runtime_only"  # the checker checks no schema in a domain it does not know


def runtime_only_masked(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto`, or a copy whose nodes of ops onnxruntime registers in the ONNX domain where ONNX has none
    (opschema.runtime_only) sit in MASK_DOMAIN, for onnx.checker to pass over them: such a model is one
    onnxruntime runs and onnxfuse reads (its own output never holds one: rebuild.defined_ops_only)."""
    opset = _default_opset(proto.opset_import)
    if opset is None or not any(runtime_only(n.op_type, opset) for n in iter_nodes(proto.graph)
                                if n.domain in ("", "ai.onnx")):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for n in iter_nodes(out.graph):
        if n.domain in ("", "ai.onnx") and runtime_only(n.op_type, opset):
            n.domain = MASK_DOMAIN
    out.opset_import.add(domain=MASK_DOMAIN, version=1)
    return out


def _default_opset(imports) -> int | None:
    return next((o.version for o in imports if o.domain in ("", "ai.onnx")), None)


def _check_graph_structure(graph: onnx.GraphProto, path: str, outer: set[str]) -> None:
    produced: dict[str, str] = {}
    for n in graph.node:
        for o in n.output:
            if o and o in produced:
                raise ModelError(f"{path}: value {o!r} is produced by two nodes ({produced[o]!r}, {n.name!r})")
            if o:
                produced[o] = n.name or n.op_type
    seen_outputs: set[str] = set()
    for o in graph.output:
        if o.name in seen_outputs:
            raise ModelError(f"{path}: graph output {o.name!r} is listed twice")
        seen_outputs.add(o.name)
    known = outer | {v.name for v in graph.input} | {t.name for t in graph.initializer} | set(produced)
    for n in graph.node:
        for i in n.input:
            if i and i not in known:
                raise ModelError(f"{path}: node {n.name or n.op_type!r} reads {i!r}, which nothing produces")
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                _check_graph_structure(g, path, known)
    for o in graph.output:
        if o.name not in known:
            raise ModelError(f"{path}: graph output {o.name!r} is not produced by any node")
    cycle = _find_cycle(graph)
    if cycle:
        raise ModelError(f"{path}: graph {graph.name!r} has a cycle through {' -> '.join(cycle[:6])}")


def _find_cycle(graph: onnx.GraphProto) -> list[str] | None:
    """Values on a cycle (iterative DFS over producer edges), or None."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    deps = [[producer[x] for x in n.input if x in producer] for n in graph.node]
    state = [0] * len(graph.node)  # 0 new, 1 on stack, 2 done
    for start in range(len(graph.node)):
        if state[start]:
            continue
        stack = [(start, 0)]
        state[start] = 1
        while stack:
            node, k = stack[-1]
            if k < len(deps[node]):
                stack[-1] = (node, k + 1)
                nxt = deps[node][k]
                if state[nxt] == 1:
                    names = [graph.node[i].output[0] for i, _ in stack]
                    return names[[i for i, _ in stack].index(nxt):]
                if state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                stack.pop()
    return None


SMALL_ELEMENTS = 4096  # initializers up to this size stay in weightless copies (shapes, axes, small constants)


def weightless(proto: onnx.ModelProto, stubs: bool = False) -> onnx.ModelProto:
    """A copy of `proto` without its large initializers (embedded or external): each becomes a graph input of the
    same type and shape, or, with `stubs` (for shape inference), an initializer of that type and shape whose data
    is external in a file that does not exist (inference reads types and dims, never the data; onnx's data
    propagation walks every element of a 1-D graph input an Add or Mul reads: 7 s for a 128 MB 1-D weight as an
    input, nothing as a stub). Shape inference and onnx.checker serialize what they are given, so on a 140 MB
    model this saves three copies of the weights and most of their time; data propagation still sees the small
    constants (shape values, axes). Subgraphs are copied as they are. `proto` itself when it has no large ones."""
    g = proto.graph
    big = [t for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL or _elements(t) > SMALL_ELEMENTS]
    if not big:
        return proto
    out = onnx.ModelProto()
    shell_copy(proto, out, skip=("graph",))
    shell_copy(g, out.graph, skip=("initializer",))
    dropped = {t.name for t in big}
    for t in g.initializer:
        if t.name not in dropped:
            out.graph.initializer.append(t)
        elif stubs:
            stub = out.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                             data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value=STUB_LOCATION)
    if not stubs:
        known = {i.name for i in g.input}
        out.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                               for t in big if t.name not in known)
    return out


STUB_LOCATION = "onnxfuse-shape-inference-stub"  # no such file: a stub's data is never read


def _elements(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def infer_types(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """Shape inference on a weightless copy (symbolic dims stay symbolic); best effort: None when it fails. The
    result's graph has the inputs of `proto` (the large initializers' stand-in inputs are dropped again)."""
    light = weightless(proto, stubs=True)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return None
    del inferred.graph.input[len(proto.graph.input):]
    return inferred


def merge_types(g: Graph, src: onnx.GraphProto) -> None:
    """Copy inferred types into `g`, then into its subgraphs (same node order in `src`)."""
    for vi in list(src.value_info) + list(src.output) + list(src.input):
        t = type_from_proto(vi.type)
        if t is not None and (vi.name not in g.types or g.types[vi.name].shape is None):
            g.set_type(vi.name, t)
    for node, src_node in zip(g.nodes, src.node, strict=False):
        for a in src_node.attribute:
            subs = node.subgraphs.get(a.name, [])
            srcs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub, sub_src in zip(subs, srcs, strict=False):
                merge_types(sub, sub_src)
