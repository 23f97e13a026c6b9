"""Read and write ONNX models: external data, >2 GB, shape inference, clear errors, atomic writes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelError
from ..ir import Graph, Model, shell_copy
from ..opschema import runtime_only
from ..tensors import external_info, iter_nodes, type_from_proto
from .ort_check import file_key, ort_probe
from .repair import repair_model, unrepairable

EXTERNAL_THRESHOLD = 1024  # bytes: tensors at least this large go to the external data file


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
    refused = _check_model(proto, path, ext_bytes > 0)
    if refused:  # onnx.checker rejects it: the bar is whether onnxruntime loads it
        probe = ort_probe(path)
        if probe.error:
            raise ModelError(f"{path}: invalid model: onnxruntime cannot load it ({probe.error})")
    fixed = repair_model(proto, (lambda: ort_probe(path)) if refused else None, file_key(path))
    if fixed.suspect and not refused:  # defects onnxruntime usually refuses: it says so in one line
        probe = ort_probe(path)
        if probe.error:
            raise ModelError(f"{path}: invalid model: onnxruntime cannot load it ({probe.error})")
    if refused or fixed.done:
        _recheck(proto, path, refused)
    lazy = ext_bytes == 0 and lazy_weights(proto, path)
    if lazy:  # the parsed weights are freed: the stripped model is parsed again on its own
        proto = onnx.load_from_string(proto.SerializeToString())
    inferred = infer_types(proto)
    model = Model(proto, base_dir)
    model.names.update(n.name for n in iter_nodes(proto.graph))  # node names given by a repair stay unique
    if inferred is not None:
        merge_types(model.graph, inferred.graph)
    return model, LoadInfo(path, size, ext_bytes > 0, ext_bytes, tuple(fixed.done), tuple(fixed.notes), lazy)


LAZY_MIN_BYTES = 8 << 20  # embedded weights at least this large are read lazily from the model file


def lazy_weights(proto: onnx.ModelProto, path: str) -> bool:
    """Make the main graph's large embedded initializers references into the model file itself (external data
    whose location is the file, at the raw bytes' offset): every copy of the model onnxfuse makes (rebuilds,
    candidates, exports) is then a few hundred KB, and onnxruntime reads the weights from the file. Only when
    the file's folder is writable (candidates are written beside it, where onnxruntime accepts the reference)
    and there is at least LAZY_MIN_BYTES of them; the writer puts them back inline (save_model). Returns
    whether it did."""
    folder = os.path.dirname(os.path.abspath(path))
    big = [t for t in proto.graph.initializer if t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_THRESHOLD]
    if sum(len(t.raw_data) for t in big) < LAZY_MIN_BYTES or not os.access(folder, os.W_OK):
        return False
    try:
        offsets = initializer_offsets(path)
    except (OSError, ValueError):
        return False
    location = os.path.basename(path)
    done = False
    for t in big:
        where = offsets.get(t.name)
        if where is None or where[1] != len(t.raw_data):
            continue
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", str(where[0])), ("length", str(where[1]))):
            e = t.external_data.add()
            e.key, e.value = k, v
        done = True
    return done


def initializer_offsets(path: str) -> dict[str, tuple[int, int]]:
    """(offset, length) of each main-graph initializer's raw_data in the file, read from the protobuf wire format
    (ModelProto.graph = 7, GraphProto.initializer = 5, TensorProto.name = 8, raw_data = 9); names that occur
    twice are left out."""
    import mmap

    out: dict[str, tuple[int, int]] = {}
    seen: set[str] = set()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for num, start, end in _fields(m, 0, len(m)):
            if num != 7:
                continue
            for gnum, gstart, gend in _fields(m, start, end):
                if gnum != 5:
                    continue
                name, raw = None, None
                for tnum, tstart, tend in _fields(m, gstart, gend):
                    if tnum == 8:
                        name = bytes(m[tstart:tend]).decode("utf-8", "replace")
                    elif tnum == 9:
                        raw = (tstart, tend - tstart)
                if name is not None and raw is not None:
                    if name in seen:
                        out.pop(name, None)
                    else:
                        out[name] = raw
                    seen.add(name)
    return out


def _read_varint(m, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = m[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(m, pos: int, end: int):
    """(field number, start, end) of each length-delimited field of the message in m[pos:end]; other wire types
    are skipped."""
    while pos < end:
        key, pos = _read_varint(m, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(m, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _read_varint(m, pos)
            yield num, pos, pos + n
            pos += n
        else:
            raise ValueError(f"unexpected wire type {wire}")


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


def all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from all_tensors(g)


def _check_external_data(proto: onnx.ModelProto, base_dir: str, path: str) -> int:
    total = 0
    real_base = os.path.realpath(base_dir)
    for t in all_tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = external_info(t)
        loc = info.get("location", "")
        full = os.path.realpath(os.path.join(base_dir, loc))
        if not loc or os.path.isabs(loc) or os.path.commonpath([real_base, full]) != real_base:
            raise ModelError(
                f"{path}: tensor {t.name!r} has external data location {loc!r} outside the model's folder (refused)"
            )
        if not os.path.isfile(full):
            raise ModelError(f"{path}: external data file {loc!r} for tensor {t.name!r} is missing")
        offset = int(info.get("offset", 0))
        length = int(info.get("length", os.path.getsize(full) - offset))
        if offset + length > os.path.getsize(full):
            raise ModelError(
                f"{path}: external data file {loc!r} is truncated (tensor {t.name!r} needs bytes "
                f"{offset}..{offset + length}, file has {os.path.getsize(full)})"
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
        onnx.checker.check_model(_runtime_only_masked(model))
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


def _runtime_only_masked(proto: onnx.ModelProto) -> onnx.ModelProto:
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


def weightless(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` without its large initializers (embedded or external): each becomes a graph input of the
    same type and shape. Shape inference and onnx.checker serialize what they are given, so on a 140 MB model
    this saves three copies of the weights and most of their time; data propagation still sees the small
    constants (shape values, axes). Subgraphs are copied as they are. `proto` itself when it has no large ones."""
    g = proto.graph
    big = [t for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL or _elements(t) > SMALL_ELEMENTS]
    if not big:
        return proto
    out = onnx.ModelProto()
    shell_copy(proto, out, skip=("graph",))
    shell_copy(g, out.graph, skip=("initializer",))
    dropped = {t.name for t in big}
    out.graph.initializer.extend(t for t in g.initializer if t.name not in dropped)
    known = {i.name for i in g.input}
    out.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                           for t in big if t.name not in known)
    return out


