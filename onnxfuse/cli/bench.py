"""`onnxfuse bench` and `onnxfuse profile`: latency, and op times, bytes and FLOPs."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from ..errors import OnnxfuseError
from ..load.collisions import check_report_path
from ..measure.lock import timing_lock
from ..targets import HOST
from .app import (
    BenchShape,
    InputsOpt,
    LevelOpt,
    ProviderOpt,
    ThreadsOpt,
    app,
    bench_status,
    out,
    parse_target,
    parse_threads,
    profile_status,
)


def _batches(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise OnnxfuseError("expected sizes like 1,2,4,8", option="batches", value=text) from None
    if any(v < 1 for v in values):
        raise OnnxfuseError("sizes must be >= 1", option="batches", value=text)
    return values


@app.command()
def bench(
    a: Annotated[str, typer.Argument(help="Model A (the baseline).")],
    b: Annotated[str | None, typer.Argument(help="Model B, compared against A.")] = None,
    provider: ProviderOpt = HOST,
    threads: ThreadsOpt = "1",
    level: LevelOpt = "all",
    shape: BenchShape = None,
    inputs: InputsOpt = None,
    runs: Annotated[int, typer.Option("--runs", help="Minimum timed runs per model.")] = 50,
    budget: Annotated[float, typer.Option("--budget", help="Seconds of interleaved timing (A B: up to twice that while the verdict is undecided).")] = 5.0,
    batch: Annotated[str | None, typer.Option("--batch", help="Batch sweep, e.g. 1,2,4,8,16.")] = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable): each timed (default for a decoder "
                                                      "with a KV cache: prefill and decode).")] = None,
    html: Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (docs/json.md).")] = False,
    details: Annotated[bool, typer.Option("--details", "-v", help="Print the latency table (session, first "
                                          "run, p99, min, spread) and what the noise floor is.")] = False,
) -> None:
    """Latency of A (and B, interleaved): median, p90, p99, min, spread, speedup with a 95% CI and a verdict;
    a decoder with a KV cache at prefill and at decode."""
    from .. import bench as run_bench

    paths = [a] + ([b] if b else [])
    for p in paths:
        if not os.path.isfile(p):
            raise OnnxfuseError(f"{p}: no such file")
    if html:  # before any work: a report never replaces a model or a file the run reads
        check_report_path(html, "html", paths, also_read=[inputs] if inputs else [])
    with bench_status(not as_json, budget) as progress, timing_lock(
            waiting=lambda: progress("waiting for the timing lock: another onnxfuse is timing", 0.0)):
        res = run_bench(paths, provider=parse_target(provider, "provider"), threads=parse_threads(threads), level=level, shapes=shape,
                        inputs_npz=inputs, min_runs=runs, budget_s=budget, batches=_batches(batch),
                        profiles=profile or None, progress=progress)
    if html:
        from ..inspect.html_report import render, write

        write(html, render(f"onnxfuse bench: {' vs '.join(map(os.path.abspath, paths))}", bench=res))
        if not as_json:
            print(f"report written to {os.path.abspath(html)}", file=sys.stderr)
    if as_json:
        print(json.dumps(res.to_json(), indent=2))
    elif details or res.batches:
        from ..inspect.report import print_bench

        print_bench(res, out)
    else:
        from ..inspect.summary import bench_summary, more

        for line in [*bench_summary(res, out.width), more(out.width, "--details (the latency table), --json, "
                                                                        "--html FILE")]:
            out.print(line, markup=False, soft_wrap=True)


@app.command()
def profile(
    a: Annotated[str, typer.Argument(help="Model to profile.")],
    b: Annotated[str | None, typer.Argument(help="A second model (e.g. the optimized one), side by side.")] = None,
    provider: ProviderOpt = HOST,
    threads: ThreadsOpt = "1",
    level: LevelOpt = "all",
    shape: BenchShape = None,
    inputs: InputsOpt = None,
    runs: Annotated[int, typer.Option("--runs", help="Profiled runs (after 10 warm-up runs).")] = 30,
    nodes: Annotated[bool, typer.Option("--nodes", help="Also list the slowest nodes.")] = False,
    batch: Annotated[str | None, typer.Option("--batch", help="Batch sizes for the utilization signal, e.g. 1,8; one size (e.g. 8): profile at that batch size.")]
    = None,
    html: Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (docs/json.md).")] = False,
    details: Annotated[bool, typer.Option("--details", "-v", help="Print the op-time table, the memory-bound "
                                          "signals and the headroom split.")] = False,
) -> None:
    """Op-time table (onnxruntime profiler), bytes and FLOPs per op, utilization against measured peaks, and
    the memory-bound signals."""
    from .. import bench as run_bench
    from .. import profile as run_profile

    paths = [a] + ([b] if b else [])
    labels = ["A", "B"][: len(paths)]
    for p in paths:
        if not os.path.isfile(p):
            raise OnnxfuseError(f"{p}: no such file")
    if html:  # before any work: a report never replaces a model or a file the run reads
        check_report_path(html, "html", paths, also_read=[inputs] if inputs else [])
    sizes = _batches(batch)
    n_threads = parse_threads(threads)
    results = []
    comparison = None
    target = parse_target(provider, "provider")
    with profile_status(not as_json) as progress, timing_lock(  # side by side, timings lie
            waiting=lambda: progress("A/B")("waiting for the timing lock: another onnxfuse is timing")):
        if b:  # A and B interleaved with an A/A control, judged as bench and optimize judge (measure/)
            progress("A/B")("timing A and B interleaved")
            comparison = run_bench(paths, labels, provider=target, threads=n_threads, level=level, shapes=shape,
                                   inputs_npz=inputs, budget_s=3.0)
        for i, (label, p) in enumerate(zip(labels, paths, strict=True)):
            results.append(run_profile(p, target, n_threads, level, runs, shapes=shape, inputs_npz=inputs,
                                       batches=sizes, progress=progress(label), inputs_from=a,
                                       latency_ms=comparison.models[i].median_ms if comparison else None))
    if html:
        from ..inspect.html_report import render, write

        write(html, render(f"onnxfuse profile: {' vs '.join(map(os.path.abspath, paths))}", profiles=results,
                           labels=labels))
        if not as_json:
            print(f"report written to {os.path.abspath(html)}", file=sys.stderr)
    if as_json:
        print(json.dumps({"schema": "onnxfuse.profile/1", "models": [r.to_json() for r in results],
                          "comparison": comparison.to_json() if comparison else None}, indent=2))
    elif details or nodes:
        from ..inspect.report import print_profile

        print_profile(results, labels, out, nodes, comparison)
    else:
        from ..inspect.summary import profile_summary

        for line in profile_summary(results, labels, out.width, comparison):
            out.print(line, markup=False, soft_wrap=True)
