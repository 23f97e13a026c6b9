"""The execution providers onnxfuse optimizes for (targets), and which ops each one runs.

A target is one registered `Target` (REGISTRY): its name (`--target`), the onnxruntime provider with the ones
its sessions fall back on, where its kernel facts come from, its layout preference and where it validates and
times when the installed onnxruntime lacks its provider. Everything else reads the registry: adding a target
is one entry here plus its kernel facts (docs/targets.md).

Kernel facts, per target (`Target.facts`): "registry" - the installed onnxruntime's kernel registry when it
has the provider (it always has CPU), else onnxruntime's published kernel table generated from its
docs/OperatorKernels.md into `kernels/ort_kernels.json` (`python -m onnxfuse.kernels.generate`); or a file in
kernels/ of what the provider was seen to claim (`python -m onnxfuse.inspect.kernel_probe TARGET`, run with
that provider installed). Every answer names its source.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

from .errors import OnnxfuseError, write_error

__all__ = ["Target", "REGISTRY", "HOST", "names", "get", "available", "runs_on", "missing_note", "session_providers",
           "kernel_source", "table_source", "facts_file", "kernels", "kernel_issue", "cpu_nchwc", "assume_cpu_nchwc",
           "nchwc_setting"]

TABLE = "ort_kernels.json"  # onnxruntime's published kernel table (kernels/)


@dataclass(frozen=True)
class Target:
    """One execution provider onnxfuse optimizes for."""

    name: str  # --target, `targets:` in rules
    label: str  # in messages: "no CPU kernel for ..."
    provider: str  # the onnxruntime execution provider
    fallback: tuple[str, ...] = ()  # providers a session lists after it: they run the nodes it does not claim
    provider_options: tuple[tuple[str, str], ...] = ()  # given to onnxruntime with `provider`
    threads_option: str | None = None  # its provider option for its own thread pool (a provider that runs a
    # compiled graph on its own threads ignores onnxruntime's intra-op count): sessions set it to --threads
    facts: str = "registry"  # "registry" (live registry, else TABLE) or a kernel-facts file in kernels/
    layout: str = "nchw"  # its layout preference: "nchwc" (onnxruntime's blocked CPU layout where this CPU has
    # it, cpu_nchwc()), "nchw", or "nhwc" (it has NHWC kernels a rule may convert to where measured faster)
    vector_width: int | None = None  # fp32 lanes its channel dims align to; None: this CPU's (AVX-512 16, else 8)
    calling_thread: bool = False  # at one intra-op thread every kernel runs on the calling thread, so its CPU
    # time is the work (measure/clock.py times on it); False: other threads or a device do the work (wall time)
    runs_elsewhere: str | None = None  # the target it validates on (never times) without its provider
    install: str = ""  # how to get its provider: the hint when it is missing
    lists_kernels: bool = True  # False: an onnxruntime build with this provider crashes listing its kernel
    # registry (get_all_opkernel_def: a segmentation fault in onnxruntime-openvino 1.24.1): read no live registry


CPU = "CPUExecutionProvider"
HOST = "cpu"  # the target every onnxruntime has: references are computed there, and targets fall back on it
REGISTRY: dict[str, Target] = {t.name: t for t in (
    Target("cpu", "CPU", CPU, layout="nchwc", calling_thread=True),  # the default
    Target("cuda", "CUDA", "CUDAExecutionProvider", fallback=(CPU,), layout="nhwc", vector_width=8,
           runs_elsewhere="cpu", install="install onnxruntime-gpu"),
    Target("openvino", "OpenVINO", "OpenVINOExecutionProvider", fallback=(CPU,),
           provider_options=(("device_type", "CPU"),), threads_option="num_of_threads",
           facts="openvino_kernels.json", runs_elsewhere="cpu",
           install="pip install onnxruntime-openvino (in its own venv: it replaces the onnxruntime package)",
           lists_kernels=False),
)}


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: object, option: str = "target") -> Target:
    """The registered target `name`; else one OnnxfuseError naming the option and every registered target."""
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name]
    raise OnnxfuseError(f"expected one of the registered targets: {', '.join(REGISTRY)}", option=option, value=name)


@functools.cache
def _available_providers() -> frozenset[str]:
    import onnxruntime as ort

    return frozenset(ort.get_available_providers())


def available(name: str) -> bool:
    """Whether the installed onnxruntime has this target's execution provider: the one source of that answer
    (onnxruntime.get_available_providers())."""
    return get(name).provider in _available_providers()


def runs_on(name: str) -> str:
    """The target onnxfuse runs models on for `name`: itself, or its `runs_elsewhere` target when the installed
    onnxruntime has no provider for it (CUDA with the CPU-only wheel); a target with neither is refused."""
    t = get(name)
    if available(name):
        return name
    if t.runs_elsewhere is None:
        raise OnnxfuseError(f"the installed onnxruntime has no {t.provider}", hint=t.install or None)
    return t.runs_elsewhere


def missing_note(name: str) -> str:
    """Why `name` runs elsewhere, for reports: '' when it runs on itself."""
    t = get(name)
    if available(name):
        return ""
    return f"the installed onnxruntime has no {t.label} execution provider"


def session_providers(name: str, threads: int = 0) -> list[str | tuple[str, dict[str, str]]]:
    """`providers=` for an onnxruntime session on `name` (its provider with its options, then its fallback);
    `threads` (> 0) also goes to a provider's own thread pool (Target.threads_option). Refused with the install
    hint when the installed onnxruntime lacks the provider."""
    t = get(name, "provider")
    if not available(name):
        raise OnnxfuseError(f"{t.label} execution provider not available in the installed onnxruntime",
                            hint=(f"{t.install} or use --provider cpu" if t.install else None))
    options = dict(t.provider_options)
    if t.threads_option and threads > 0:
        options[t.threads_option] = str(threads)
    return [(t.provider, options) if options else t.provider, *t.fallback]


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


def _live_listing_safe() -> bool:
    """False where a provider whose builds crash listing the registry (Target.lists_kernels) is installed."""
    return not any(t.provider in _available_providers() for t in REGISTRY.values() if not t.lists_kernels)


@functools.cache
def _live() -> dict[str, dict[tuple[str, str], tuple[Kernel, ...]]]:
    if not _live_listing_safe():
        return {}
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
def facts_file(file: str = TABLE) -> tuple[dict[str, str], dict[str, dict[tuple[str, str], tuple[Kernel, ...]]]]:
    """(source, provider -> (domain, op) -> kernels) from a kernel-facts file shipped in kernels/ (the published
    table by default)."""
    text = resources.files("onnxfuse.kernels").joinpath(file).read_text(encoding="utf-8")
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


def facts_label(file: str = TABLE) -> str:
    """Where a kernel-facts file's facts were read, for messages."""
    source, _ = facts_file(file)
    if "probe" in source:
        return f"probed in {source['package']} {source['onnxruntime']}, kernels/{file}"
    release = f" {source['onnxruntime']}" if source.get("onnxruntime") else ""
    return f"onnxruntime{release}'s published kernel table, OperatorKernels.md at {source['commit'][:7]}"


@functools.cache
def kernel_source(target: str) -> KernelSource:
    """Where `target`'s kernels are read: its facts file, or (facts "registry") the installed onnxruntime when
    it has the provider, else the published table."""
    t = get(target)
    if t.facts != "registry":
        _, table = facts_file(t.facts)
        return KernelSource(facts_label(t.facts), False, table.get(t.provider, {}))
    live = _live()
    if available(target) and t.provider in live:
        import onnxruntime as ort

        return KernelSource(f"the installed onnxruntime {ort.__version__}", True, live[t.provider])
    return table_source(target)


@functools.cache
def table_source(target: str) -> KernelSource:
    """`target`'s kernels in onnxruntime's published table, whatever is installed."""
    _, table = facts_file(TABLE)
    return KernelSource(facts_label(TABLE), False, table.get(get(target).provider, {}), TABLE_DOMAINS)


def elem_name(elem_type: int) -> str:
    """onnx.TensorProto.FLOAT16 -> 'float16' (the element type as kernel tables write it)."""
    import onnx

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
    where = get(target).label
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
        from .opschema import input_type_str

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
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from .model_proto import make_model

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
