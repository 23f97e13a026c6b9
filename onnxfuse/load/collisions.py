"""Which files a run reads, and refusing, before any work, a path it would write that is one of them: an output
model, its external data file or a report must never replace the input model or the data files it reads (the
same path, a symbolic link to it, or a hard link: the same inode)."""

from __future__ import annotations

import os
import re

import onnx

from ..errors import ModelError, OnnxfuseError
from ..tensors import all_tensors, external_info

__all__ = ["check_report_path", "check_writes", "data_files", "is_own_data", "same_file"]


def same_file(a: str, b: str) -> bool:
    """`a` and `b` are one file: the same real path, or (both existing) the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def data_files(model_path: str) -> list[str]:
    """The external data files `model_path` reads (paths in its folder; [] when it has none or cannot be read:
    the loader reports that)."""
    try:
        proto = onnx.load(model_path, load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model: the loader says so, with its own message
        return []
    base = os.path.dirname(os.path.abspath(model_path))
    found: dict[str, None] = {}
    for t in all_tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = external_info(t).get("location")
            if loc:
                found[os.path.join(base, loc)] = None
    return list(found)


def is_own_data(model_path: str, data_path: str) -> bool:
    """`data_path` is named as onnxfuse names the data file of the output `model_path`: `<name>.data` or
    `<name>.<content hash>.data` (load/write.py), in its folder."""
    if os.path.dirname(os.path.abspath(data_path)) != os.path.dirname(os.path.abspath(model_path)):
        return False
    name = re.escape(os.path.basename(model_path))
    return re.fullmatch(name + r"(\.[0-9a-f]{16})?\.data", os.path.basename(data_path)) is not None


def _written_beside(out: str) -> list[str]:
    """The output model and the data file it may get, as far as they exist now (only an existing file can be
    one the input reads)."""
    return [p for p in (out, out + ".data") if os.path.lexists(p)]


def _may_be_data_of(path: str, model: str) -> bool:
    """Whether the existing file `path` can be one of `model`'s data files without parsing the model: those lie
    in its folder (the loader refuses others), so `path` must resolve there or be a hard link (parsing a large
    model only to learn it reads nothing there is what this avoids)."""
    try:
        if os.stat(path).st_nlink > 1:
            return True
    except OSError:
        return False
    folder = os.path.realpath(os.path.dirname(os.path.abspath(model)))
    return os.path.commonpath([os.path.realpath(path), folder]) == folder


def _read_files(inputs: list[str], path: str, cache: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(file, what it is, the input model) for the files the inputs read that `path` may be: each model, and its
    external data files where `path` may be one of them (`cache`: the data files of the models parsed)."""
    files = []
    for m in inputs:
        files.append((m, f"the input model {m}", m))
        if _may_be_data_of(path, m):
            if m not in cache:
                cache[m] = data_files(m)
            files += [(d, f"the external data of the input model {m}", m) for d in cache[m]]
    return files


def check_writes(pairs: list[tuple[str, str]], force: bool = False, inputs: list[str] | None = None) -> None:
    """Refuse (ModelError) an output that would replace a file an input reads: for each (input model, output
    model), the output and its data file against the model and data files of every input (`inputs`, default:
    those of `pairs`). With `force` an output may be its own input model (then replaced as a whole, data
    included)."""
    existing = [(i, o, p) for i, o in pairs for p in _written_beside(o)]
    if not existing:
        return  # nothing that will be written exists yet: it cannot be anything an input reads
    models = list(dict.fromkeys(inputs if inputs is not None else [i for i, _ in pairs]))
    parsed: dict[str, list[str]] = {}
    for own_input, out, path in existing:
        for f, what, owner in _read_files(models, path, parsed):
            if not same_file(path, f):
                continue
            if force and owner == own_input and same_file(out, own_input):
                continue  # the input itself, replaced as a whole (the writer keeps its old pair until then)
            if path == out and same_file(f, own_input):
                raise ModelError(f"{out}: output is the input model; refusing to overwrite it",
                                 hint="pass --force to overwrite")
            role = "output" if path == out else f"output's data file {path}"
            raise ModelError(f"{out}: the {role} is {what}; refusing to overwrite it",
                             hint="write the output to another file name or folder")


def check_report_path(report: str, option: str, inputs: list[str], outputs: list[str] = (),
                      also_read: list[str] = ()) -> None:
    """A report file (`option`: the API name of the option that names it, e.g. html) must be a file path in an
    existing, writable folder, and none of the inputs' files (models, their data, `also_read`: other files the
    run reads) nor the outputs (models and their data files)."""
    def refuse(message: str) -> OnnxfuseError:
        return OnnxfuseError(message, option=option, value=report)

    if os.path.isdir(report):
        raise refuse("is a directory, expected a report file path")
    folder = os.path.dirname(os.path.abspath(report))
    if not os.path.isdir(folder):
        raise refuse(f"folder {folder} does not exist" if not os.path.exists(folder)
                     else f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise refuse(f"folder {folder} is not writable")
    for out in outputs:
        if same_file(report, out):
            raise refuse(f"is the output model {out}; the report would replace it")
        if is_own_data(out, report) or (os.path.lexists(out + ".data") and same_file(report, out + ".data")):
            raise refuse(f"is the data file of the output model {out}; the report would replace it")
    if not os.path.lexists(report):
        return
    read = _read_files(inputs, report, {}) + [(f, f"the file {f} this run reads", f) for f in also_read if f]
    for f, what, _ in read:
        if same_file(report, f):
            raise refuse(f"is {what}; the report would replace it")
