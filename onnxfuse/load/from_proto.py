"""Loading a ModelProto held in memory (rewrite_model, the onnx-ir pass): the loader's checks, repairs and shape
inference on a private copy, with no file written or read (but the external data files a `base_dir` names)."""

from __future__ import annotations

import functools
import os

import onnx
from onnx.external_data_helper import load_external_data_for_model

from ..errors import ModelError
from ..ir import Model
from ..tensors import all_tensors
from .loader import LoadInfo, checked_model
from .ort_check import OrtProbe, ort_probe_bytes

__all__ = ["IN_MEMORY", "load_proto"]

IN_MEMORY = "<ModelProto>"  # how a model in memory is named in messages (as optimize names one)


def load_proto(proto: onnx.ModelProto, base_dir: str | os.PathLike | None = None) -> tuple[Model, LoadInfo]:
    """(Model, LoadInfo) of a private copy of `proto`, which is never changed. Tensors whose data is external
    (a ModelProto loaded with load_external_data=False, or serialized from onnx-ir) are read into the copy from
    `base_dir`, the folder of the model's file; without one such a model is refused in one line."""
    if not isinstance(proto, onnx.ModelProto):
        raise ModelError(f"expected an onnx.ModelProto, got {type(proto).__name__}",
                         hint="load a file with onnx.load(path), or give its path to onnxfuse.optimize")
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelError(f"{IN_MEMORY}: not a valid ONNX model (no graph)")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    external = _read_external_data(copy, base_dir)
    # onnxruntime is asked about the original only when onnx.checker refuses it (or a repair finds a defect it
    # usually refuses), once: as bytes, since nothing is written; with external data, the copy holding it
    probe = functools.cache(lambda: _probe(copy if external else proto))
    folder = os.path.abspath(base_dir) if base_dir is not None else os.getcwd()
    return checked_model(copy, IN_MEMORY, folder, 0, probe, None, copy.ByteSize())


def _read_external_data(copy: onnx.ModelProto, base_dir: str | os.PathLike | None) -> bool:
    """Read every external tensor's data into `copy` from `base_dir`; whether there was any."""
    external = next((t.name for t in all_tensors(copy.graph) if t.data_location == onnx.TensorProto.EXTERNAL), None)
    if external is None:
        return False
    if base_dir is None:
        raise ModelError(f"{IN_MEMORY}: tensor {external!r} has its data in an external file, and no base_dir says "
                         "which folder holds it", hint="pass base_dir=<the model file's folder>, or load the model "
                         "with onnx.load(path), which reads the data")
    try:
        load_external_data_for_model(copy, os.fspath(base_dir))
    except Exception as e:  # onnx raises OSError, ValueError and its checker's ValidationError here
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"{IN_MEMORY}: cannot read its external data from {os.fspath(base_dir)} ({line})") from None
    return True


def _probe(proto: onnx.ModelProto) -> OrtProbe:
    try:
        data = proto.SerializeToString()
    except ValueError:  # over protobuf's 2 GB
        return OrtProbe("too large to check in memory (over 2 GB): give the model's file to onnxfuse.optimize")
    return ort_probe_bytes(data)

