#!/usr/bin/env python3
"""Which transformer fusions do onnxruntime's optimizer, onnxscript and onnxfuse apply, and do they pay off?

Usage::

    python models/make_transformer_models.py                      # once: builds models/transformers/
    python -m benchmarks.transformer_fusions                      # every .onnx in models/transformers/
    python -m benchmarks.transformer_fusions /work/shared/models/bert_tiny.onnx --json /tmp/fusions.json
    python -m benchmarks.transformer_fusions --dir '' X.onnx --tools ortx-o1,onnxfuse --seconds 4

For each model (the ``--dir`` folder, default ``models/transformers/``, plus any paths given) it builds:

* ``ortx-o0`` / ``ortx-o1``: ``onnxruntime.transformers.optimizer.optimize_model(path, model_type=...,
  num_heads=0, hidden_size=0, opt_level=0|1)``; the model type comes from the file name (bert, gpt2, vit;
  llama tries qwen3 then gpt2);
* ``onnxscript``: ``onnxscript.rewriter.ort_fusions.optimize_for_ort`` on an ``onnx_ir`` model;
* ``onnxfuse-nm``: ``onnxfuse optimize IN OUT --no-measure``; ``onnxfuse``: the same with measuring on;

all written into a temporary folder (``--keep DIR`` keeps them there instead). A tool that fails is
reported as ``error: ...`` in one line. Then for every variant: the fused ops (all ``com.microsoft`` ops,
``LayerNormalization``, and non-ONNX ops in the default domain such as ``SimplifiedLayerNormalization``),
whether it loads and runs in onnxruntime CPU at ``ORT_ENABLE_ALL``, its max abs error against the untouched
model at ``ORT_DISABLE_ALL`` on the same feeds, and its median latency at
``ORT_ENABLE_ALL`` with 1 and 2 intra-op threads and its ratio to the untouched model's, each variant compared
with the untouched model by the tool's own protocol (``onnxfuse.measure.compare``: A/A pairs, sessions made
twice, interleaved; same feeds).

Feeds: models with an ``inputs.json`` beside them (written by ``models/make_transformer_models.py``) get
exactly the feeds it describes; other models get batch 2 and sequence 16 for symbolic dims, token ids
below the vocabulary size found in their embedding ``Gather``, masks of ones with the last 3 positions of
sample 1 set to 0, and standard-normal floats.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxfuse.measure.compare import compare

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / "models" / "transformers"
ALL_TOOLS = ("ortx-o0", "ortx-o1", "onnxscript", "onnxfuse-nm", "onnxfuse")
BATCH, SEQ, MASKED_TAIL = 2, 16, 3
ORT_TYPES: dict[str, tuple[str, ...]] = {  # file-name keyword -> optimize_model model types to try, in order
    "bert": ("bert",), "gpt2": ("gpt2",), "vit": ("vit", "bert"), "llama": ("qwen3", "gpt2"),
}
NP_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64,
            onnx.TensorProto.INT32: np.int32, onnx.TensorProto.FLOAT16: np.float16,
            onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.DOUBLE: np.float64}

Feeds = dict[str, np.ndarray]


# --------------------------------------------------------------------------- #
# Results
# --------------------------------------------------------------------------- #
@dataclass
class Variant:
    tool: str
    path: str | None = None
    error: str | None = None  # the tool failed
    detail: str = ""  # e.g. the model type the ORT optimizer used
    tool_s: float | None = None
    nodes: int | None = None
    fused: dict[str, int] = field(default_factory=dict)
    loads: bool | None = None
    load_error: str | None = None
    max_abs_err: float | None = None
    ms: dict[int, float] = field(default_factory=dict)  # threads -> median ms
    ratio: dict[int, float] = field(default_factory=dict)  # threads -> ms / untouched ms


def one_line(exc: BaseException | str) -> str:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "unknown error")[:200]


# --------------------------------------------------------------------------- #
# Feeds
# --------------------------------------------------------------------------- #
def feeds_from_inputs_json(spec: list[dict[str, Any]]) -> Feeds:
    """The feeds ``make_transformer_models.make_feeds`` builds, from their inputs.json description."""
    rng = np.random.default_rng(0)
    feeds: Feeds = {}
    for inp in spec:
        shape = inp["shape"]
        if inp["kind"] == "ids":
            arr = rng.integers(inp.get("low", 0), inp["high"], shape)
        elif inp["kind"] == "mask":
            arr = np.ones(shape)
            arr[1, -inp.get("masked_tail", MASKED_TAIL):] = 0
        elif inp["kind"] == "zeros":
            arr = np.zeros(shape)
        elif inp["kind"] == "positions":  # the new tokens follow the cache
            arr = np.broadcast_to(np.arange(inp["start"], inp["start"] + shape[1]), shape)
        else:
            arr = rng.standard_normal(shape)
        feeds[inp["name"]] = np.ascontiguousarray(arr).astype(inp["dtype"])
    return feeds


def vocab_bound(model: onnx.ModelProto, input_name: str, default: int = 100) -> int:
    """Rows of the initializer that a Gather indexes with ``input_name`` (the embedding table)."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return default


