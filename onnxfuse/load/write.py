"""Write ONNX models: atomic writes, external data for > 2 GB, weights streamed one tensor at a time (never the
whole model serialized at once), lazily loaded weights written back embedded."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

import onnx

from ..errors import ModelError
from ..tensors import all_tensors, external_info
from .collisions import data_files, is_own_data, same_file

EXTERNAL_THRESHOLD = 1024  # bytes: tensors at least this large go to the external data file



def drop_unused_initializers(graph: onnx.GraphProto) -> list[str]:
    """Remove the initializers of `graph` and of its subgraphs (If/Loop/Scan bodies) that no node reads and that
    are neither a graph input nor a graph output of their graph, and the Constant nodes nothing reads (onnxruntime
    makes them initializers); a subgraph reading an outer value by name keeps it. onnxruntime warns on every load
    of a model that keeps one ("Removing initializer ... It is not used by any node"). Returns the names removed."""
    dropped: list[str] = []
    _outer_reads(graph, dropped)
    return dropped


def _outer_reads(graph: onnx.GraphProto, dropped: list[str]) -> set[str]:
    """Drop `graph`'s unread initializers and Constants (into `dropped`); return the names it reads from
    enclosing graphs."""
    reads = {o.name for o in graph.output}
    for node in graph.node:
        reads.update(i for i in node.input if i)
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
            for sub in subs:
                reads |= _outer_reads(sub, dropped)
    inputs = {v.name for v in graph.input}
    for i in reversed(range(len(graph.initializer))):
        name = graph.initializer[i].name
        if name not in reads and name not in inputs:
            dropped.append(name)
            del graph.initializer[i]
    for i in reversed(range(len(graph.node))):
        node = graph.node[i]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not any(o in reads for o in node.output):
            dropped.extend(o for o in node.output if o)
            del graph.node[i]
    defined = inputs | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output if o}
    return reads - defined


def save_model(
    proto: onnx.ModelProto,
    out_path: str,
    source_base_dir: str,
    external: bool,
    lazy_location: str | None = None,
) -> list[str]:
    """Write atomically: to temporary files in the target folder, then rename. Returns the files written.

    With external data the model and its data file appear as a pair: the data goes under a name the model
    already at `out_path` does not read (`<name>.data`, or, when that file holds other bytes,
    `<name>.<content hash>.data`), then the model is renamed into place, and only then is the old model's own
    data file removed. An interrupt at any point leaves either the old pair or the new one whole.
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
    old_data = _own_data(out_path)
    tmp_files: list[str] = []
    placed: str | None = None  # a data file put in place that the old model does not read
    try:
        fd, tmp_model = tempfile.mkstemp(prefix=".onnxfuse-", suffix=".onnx.tmp", dir=out_dir)
        os.close(fd)
        tmp_files.append(tmp_model)
        written = [out_path]
        if external:
            data_path, fresh = _write_pair(proto, out_path, tmp_model, source_base_dir, tmp_files)
            if fresh:
                placed = data_path
            written.append(data_path)
        else:
            with open(tmp_model, "wb") as f:
                write_streamed(f, proto, source_base_dir if lazy_location else None, lazy_location)
        default_mode(tmp_model)
        os.replace(tmp_model, out_path)
        placed = None
        tmp_files.clear()
    except OSError as e:
        raise ModelError(f"{out_path}: cannot write ({e.strerror or e})") from None
    finally:
        for p in tmp_files + ([placed] if placed else []):
            with contextlib.suppress(OSError):
                os.unlink(p)
    for p in old_data:  # the new pair is whole: the old model's own data file goes
        if not any(same_file(p, w) for w in written):
            with contextlib.suppress(OSError):
                os.unlink(p)
    return written


def _write_pair(proto: onnx.ModelProto, out_path: str, tmp_model: str, source_base_dir: str,
                tmp_files: list[str]) -> tuple[str, bool]:
    """The data file written under a temporary name (added to `tmp_files`), the model that reads it into
    `tmp_model`, then the data file renamed into place: (its path, whether no file was there before)."""
    out_dir = os.path.dirname(tmp_model)
    fd, tmp_data = tempfile.mkstemp(prefix=".onnxfuse-", suffix=".data.tmp", dir=out_dir)
    os.close(fd)
    tmp_files.append(tmp_data)
    with open(tmp_data, "wb") as f:
        data_file = _Hashing(f)
        _externalize(proto.graph, data_file, _PENDING, source_base_dir)
    data_name = _data_name(out_path, data_file)
    for t in all_tensors(proto.graph):
        for e in t.external_data:
            if e.key == "location" and e.value == _PENDING:
                e.value = data_name
    with open(tmp_model, "wb") as f:
        f.write(proto.SerializeToString())
    default_mode(tmp_data)
    data_path = os.path.join(out_dir, data_name)
    fresh = not os.path.lexists(data_path)  # else the same bytes already (_data_name)
    os.replace(tmp_data, data_path)
    return data_path, fresh


def _own_data(out_path: str) -> list[str]:
    """The data files the model now at `out_path` reads that are its own (named after it); the model is parsed
    only when such a file exists."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isfile(out_path) or not any(is_own_data(out_path, os.path.join(folder, n))
                                               for n in os.listdir(folder)):
        return []
    return [p for p in data_files(out_path) if is_own_data(out_path, p)]


_PENDING = "\0pending"  # the data file's location until its name is known (it depends on the bytes)


class _Hashing:
    """A binary file that also hashes what is written to it (the content-derived data file name)."""

    def __init__(self, f) -> None:
        self.f, self.hash, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.hash.update(b)
        self.size += len(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.f.tell()


def _data_name(out_path: str, data: _Hashing) -> str:
    """`<name>.data`, unless a file of that name holds other bytes (an older output's data, which the model at
    `out_path` may still read): then `<name>.<16 hex digits of the content's SHA-256>.data`. The same model
    written into the same folder gets the same name, so a second run writes the same bytes."""
    plain = os.path.basename(out_path) + ".data"
    path = os.path.join(os.path.dirname(os.path.abspath(out_path)), plain)
    digest = data.hash.hexdigest()
    if not os.path.lexists(path) or _holds(path, data.size, digest):
        return plain
    return f"{os.path.basename(out_path)}.{digest[:16]}.data"


def _holds(path: str, size: int, digest: str) -> bool:
    """`path` holds exactly the bytes of that size and SHA-256."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return False
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(64 << 20):
                h.update(chunk)
        return h.hexdigest() == digest
    except OSError:
        return False


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