def _elements(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def infer_types(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """Shape inference on a weightless copy (symbolic dims stay symbolic); best effort: None when it fails. The
    result's graph has the inputs of `proto` (the large initializers' stand-in inputs are dropped again)."""
    light = weightless(proto)
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
            g.types[vi.name] = t
    for node, src_node in zip(g.nodes, src.node, strict=False):
        for a in src_node.attribute:
            subs = node.subgraphs.get(a.name, [])
            srcs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub, sub_src in zip(subs, srcs, strict=False):
                merge_types(sub, sub_src)


# ----- writing ---------------------------------------------------------------------------------------------
def save_model(
    proto: onnx.ModelProto,
    out_path: str,
    source_base_dir: str,
    external: bool,
    lazy_location: str | None = None,
) -> list[str]:
    """Write atomically: to temporary files in the target folder, then rename. Returns the files written.

    Tensors whose data lives in the source model's external file are streamed across, never all in memory.
    `lazy_location`: the source model's file name when its embedded weights were loaded lazily (lazy_weights);
    those are written back embedded, read from it one at a time.
    """
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise ModelError(f"{out_path}: output folder {out_dir} does not exist")
    if not os.access(out_dir, os.W_OK):
        raise ModelError(f"{out_path}: output folder {out_dir} is not writable")
    has_external = any(t.data_location == onnx.TensorProto.EXTERNAL and not _is_lazy(t, lazy_location)
                       for t in all_tensors(proto.graph))
    external = external or has_external
    tmp_files: list[str] = []
    try:
        fd, tmp_model = tempfile.mkstemp(prefix=".onnxfuse-", suffix=".onnx.tmp", dir=out_dir)
        os.close(fd)
        tmp_files.append(tmp_model)
        written = [out_path]
        if external:
            data_name = os.path.basename(out_path) + ".data"
            fd, tmp_data = tempfile.mkstemp(prefix=".onnxfuse-", suffix=".data.tmp", dir=out_dir)
            os.close(fd)
            tmp_files.append(tmp_data)
            with open(tmp_data, "wb") as data_file:
                _externalize(proto.graph, data_file, data_name, source_base_dir)
            with open(tmp_model, "wb") as f:
                f.write(proto.SerializeToString())
            default_mode(tmp_data)
            os.replace(tmp_data, os.path.join(out_dir, data_name))
            written.append(os.path.join(out_dir, data_name))
        else:
            with open(tmp_model, "wb") as f:
                write_streamed(f, proto, source_base_dir if lazy_location else None, lazy_location)
        default_mode(tmp_model)
        os.replace(tmp_model, out_path)
        tmp_files.clear()
        return written
    except OSError as e:
        raise ModelError(f"{out_path}: cannot write ({e.strerror or e})") from None
    finally:
        for p in tmp_files:
            with contextlib.suppress(OSError):
                os.unlink(p)


def _externalize(graph: onnx.GraphProto, data_file, data_name: str, source_base_dir: str) -> None:
    for t in all_tensors(graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = external_info(t)
            src = os.path.join(source_base_dir, info["location"])
            offset = int(info.get("offset", 0))
            length = int(info.get("length", os.path.getsize(src) - offset))
            new_offset = _align(data_file)
            _copy_range(src, offset, length, data_file, f"external data file {info['location']!r}")
        elif t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_THRESHOLD:
            new_offset = _align(data_file)
            length = len(t.raw_data)
            data_file.write(t.raw_data)
            t.ClearField("raw_data")
        else:
            continue
        del t.external_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", data_name), ("offset", str(new_offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v


def _copy_range(path: str, offset: int, length: int, out, what: str) -> None:
    """Copy `length` bytes of `path` from `offset` to the open file `out`, 64 MB at a time."""
    with open(path, "rb") as src:
        src.seek(offset)
        remaining = length
        while remaining:
            chunk = src.read(min(remaining, 64 << 20))
            if not chunk:
                raise ModelError(f"{what} ended early")
            out.write(chunk)
            remaining -= len(chunk)


def _is_lazy(t: onnx.TensorProto, lazy_location: str | None) -> bool:
    return (lazy_location is not None and t.data_location == onnx.TensorProto.EXTERNAL
            and external_info(t).get("location") == lazy_location)


def _embedded(t: onnx.TensorProto) -> onnx.TensorProto:
    """A lazily loaded tensor as it is stored embedded, without its data (written separately)."""
    stub = onnx.TensorProto()
    stub.CopyFrom(t)
    del stub.external_data[:]
    stub.ClearField("data_location")
    return stub


def write_streamed(f, proto: onnx.ModelProto, base_dir: str | None = None, lazy_location: str | None = None) -> None:
    """Write `proto` as SerializeToString() would (the same bytes), one initializer at a time: serializing the
    whole model holds two more copies of its weights (the encoder's buffer and the bytes object). Tensors loaded
    lazily from `base_dir`/`lazy_location` are written embedded, as they were in that file."""
    head, tail = _split(proto, 7)  # ModelProto.graph
    ghead, gtail = _split(proto.graph, 5)  # GraphProto.initializer
    lazy = [_is_lazy(t, lazy_location) for t in proto.graph.initializer]
    sizes = [_lazy_size(t) if z else _tensor_size(t) for t, z in zip(proto.graph.initializer, lazy, strict=True)]
    glen = len(ghead) + len(gtail) + sum(1 + len(_varint(n)) + n for n in sizes)
    f.write(head)
    f.write(b"\x3a" + _varint(glen))  # field 7, length-delimited
    f.write(ghead)
    for t, n, z in zip(proto.graph.initializer, sizes, lazy, strict=True):
        f.write(b"\x2a" + _varint(n))  # field 5, length-delimited
        if z:
            assert base_dir is not None
            info = external_info(t)
            thead, ttail = _split(_embedded(t), 9)
            length = int(info["length"])
            f.write(thead + b"\x4a" + _varint(length))
            _copy_range(os.path.join(base_dir, info["location"]), int(info["offset"]), length, f,
                        f"{info['location']} (tensor {t.name!r})")
            f.write(ttail)
        elif t.HasField("raw_data"):
            thead, ttail = _split(t, 9)  # TensorProto.raw_data
            raw = t.raw_data
            f.write(thead + b"\x4a" + _varint(len(raw)))
            f.write(raw)
            f.write(ttail)
            del raw
        else:
            f.write(t.SerializeToString())
    f.write(gtail)
    f.write(tail)


def _split(msg, number: int) -> tuple[bytes, bytes]:
    """`msg` serialized without the field `number`: the fields before it and the fields after it."""
    head, tail = type(msg)(), type(msg)()
    for field, value in msg.ListFields():
        if field.number == number:
            continue
        target = getattr(head if field.number < number else tail, field.name)
        if getattr(field, "is_repeated", None) or getattr(field, "label", None) == field.LABEL_REPEATED:
            target.extend(value)
        elif field.type == field.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(head if field.number < number else tail, field.name, value)
    return head.SerializeToString(), tail.SerializeToString()


def approx_bytes(proto: onnx.ModelProto) -> int:
    """The serialized size of `proto`'s main-graph initializers plus its nodes, without serializing the model
    (ByteSize() does, holding another copy of the weights): enough to decide whether it must be written with
    external data."""
    g = proto.graph
    external = sum(int(external_info(t).get("length", 0)) for t in g.initializer
                   if t.data_location == onnx.TensorProto.EXTERNAL)  # lazily loaded weights are written embedded
    return sum(_tensor_size(t) for t in g.initializer) + external + sum(n.ByteSize() for n in g.node)


def _lazy_size(t: onnx.TensorProto) -> int:
    thead, ttail = _split(_embedded(t), 9)
    n = int(external_info(t)["length"])
    return len(thead) + 1 + len(_varint(n)) + n + len(ttail)


def _tensor_size(t: onnx.TensorProto) -> int:
    if not t.HasField("raw_data"):
        return t.ByteSize()
    thead, ttail = _split(t, 9)
    n = len(t.raw_data)
    return len(thead) + 1 + len(_varint(n)) + n + len(ttail)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def default_mode(path: str) -> None:
    """mkstemp files are 0600; give written files the permissions a plain open() would (0666 minus umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _align(f, alignment: int = 4096) -> int:
    pos = f.tell()
    pad = (-pos) % alignment
    if pad:
        f.write(b"\0" * pad)
    return pos + pad