def generic_feeds(model: onnx.ModelProto) -> Feeds:
    rng = np.random.default_rng(0)
    inits = {t.name for t in model.graph.initializer}
    feeds: Feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = []
        for k, d in enumerate(tt.shape.dim):
            shape.append(d.dim_value if d.dim_value > 0 else BATCH if k == 0 else SEQ)
        dtype = NP_TYPES[tt.elem_type]
        if "mask" in inp.name:
            arr = np.ones(shape)
            if len(shape) == 2 and shape[0] > 1 and shape[1] > MASKED_TAIL:
                arr[1, -MASKED_TAIL:] = 0
        elif "token_type" in inp.name:
            arr = np.zeros(shape)
        elif np.issubdtype(dtype, np.integer):
            arr = rng.integers(0, vocab_bound(model, inp.name), shape)
        else:
            arr = rng.standard_normal(shape)
        feeds[inp.name] = arr.astype(dtype)
    return feeds


def feeds_for(path: Path) -> Feeds:
    described = path.parent / "inputs.json"
    if described.exists():
        entry = json.loads(described.read_text()).get(path.name)
        if entry:
            return feeds_from_inputs_json(entry["inputs"])
    return generic_feeds(onnx.load(str(path), load_external_data=False))


# --------------------------------------------------------------------------- #
# Tools
# --------------------------------------------------------------------------- #
def model_types(path: Path, table: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """onnxruntime optimizer model types to try for a file, by a key its name contains (`table`: ORT_TYPES)."""
    name = path.name.lower()
    for key, types in (table or ORT_TYPES).items():
        if key in name:
            return types
    return ("bert",)


@contextlib.contextmanager
def quiet():
    """Silence the optimizers' prints, warnings and logging."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def run_ort_transformers(src: Path, dst: Path, opt_level: int | None,
                         types: tuple[str, ...] | None = None) -> str:
    """onnxruntime's transformers optimizer with each model type of `types` (default: by file name) until one
    works; opt_level None is the optimizer's own default."""
    from onnxruntime.transformers import optimizer

    errors = []
    for model_type in types or model_types(src):
        try:
            with quiet():
                opt = optimizer.optimize_model(str(src), model_type=model_type, num_heads=0, hidden_size=0,
                                               opt_level=opt_level, use_gpu=False)
                opt.save_model_to_file(str(dst), use_external_data_format=False)
            return f"model_type={model_type}"
        except Exception as exc:  # noqa: BLE001 - try the next model type
            errors.append(f"{model_type}: {one_line(exc)}")
    raise RuntimeError("; ".join(errors))


def run_onnxscript(src: Path, dst: Path) -> str:
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    with quiet():
        model = ir.load(str(src))
        model, counts = ort_fusions.optimize_for_ort(model)
        ir.save(model, str(dst))
    applied = {k: v for k, v in counts.items() if v}
    return ", ".join(f"{k} {v}" for k, v in sorted(applied.items())) or "no fusions"


def onnxfuse_exe() -> str:
    local = Path(sys.executable).with_name("onnxfuse")
    return str(local) if local.exists() else (shutil.which("onnxfuse") or "onnxfuse")


def run_onnxfuse(src: Path, dst: Path, measure: bool) -> str:
    cmd = [onnxfuse_exe(), "optimize", str(src), str(dst)] + ([] if measure else ["--no-measure"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not dst.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"rc={proc.returncode}: " + (tail[-1] if tail else "no output"))
    return ""


TOOLS: dict[str, Callable[[Path, Path], str]] = {
    "ortx-o0": lambda s, d: run_ort_transformers(s, d, 0),
    "ortx-o1": lambda s, d: run_ort_transformers(s, d, 1),
    "onnxscript": run_onnxscript,
    "onnxfuse-nm": lambda s, d: run_onnxfuse(s, d, measure=False),
    "onnxfuse": lambda s, d: run_onnxfuse(s, d, measure=True),
}


def build_variant(tool: str, src: Path, out_dir: Path) -> Variant:
    dst = out_dir / f"{src.stem}.{tool}.onnx"
    var = Variant(tool)
    start = time.perf_counter()
    try:
        var.detail = TOOLS[tool](src, dst)
        var.path = str(dst)
    except Exception as exc:  # noqa: BLE001 - record and go on
        var.error = one_line(exc)
    var.tool_s = time.perf_counter() - start
    return var


# --------------------------------------------------------------------------- #
# Inspection and checks
# --------------------------------------------------------------------------- #
def all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            for sub in attr.graphs:
                yield from all_nodes(sub)


def is_fused(node: onnx.NodeProto) -> bool:
    """com.microsoft ops, LayerNormalization, and ops onnx does not define in their domain (onnxruntime also
    registers contrib ops such as SimplifiedLayerNormalization in the default domain)."""
    if node.domain == "com.microsoft" or node.op_type == "LayerNormalization":
        return True
    return node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, "")


def fused_ops(model: onnx.ModelProto) -> tuple[int, dict[str, int]]:
    """Node count (main graph) and counts of the fused ops (all graphs)."""
    counts = collections.Counter(n.op_type for n in all_nodes(model.graph) if is_fused(n))
    return len(model.graph.node), dict(sorted(counts.items()))


def session(path: str, level: ort.GraphOptimizationLevel, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def max_abs_err(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    worst = 0.0
    pairs = [(ref[k], got[k]) for k in ref if k in got] or list(zip(ref.values(), got.values(), strict=False))
    for a, b in pairs:
        if a.shape != b.shape:
            return float("inf")
        if a.size:
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = max(worst, float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan"))
    return worst


def run_named(sess: ort.InferenceSession, feeds: Feeds) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def check_variant(var: Variant, feeds: Feeds, ref: dict[str, np.ndarray]) -> None:
    model = onnx.load(var.path)
    var.nodes, var.fused = fused_ops(model)
    try:
        got = run_named(session(var.path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL), feeds)
        var.loads = True
        var.max_abs_err = max_abs_err(ref, got)
    except Exception as exc:  # noqa: BLE001
        var.loads = False
        var.load_error = one_line(exc)


def time_variants(variants: list[Variant], feeds: Feeds, threads: int, seconds: float) -> None:
    """Each loadable variant against the untouched model by the tool's own protocol (onnxfuse.measure.compare:
    A/A pairs, sessions made twice, interleaved): its median latency and its ratio to the untouched model's."""
    base = next((v for v in variants if v.tool == "untouched" and v.loads), None)
    if base is None:
        return
    for var in variants:
        if var.loads and var is not base:
            c = compare(base.path, var.path, feeds, threads=threads, seconds=seconds)
            base.ms.setdefault(threads, c.base_s * 1e3)
            var.ms[threads], var.ratio[threads] = c.variant_s * 1e3, c.verdict.ratio.median
    base.ratio[threads] = 1.0


# --------------------------------------------------------------------------- #
# One model
# --------------------------------------------------------------------------- #
def bench_model(path: Path, tools: list[str], threads: list[int], seconds: float,
                keep: Path | None) -> list[Variant]:
    feeds = feeds_for(path)
    ref = run_named(session(str(path), ort.GraphOptimizationLevel.ORT_DISABLE_ALL), feeds)
    with tempfile.TemporaryDirectory(prefix="transformer_fusions_") as tmp:
        out_dir = keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        variants = [Variant("untouched", path=str(path))]
        for tool in tools:
            print(f"  {tool} ...", end="", file=sys.stderr, flush=True)
            var = build_variant(tool, path, out_dir)
            print(f" {var.tool_s:.1f}s {var.error or ''}", file=sys.stderr, flush=True)
            variants.append(var)
        for var in variants:
            if var.path:
                check_variant(var, feeds, ref)
        for t in threads:
            time_variants(variants, feeds, t, seconds)
    return variants


# --------------------------------------------------------------------------- #
# Output
# --------------------------------------------------------------------------- #
def fmt_fused(fused: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in fused.items()) or "-"


def fmt_num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(name: str, variants: list[Variant], threads: list[int]) -> str:
    head = ["tool", "nodes", "fused ops", "loads", "max abs err"] + [f"ms@{t}t" for t in threads] + \
        [f"ratio@{t}t" for t in threads]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        if v.error:
            cells = [v.tool, "-", f"error: {v.error}", "-", "-"] + ["-"] * (2 * len(threads))
        else:
            loads = "yes" if v.loads else f"no: {v.load_error}"
            cells = [v.tool, str(v.nodes), fmt_fused(v.fused), loads, fmt_num(v.max_abs_err, ".1e")]
            cells += [fmt_num(v.ms.get(t), ".3f") for t in threads]
            cells += [fmt_num(v.ratio.get(t), ".3f") for t in threads]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    notes = [f"{v.tool}: {v.detail}" for v in variants if v.detail]
    if notes:
        lines += ["", "; ".join(notes)]
    return "\n".join(lines)


def collect_paths(directory: str, extra: list[str]) -> list[Path]:
    paths: list[Path] = []
    if directory:
        paths += sorted(Path(directory).glob("*.onnx"))
    for item in extra:
        p = Path(item)
        paths += sorted(p.glob("*.onnx")) if p.is_dir() else [p]
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="extra .onnx files (or folders) to benchmark")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder of .onnx files ('' for none)")
    ap.add_argument("--tools", default=",".join(ALL_TOOLS), help=f"comma-separated subset of {ALL_TOOLS}")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts to time")
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="seconds of runs per comparison with the untouched model (at least; onnxfuse.measure.compare)")
    ap.add_argument("--keep", default=None, help="write the optimized models here instead of a temp folder")
    ap.add_argument("--json", default=None, help="dump all results to this file")
    a = ap.parse_args(argv)
    tools = [t for t in a.tools.split(",") if t]
    unknown = set(tools) - set(ALL_TOOLS)
    if unknown:
        ap.error(f"unknown tools {sorted(unknown)}")
    threads = [int(t) for t in a.threads.split(",")]
    keep = Path(a.keep).resolve() if a.keep else None
    if keep and keep.is_relative_to(Path("/work/shared")):
        ap.error("--keep must not be inside /work/shared")
    ort.set_default_logger_severity(3)
    results: dict[str, Any] = {}
    for path in collect_paths(a.dir, a.paths):
        print(f"== {path}", file=sys.stderr, flush=True)
        try:
            variants = bench_model(path, tools, threads, a.seconds, keep)
        except Exception as exc:  # noqa: BLE001 - keep going with the other models
            print(f"### {path.name}\n\nerror: {one_line(exc)}\n", flush=True)
            results[str(path)] = {"error": one_line(exc)}
            continue
        print(markdown_table(path.name, variants, threads) + "\n", flush=True)
        results[str(path)] = [asdict(v) for v in variants]
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
