"""Which ops each execution provider can run, at which opsets, for which element types.

Asked of the installed onnxruntime's kernel registry when it has the provider (it always has CPU). Otherwise
(`--target cuda` with the CPU-only onnxruntime wheel) of onnxruntime's published kernel table, generated from
its docs/OperatorKernels.md into `kernels/ort_kernels.json` (`python -m onnxfuse.kernels.generate`). Every
answer names its source.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

import onnx

from .errors import OnnxfuseError, write_error
from .ir import make_model
from .opschema import input_type_str

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
OPEN = 2**31 - 1  # upper end of a kernel registered for every later opset
TABLE_DOMAINS = ("", "com.microsoft")  # what the published table covers


@dataclass(frozen=True)
class Kernel:
    since: int
    until: int  # inclusive
    constraints: tuple[tuple[str, frozenset[str]], ...]  # (constraint name, element types "float", "float16", ...)

    @property
    def types(self) -> frozenset[str]:
        """Every element type any of its constraints accepts."""
        return frozenset(t for _, ts in self.constraints for t in ts)

    def takes(self, elem: str, constraint: str | None = None) -> bool:
        """Whether an input of type constraint `constraint` (from the op's schema: a name like 'T', or a fixed
        'tensor(int64)') may have element type `elem`. A constraint the kernel does not restrict takes anything;
        with no constraint known, any type one of the kernel's constraints accepts will do."""
        if constraint is None:
            types = self.types
            return not types or elem in types
        if constraint.startswith("tensor("):
            return _elem(constraint) == elem
        named = dict(self.constraints)
        return constraint not in named or not named[constraint] or elem in named[constraint]

    def covers(self, opset: int) -> bool:
        return self.since <= opset <= self.until

    @property
    def opsets(self) -> str:
        if self.until >= OPEN:
            return f"{self.since}+"
        return str(self.since) if self.since == self.until else f"{self.since}-{self.until}"


@dataclass(frozen=True)
class KernelSource:
    """The kernels of one provider and where they were read."""

    label: str  # for messages: "the installed onnxruntime 1.32.0", "onnxruntime's published kernel table (...)"
    live: bool
    kernels: Mapping[tuple[str, str], tuple[Kernel, ...]]  # (domain, op) -> kernels
    domains: tuple[str, ...] | None = None  # domains it covers (None: every domain)

    def covers(self, domain: str) -> bool:
        return self.domains is None or domain in self.domains


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def _elem(type_string: str) -> str | None:
    """'tensor(float16)' -> 'float16'; sequence, optional, map and sparse types -> None."""
    if type_string.startswith("tensor(") and type_string.endswith(")"):
        return type_string[7:-1]
    return None


@functools.cache
def _live() -> dict[str, dict[tuple[str, str], tuple[Kernel, ...]]]:
    import onnxruntime.capi.onnxruntime_pybind11_state as C

    acc: dict[str, dict[tuple[str, str], list[Kernel]]] = {}
    for k in C.get_all_opkernel_def():
        cons = tuple(sorted((name, frozenset(e for t in lst if (e := _elem(t))))
                            for name, lst in k.type_constraints.items()))
        since, until = k.version_range
        acc.setdefault(k.provider, {}).setdefault((_domain(k.domain), k.op_name), []).append(
            Kernel(since, min(until, OPEN), cons))
    return {p: {key: tuple(v) for key, v in ks.items()} for p, ks in acc.items()}


@functools.cache
def published_table() -> tuple[dict[str, str], dict[str, dict[tuple[str, str], tuple[Kernel, ...]]]]:
    """(source, provider -> (domain, op) -> kernels) from the shipped kernels/ort_kernels.json."""
    text = resources.files("onnxfuse.kernels").joinpath("ort_kernels.json").read_text(encoding="utf-8")
    data = json.loads(text)
    table: dict[str, dict[tuple[str, str], tuple[Kernel, ...]]] = {}
    for provider, domains in data["kernels"].items():
        for domain, ops in domains.items():
            for op, kernels in ops.items():
                table.setdefault(provider, {})[(domain, op)] = tuple(
                    Kernel(since, OPEN if until is None else until,
                           tuple(sorted((name, frozenset(ts)) for name, ts in types.items())))
                    for since, until, types in kernels)
    return data["source"], table


def table_label() -> str:
    source, _ = published_table()
    release = f" {source['onnxruntime']}" if source.get("onnxruntime") else ""
    return f"onnxruntime{release}'s published kernel table, OperatorKernels.md at {source['commit'][:7]}"


@functools.cache
def provider_registered(target: str) -> bool:
    """Whether the installed onnxruntime has this target's execution provider (its kernels registered)."""
    return PROVIDERS[target] in _live()


@functools.cache
def kernel_source(target: str) -> KernelSource:
    """Where `target`'s kernels are read: the installed onnxruntime when it has the provider, else the table."""
    if provider_registered(target):
        import onnxruntime as ort

        return KernelSource(f"the installed onnxruntime {ort.__version__}", True, _live()[PROVIDERS[target]])
    return table_source(target)


@functools.cache
def table_source(target: str) -> KernelSource:
    """`target`'s kernels in onnxruntime's published table, whatever is installed."""
    _, table = published_table()
    return KernelSource(table_label(), False, table.get(PROVIDERS[target], {}), TABLE_DOMAINS)


def runs_on(target: str) -> str:
    """Where onnxfuse runs models for `target`: the target itself, or the CPU when the installed onnxruntime
    has no provider for it (CUDA with the CPU-only wheel)."""
    return target if provider_registered(target) else "cpu"


