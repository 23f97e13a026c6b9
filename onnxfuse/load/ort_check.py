"""onnxruntime's view of an input model: whether it loads the original (CPU, ORT_DISABLE_ALL) and the output
types it gives, cached per file; and its error messages made one line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..targets import HOST, session_providers


@dataclass
class OrtProbe:
    """Whether onnxruntime creates a session for the original (CPU, ORT_DISABLE_ALL), and its output types."""

    error: str | None
    outputs: dict[str, tuple[int, list[int | str | None]]] = field(default_factory=dict)  # elem type, dims


_PROBES: dict[tuple, OrtProbe] = {}


_ORT_ELEM = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8,
             "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13, "complex64": 14,
             "complex128": 15, "bfloat16": 16}


def file_key(path: str) -> tuple:
    """Identifies a file's content for the caches here: one optimize loads the model many times (bisection,
    measuring), and each load would otherwise ask onnxruntime and shape inference again."""
    st = os.stat(path)
    return os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns


def remember(cache: dict, key: tuple, value):
    while len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def ort_probe(path: str) -> OrtProbe:
    key = file_key(path)
    return _PROBES[key] if key in _PROBES else remember(_PROBES, key, _probe(path))


def ort_probe_bytes(data: bytes) -> OrtProbe:
    """ort_probe for a serialized model in memory (not cached: its loader keeps the answer)."""
    return _probe(data)


def _probe(path: str | bytes) -> OrtProbe:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its warnings (unused initializers, ...) would add lines to stderr
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(path, sess_options=options, providers=session_providers(HOST))
    except Exception as e:  # onnxruntime raises many pybind exception types
        return OrtProbe(clean_ort_message(str(e)))
    outputs = {}
    for o in sess.get_outputs():
        m = re.fullmatch(r"tensor\((\w+)\)", o.type or "")
        if m and m.group(1) in _ORT_ELEM:
            outputs[o.name] = (_ORT_ELEM[m.group(1)], list(o.shape or []))
    del sess
    return OrtProbe(None, outputs)


def clean_ort_message(text: str) -> str:
    """onnxruntime's first line without its error-code prefix and C++ source location."""
    line = text.strip().splitlines()[0] if text.strip() else "unknown error"
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
    line = re.sub(r"^Load model from .* failed:", "", line)
    m = re.match(r"^\S+\.(?:cc|h|cpp):\d+ ", line)
    if m:  # a source location and the C++ function's signature
        rest = line[m.end():]
        cut = rest.find(") ")
        line = rest[cut + 2:] if cut >= 0 else rest
    line = re.sub(r"(?<=\w)\.[\w-]+\.(?:cc|h|cpp):\d+ ", ": ", line)
    return line.strip()


# ----- repairs -----------------------------------------------------------------------------------------------
