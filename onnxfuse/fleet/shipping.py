"""A model's files between the driver and the node that optimizes it.

In: the driver describes each input file (the model and the external data files it reads: path, size,
modification time). A node that sees the same files at the same paths (a shared file system, a local cluster)
reads them there; otherwise the driver ships their bytes through Ray's object store, and the worker lays them
out in a private folder with the same relative names and modification times (the decision cache's key of an
external-data model includes its data files' sizes and times, so a shipped copy finds the same decisions).

Out: the worker writes the optimized model into its private folder (as optimize always writes: atomically,
external data as a pair) and sends back the bytes of the files written; the driver alone writes OUTDIR, through
load/write.py's save_model (atomic; the old model and data file stay whole until the new pair is in place)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from ..load.collisions import data_files

__all__ = ["Shipped", "describe", "lay_out", "read_written", "visible", "write_output"]


@dataclass(frozen=True)
class Shipped:
    """The driver's description of one input: (relative name, size, mtime_ns) per file, the model first, and the
    object holding their bytes (None: not shipped, read by path)."""

    path: str  # the model's absolute path on the driver
    files: tuple[tuple[str, int, int], ...]
    data: object = None  # a Ray ObjectRef of [bytes, ...] in `files` order
    shown: str = ""  # the model as the user named it (results name it so)


def describe(path: str) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """(the model's folder, its files relative to it). A model that cannot be read is described by its name
    alone (the worker fails on it with the loader's line)."""
    base = os.path.dirname(os.path.abspath(path))
    files = []
    for f in [os.path.abspath(path), *data_files(path)]:
        try:
            st = os.stat(f)
        except OSError:
            continue
        files.append((os.path.relpath(f, base), st.st_size, st.st_mtime_ns))
    return base, tuple(files)


def read_bytes(path: str) -> list[bytes]:
    base, files = describe(path)
    out = []
    for rel, _, _ in files:
        with open(os.path.join(base, rel), "rb") as f:
            out.append(f.read())
    return out


def visible(shipped: Shipped) -> bool:
    """This node sees the driver's files: same paths, sizes and modification times."""
    if not shipped.files:
        return False
    base = os.path.dirname(shipped.path)
    for rel, size, mtime in shipped.files:
        try:
            st = os.stat(os.path.join(base, rel))
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return False
    return True


def lay_out(shipped: Shipped, blobs: list[bytes], folder: str) -> str:
    """Write the shipped files under `folder` with their relative names and times; returns the model's path.
    A data file named `../x` stays inside `folder` (the model goes that many folders deeper)."""
    depth = max((rel.split(os.sep).count(os.pardir) for rel, _, _ in shipped.files), default=0)
    base = os.path.join(folder, *(["d"] * depth))
    for (rel, _, mtime), blob in zip(shipped.files, blobs, strict=True):
        target = os.path.normpath(os.path.join(base, rel))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(blob)
        os.utime(target, ns=(mtime, mtime))
    return os.path.join(base, shipped.files[0][0])


def read_written(written: list[str], model_path: str) -> list[tuple[str, bytes]]:
    """The files optimize wrote (the model and its data file), as (name relative to the model's folder, bytes),
    the model first."""
    base = os.path.dirname(os.path.abspath(model_path))
    ordered = sorted(written, key=lambda p: not same_path(p, model_path))
    out = []
    for p in ordered:
        with open(p, "rb") as f:
            out.append((os.path.relpath(os.path.abspath(p), base), f.read()))
    return out


def same_path(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def write_output(files: list[tuple[str, bytes]], output: str) -> list[str]:
    """Write a worker's files to `output` (the model) atomically, as optimize writes: returns the files written.
    They are laid out in a private temporary folder first, and save_model streams them across."""
    import onnx

    from ..load.write import save_model

    tmp = tempfile.mkdtemp(prefix="onnxfuse-ray-out-")
    try:
        model = os.path.join(tmp, files[0][0])
        for rel, blob in files:
            target = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(blob)
        proto = onnx.load(model, load_external_data=False)
        return save_model(proto, output, os.path.dirname(model), external=len(files) > 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