def elem_name(elem_type: int) -> str:
    """onnx.TensorProto.FLOAT16 -> 'float16' (the element type as kernel tables write it)."""
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def kernels(domain: str, op: str, target: str, source: KernelSource | None = None) -> tuple[Kernel, ...] | None:
    """The target's kernels for `domain.op` (empty: none), or None when the source does not cover the domain."""
    src = source or kernel_source(target)
    domain = _domain(domain)
    if not src.covers(domain):
        return None
    return src.kernels.get((domain, op), ())


def kernel_issue(domain: str, op: str, target: str, elem_type: int | None = None,
                 opset: int | None = None, input: int = 0, source: KernelSource | None = None) -> str | None:
    """Why `domain.op` cannot run on `target` (None when it can, or when the source cannot tell).

    `elem_type` (an onnx.TensorProto data type) is the element type of input number `input` (checked against
    that input's type constraint, from the op's schema); `opset` is the model's opset, checked for ONNX-domain
    ops only (other domains' kernels are versioned by their own domain). `source` defaults to kernel_source.
    """
    domain = _domain(domain)
    src = source or kernel_source(target)
    ks = kernels(domain, op, target, src)
    if ks is None:
        return None
    qual = f"{domain}.{op}" if domain else op
    where = target.upper()
    if not ks:
        return f"no {where} kernel for {qual} ({src.label})"
    if opset is not None and domain == "":
        at = [k for k in ks if k.covers(opset)]
        if not at:
            spans = ", ".join(sorted({k.opsets for k in ks}, key=lambda s: int(s.split("-")[0].rstrip("+"))))
            return f"no {where} kernel for {qual} at opset {opset} (it has opsets {spans}; {src.label})"
        ks = tuple(at)
    if elem_type:
        elem = elem_name(elem_type)
        constraint = input_type_str(domain, op, input, opset if domain == "" else None)
        if not any(k.takes(elem, constraint) for k in ks):
            if constraint and constraint.startswith("tensor("):
                takes = _elem(constraint) or constraint
            else:
                takes = ", ".join(sorted(set().union(*(dict(k.constraints).get(constraint or "", k.types)
                                                       for k in ks))))
            return f"the {where} kernel for {qual} does not take {elem} (it takes {takes}; {src.label})"
    return None


_ASSUMED_NCHWC: list[bool] = []  # assume_cpu_nchwc's stack


@contextlib.contextmanager
def assume_cpu_nchwc(value: bool) -> Iterator[None]:
    """cpu_nchwc() answers `value` inside the block: the rule self-test checks the numbers of a rewrite this
    machine's layout keeps the optimizer from making (a FusedConv with Z still runs here)."""
    _ASSUMED_NCHWC.append(value)
    try:
        yield
    finally:
        _ASSUMED_NCHWC.pop()


NCHWC_ENV = "ONNXFUSE_CPU_NCHWC"  # "1" / "0": decide for the CPU that will run the model, not this one


def nchwc_setting() -> bool | None:
    """ONNXFUSE_CPU_NCHWC: True for 1, False for 0, None when unset or empty (this machine is asked); any other
    value is refused (OnnxfuseError), not ignored: optimize checks it before anything loads."""
    raw = os.environ.get(NCHWC_ENV, "")
    env = raw.strip()
    if env in ("", "0", "1"):
        return None if not env else env == "1"
    raise OnnxfuseError(f"{NCHWC_ENV}={raw!r}: expected 1 (the CPU that will run the model runs convolutions in "
                        "onnxruntime's NCHWc layout: x86 with AVX2 or AVX-512) or 0 (it does not: ARM, x86 without "
                        "AVX2); unset, this machine's onnxruntime is asked")


def cpu_nchwc() -> bool:
    """Whether onnxruntime runs CPU convolutions in its blocked NCHWc layout: assume_cpu_nchwc's value inside
    its block; else ONNXFUSE_CPU_NCHWC=1 or 0 (optimizing here for another CPU: 0 for ARM); else this machine's
    answer (_probe_nchwc)."""
    if _ASSUMED_NCHWC:
        return _ASSUMED_NCHWC[-1]
    setting = nchwc_setting()
    return _probe_nchwc() if setting is None else setting


@functools.cache
def _probe_nchwc() -> bool:
    """Whether the installed onnxruntime runs CPU convolutions in its blocked NCHWc layout on this machine (MLAS
    has NCHWc kernels on x86 with AVX2 or AVX-512, not elsewhere). Asked of onnxruntime: a one-Conv model
    optimized at ORT_ENABLE_ALL, its written graph searched for com.microsoft.nchwc ops (about 20 ms, once)."""
    # its own session, not validate.runtime's or inspect.remaining.ort_optimized: targets sits below both
    import tempfile

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((16, 16, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], [w])
    model = make_model(graph, {"": 13})
    try:
        with tempfile.TemporaryDirectory(prefix="onnxfuse-nchwc-") as d:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.optimized_model_filepath = os.path.join(d, "probe.onnx")
            so.log_severity_level = 3
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return any(n.domain == "com.microsoft.nchwc" for n in onnx.load(so.optimized_model_filepath).graph.node)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own types too: TMPDIR full or not writable
        err = write_error(e, "onnxruntime's optimized model of the NCHWc probe (whether this CPU runs convolutions "
                          "in NCHWc)")
        err.hint = (err.hint + "; " if err.hint else "") + f"or set {NCHWC_ENV}=1 or 0 to skip the probe"
        raise err from None
