"""Weights read lazily: a model's large embedded initializers become references into the model file itself,
found by reading the protobuf wire format."""

from __future__ import annotations

import os
import shutil
import tempfile

import onnx

from .write import EXTERNAL_THRESHOLD

LAZY_MIN_BYTES = 8 << 20  # embedded weights at least this large are read lazily from the model file


def lazy_weights(proto: onnx.ModelProto, path: str) -> bool:
    """Make the main graph's large embedded initializers references into the model file itself (external data
    whose location is the file, at the raw bytes' offset): every copy of the model onnxfuse makes (rebuilds,
    candidates, exports) is then a few hundred KB, and onnxruntime reads the weights from the file. Only when
    the file can be hard-linked into a private folder (candidates are written in one, beside such a link,
    where onnxruntime accepts the reference; a copy per candidate would cost more than it saves) and there is
    at least LAZY_MIN_BYTES of them; the writer puts them back inline (save_model). Returns whether it did."""
    big = [t for t in proto.graph.initializer if t.HasField("raw_data") and len(t.raw_data) >= EXTERNAL_THRESHOLD]
    if sum(len(t.raw_data) for t in big) < LAZY_MIN_BYTES or link_folder(path) is None:
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


def link_folder(path: str) -> str | None:
    """Where a private folder can hold a hard link to `path` (onnxruntime refuses symbolic links that resolve
    outside a model's folder, and a copy per candidate would cost the weights each time): TMPDIR, else (TMPDIR on
    another file system, a tmpfs /tmp) the folder of `path` itself, else None."""
    for base in (tempfile.gettempdir(), os.path.dirname(os.path.abspath(path))):  # candidates go beside the link
        try:
            folder = tempfile.mkdtemp(prefix=".onnxfuse-link-", dir=base)
        except OSError:
            continue
        try:
            os.link(os.path.realpath(path), os.path.join(folder, "probe"))  # the file, not a symbolic link
            return base
        except OSError:
            continue
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return None


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
