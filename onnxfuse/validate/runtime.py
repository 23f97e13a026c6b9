"""onnxruntime sessions and runs: optimization levels, execution providers, one-line errors, feeds checked
against the session's inputs, and candidate models serialized where onnxruntime can load them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ..errors import InputSpecError, ModelError, OnnxfuseError, first_line, write_error
from ..inputs.shapes import fmt_shape
from ..ir import shell_copy
from ..load.lazy import link_folder
from ..load.loader import LoadInfo
from ..load.write import write_streamed
from ..targets import HOST, session_providers
from ..tensors import all_tensors

if TYPE_CHECKING:
    import onnxruntime

__all__ = ["LEVELS", "Candidate", "failing_node", "make_session", "peak_rss_bytes", "release_memory", "run",
           "session_with_outputs", "write_split"]

# --------------------------------------------------------------------------------------------------------------
# onnxruntime session / run
# --------------------------------------------------------------------------------------------------------------

LEVELS = ("disable", "basic", "extended", "all")


# How onnxruntime and onnx.checker name the node a failure is in (the first match wins).
_NODE_IN_MESSAGE = [re.compile(p) for p in (
    r"while running \S+ node\. Name:'([^']*)'",  # a kernel failed at run time
    r"Node \(([^)]*)\) Op \(",  # shape/type inference on load
    r"In Node, \(\"([^\"]*)\",",  # an invalid graph on load
    r"node with name '([^']*)'",  # no kernel for the node
    r"\bNode:(.+?) Output:",  # output shapes that do not merge
    r"\bin node \(([^)]*)\)",  # input types a kernel does not take
    r"for node\. Name: (\S+) OpType:",  # onnx.checker
)]


def failing_node(message: str) -> str:
    """The name of the node a failure message from onnxruntime or onnx.checker names ("" if none)."""
    for pattern in _NODE_IN_MESSAGE:
        m = pattern.search(message)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return ""


def _ort_level(level: str) -> onnxruntime.GraphOptimizationLevel:
    import onnxruntime as ort

    table = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    key = level.lower()
    if key not in table:
        raise OnnxfuseError(f"unknown optimization level '{level}'; choose one of: {', '.join(LEVELS)}")
    return table[key]


def physical_cores() -> int:
    """What onnxruntime's default intra-op pool uses (intra_op_num_threads=0: one thread per physical core):
    the physical cores (distinct package and core ids) among the CPUs this process may run on."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores: set[tuple[str, str]] = set()
    for c in cpus:
        topo = f"/sys/devices/system/cpu/cpu{c}/topology"
        try:
            with open(f"{topo}/physical_package_id") as f, open(f"{topo}/core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:  # no topology (not Linux, a container hiding it): count the CPU itself
            cores.add(("logical cpu", str(c)))
    return max(1, len(cores))


def resolve_threads(value: int | str, flag: str = "threads") -> int:
    """A thread count for timing: an int >= 1, or "auto": what onnxruntime would use by default here
    (physical_cores()); the number is what sessions get and what reports and the decision cache show."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return physical_cores()
        try:
            value = int(value)
        except ValueError:
            raise OnnxfuseError(f"{flag} {value}: expected a thread count or auto",
                                hint="auto: onnxruntime's default, one thread per physical core") from None
    if value < 1:
        raise OnnxfuseError(f"{flag} {value}: expected a thread count >= 1, or auto",
                            hint="auto: onnxruntime's default, one thread per physical core")
    return value


def make_session(
    model_path: str | bytes, level: str = "disable", provider: str = HOST, threads: int = 1,
    profile_prefix: str | None = None, optimized_path: str | None = None, arena: bool = True,
) -> onnxruntime.InferenceSession:
    """An InferenceSession at the given graph optimization level (profiling into `profile_prefix` when
    given; writing onnxruntime's optimized graph to `optimized_path` when given); load failures become
    ModelError. `arena=False` for sessions whose outputs are kept (validation's references, captured values):
    with onnxruntime's CPU arena an output array holds the arena it was cut from (a 256 MB output of a
    six-op model kept 1.4 GB alive after the session was gone), and the arena's growth adds to the peak; timing
    sessions keep it (as deployed)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # failures are reported by onnxfuse itself, in one line
    options = ort.SessionOptions()
    options.graph_optimization_level = _ort_level(level)
    options.log_severity_level = 4
    options.enable_cpu_mem_arena = arena
    if threads < 0:
        raise OnnxfuseError(f"thread count must be >= 0, got {threads}")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if optimized_path is not None:
        options.optimized_model_filepath = optimized_path
    providers = session_providers(provider.lower(), threads)  # the target's, with options and fallback
    if isinstance(model_path, str) and not os.path.isfile(model_path):
        raise ModelError(f"model file not found: {model_path}")
    label = model_path if isinstance(model_path, str) else "the model"
    try:
        return ort.InferenceSession(model_path, sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises many pybind exception types
        if "no space left" in str(exc).lower():  # writing its optimized model or profile: not the model's fault
            raise write_error(exc, "onnxruntime's optimized model or profile",
                              None if optimized_path is None and profile_prefix is None else
                              os.path.dirname(os.path.abspath(optimized_path or profile_prefix or ""))) from exc
        raise ModelError(f"onnxruntime cannot load {label}: {first_line(str(exc))}") from exc


_ORT_TYPES: dict[str, str] = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}


def _check_feeds(session: onnxruntime.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    expected = {i.name: i for i in session.get_inputs()}
    unknown = [n for n in feeds if n not in expected]
    if unknown:
        raise InputSpecError(f"feed '{unknown[0]}' is not a model input; inputs are: {', '.join(expected)}")
    for name, meta in expected.items():
        if name not in feeds:
            raise InputSpecError(f"no value for model input '{name}'")
        _check_feed(name, meta, np.asarray(feeds[name]))


def _check_feed(name: str, meta: Any, arr: np.ndarray) -> None:
    want = _ORT_TYPES.get(meta.type)
    got = "object" if arr.dtype.kind in "OSU" else arr.dtype.name
    if want is not None and want != got:
        raise InputSpecError(f"input '{name}' has dtype {got}, the model expects {want}")
    shape = meta.shape
    if not shape:  # ORT reports [] for both scalars and unknown rank; let ORT itself judge those
        return
    if len(shape) != arr.ndim:
        raise InputSpecError(
            f"input '{name}' has shape {tuple(arr.shape)}, the model expects rank {len(shape)} {fmt_shape(shape)}"
        )
    for axis, (dim, size) in enumerate(zip(shape, arr.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise InputSpecError(
                f"input '{name}' has shape {tuple(arr.shape)}, the model expects {fmt_shape(shape)} "
                f"(dim {axis} must be {dim})"
            )


def run(session: onnxruntime.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run once; returns output name -> array. Failures caused by the feeds become InputSpecError."""
    _check_feeds(session, feeds)
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, feeds)
    except Exception as exc:  # ORT raises many pybind exception types
        if "NCHWc block" in str(exc):  # com.microsoft.nchwc ops saved on a CPU of another vector width
            raise ModelError(
                "onnxruntime cannot run the model on this CPU: it holds onnxruntime's NCHWc layout ops "
                f"(com.microsoft.nchwc), laid out for another CPU's vector width ({first_line(str(exc))})",
                hint="give onnxfuse the model as it was before onnxruntime optimized it at ORT_ENABLE_ALL, or save "
                     "onnxruntime's optimized model on the machine that runs it") from exc
        raise InputSpecError(
            f"onnxruntime failed to run the model: {first_line(str(exc))}",
            hint="check --shape / --inputs against the model's expected input shapes",
        ) from exc
    return {name: _as_array(v) for name, v in zip(names, values, strict=True)}


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except ValueError:  # ragged sequence outputs
        out = np.empty(len(value), dtype=object)
        out[:] = list(value)
        return out


class Candidate:
    """A candidate written to temporary files onnxruntime loads by path, in a private temporary folder (TMPDIR),
    never beside the input model: a killed run leaves nothing in the user's folders. Without external data, its
    large initializers go to a side file at page-aligned offsets, which onnxruntime maps instead of copying: a
    session then costs the weights once (not a parse of them plus a copy) and no serialized copy of them is held
    in memory. With external data (or weights read lazily from the model file itself) the files its tensors
    reference are hard-linked into that folder under their relative locations, so they resolve (onnxruntime 1.32
    refuses symbolic links that resolve outside the model's folder). Where TMPDIR is on another file system than
    the data, the private folder is made beside the input instead (`.onnxfuse-tmp-*`, hard links again: never a
    copy of the weights per candidate), and only where neither links are the files copied. Whatever fails while
    writing it, nothing is left behind; `close()` removes the rest (on every exit path, SIGINT and SIGTERM
    included; only a SIGKILL can leave the folder)."""

    def __init__(self, proto: onnx.ModelProto, info: LoadInfo) -> None:
        self.checkable = True  # onnx.checker runs on a weightless copy (validate.checker_accepts): always possible
        self.tmpdir: str | None = None
        locations = {{e.key: e.value for e in t.external_data}["location"] for t in all_tensors(proto.graph)
                     if t.data_location == onnx.TensorProto.EXTERNAL} if info.external_data or info.lazy else set()
        src_dir = os.path.dirname(os.path.abspath(info.path)) if locations else ""
        base = link_folder(os.path.join(src_dir, min(locations))) if locations else None
        try:
            self.tmpdir = tempfile.mkdtemp(prefix=".onnxfuse-tmp-" if base == src_dir else "onnxfuse-",
                                           dir=base if base == src_dir else None)
        except OSError as e:
            raise write_error(e, "a candidate model") from None
        try:
            self._write(proto, locations, src_dir)
        except BaseException:
            self.close()
            raise

    def _write(self, proto: onnx.ModelProto, locations: set[str], src_dir: str) -> None:
        assert self.tmpdir is not None
        path = os.path.join(self.tmpdir, "candidate.onnx")
        self.source: str | bytes = path
        if not locations:
            write_split(proto, path)
            return
        name, k = "candidate.onnx", 0
        while name in locations:  # a data file (or the model itself, lazily read) may be named so
            k += 1
            name = f"candidate-{k}.onnx"
        path = os.path.join(self.tmpdir, name)
        self.source = path
        try:
            for loc in sorted(locations):
                link = os.path.join(self.tmpdir, loc)
                os.makedirs(os.path.dirname(link), exist_ok=True)
                _place(os.path.join(src_dir, loc), link)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise write_error(e, "a candidate model") from None
        _write(fd, proto)

    def close(self) -> None:
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


@contextlib.contextmanager
def session_with_outputs(proto: onnx.ModelProto, info: LoadInfo, names: list[str], provider: str = HOST,
                         threads: int = 1) -> Iterator[onnxruntime.InferenceSession]:
    """A session of `proto` at ORT_DISABLE_ALL that can also return the values `names` (added as graph outputs
    only while the candidate is written: `proto` is left as it was)."""
    g = proto.graph
    have = {o.name for o in g.output}
    added = len(g.output)
    for v in dict.fromkeys(names):
        if v not in have:
            g.output.add().name = v
    try:
        cand = Candidate(proto, info)
    finally:
        del g.output[added:]
    try:
        yield make_session(cand.source, "disable", provider, threads, arena=False)  # its values are kept
    finally:
        cand.close()
        release_memory()


def _place(src: str, dst: str) -> None:
    """`src` at `dst` as a file of its own: a hard link to the file a symbolic link names (Linux's link(2) links
    the symbolic link itself, which dangles once it is elsewhere: every Hugging Face hub cache file is a relative
    link into ../../blobs), else (another file system) a copy."""
    src = os.path.realpath(src)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


SPLIT_BYTES = 4096  # initializers at least this large go to the side file of a split candidate
_PAGE = 4096


def write_split(proto: onnx.ModelProto, path: str) -> None:
    """`path` plus `path + ".weights"`: the main graph's embedded initializers of SPLIT_BYTES or more are written,
    one at a time, to the weights file at page-aligned offsets (external data onnxruntime maps); the model file
    holds the rest. `proto` is not changed."""
    out = onnx.ModelProto()
    shell_copy(proto, out, skip=("graph",))
    shell_copy(proto.graph, out.graph, skip=("initializer",))
    data_name = os.path.basename(path) + ".weights"
    try:
        with open(os.path.join(os.path.dirname(path), data_name), "wb") as f:
            for t in proto.graph.initializer:
                if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
                    out.graph.initializer.append(t)
                    continue
                raw = t.raw_data
                if len(raw) < SPLIT_BYTES:
                    out.graph.initializer.append(t)
                    continue
                offset = f.tell() + (-f.tell()) % _PAGE
                f.seek(offset)
                f.write(raw)
                stub = out.graph.initializer.add()
                shell_copy(t, stub, skip=("raw_data", "external_data", "data_location"))
                stub.data_location = onnx.TensorProto.EXTERNAL
                for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                    stub.external_data.add(key=k, value=v)
                del raw
        _write(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), out)
    except BaseException as e:  # a full disk, Ctrl-C: nothing partial left behind
        for p in (os.path.join(os.path.dirname(path), data_name), path):
            with contextlib.suppress(OSError):
                os.unlink(p)
        if isinstance(e, OSError):
            raise write_error(e, "a candidate model") from None
        raise


def _write(fd: int, proto: onnx.ModelProto) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            write_streamed(f, proto)
    except OSError as e:
        raise write_error(e, "a candidate model") from None


def release_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise): after a session of a 140 MB model is gone, the
    process's resident size drops by about that much before the next big step. A no-op without glibc."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 (glibc only)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def peak_rss_bytes() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
