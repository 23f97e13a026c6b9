"""`onnxfuse optimize`: one model, or many into a folder (batch.py), with the report, bench and HTML after."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer
from typer._click.exceptions import UsageError  # typer vendors click

from .. import signals
from ..errors import OnnxfuseError
from ..load.collisions import check_report_path
from ..measure.lock import REPORT_WAIT_S, WAIT_KEY, busy_lock, timing_lock
from ..options import check_count
from ..targets import HOST
from .app import (
    PIPED_WIDTH,
    PatternsOpt,
    TargetOpt,
    app,
    bench_status,
    out,
    parse_target,
    parse_threads,
    profile_status,
)

# optimize's own options (the shared ones are in app.py)
_Paths = Annotated[list[str], typer.Argument(help="IN OUT: the model (.onnx) and "
                                               "where to write it (an existing folder OUT: OUT/<IN's file name>); or IN... OUTDIR: several models and/or folders "
                                               "of models (their *.onnx) and an output folder.")]
_Only = Annotated[list[str] | None, typer.Option("--only", help="Apply only this rule id (repeatable).")]
_Skip = Annotated[list[str] | None, typer.Option("--skip", help="Never apply this rule id (repeatable).")]
_NoBuiltin = Annotated[bool, typer.Option("--no-builtin", help="Use only the --patterns files.")]
_NoValidate = Annotated[bool, typer.Option("--no-validate", help="Skip the onnxruntime check.")]
_DryRun = Annotated[bool, typer.Option("--dry-run", help="Report what would change; write nothing.")]
_Shape = Annotated[list[str] | None, typer.Option("--shape", help="Input shape name:1x3x224x224, or a "
                                                    "symbolic dim batch=4 (repeatable).")]
_Inputs = Annotated[str | None, typer.Option("--inputs", help="Validation inputs from an .npz file.")]
_Profile = Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable): validated on each, measured on "
                                                      "their weighted total.")]
_Rtol = Annotated[float | None, typer.Option("--rtol", help="Relative tolerance (default by dtype).")]
_Atol = Annotated[float | None, typer.Option("--atol", help="Absolute tolerance (default by dtype).")]
_Force = Annotated[bool, typer.Option("--force", help="Allow OUTPUT to be the input file.")]
_Static = Annotated[bool, typer.Option("--static", help="Fix the dynamic input dims to the --shape values "
                                         "first (the output then accepts only those shapes).")]
_FreezeWeights = Annotated[bool, typer.Option("--freeze-weights", help="Make initializers that are also "
                                                 "listed as graph inputs (ONNX Model Zoo style) constants, so "
                                                 "they fold and fuse; the output no longer takes them as "
                                                 "inputs.")]
_PadChannels = Annotated[bool, typer.Option("--pad-channels", help="Pad Conv channels to a multiple of 8 with "
                                               "zero weights (exact); kept only where measured faster.")]
_NoFold = Annotated[bool, typer.Option("--no-fold", help="Do not fold constants or inline If nodes whose "
                                          "condition is constant.")]
_NoMeasure = Annotated[bool, typer.Option("--no-measure", help="Keep every validated rewrite without timing "
                                             "them (default: time groups of rewrites, keep only those that help).")]
_Threads = Annotated[str, typer.Option("--threads", help="onnxruntime intra-op threads while measuring: a count, "
                                         "or auto (onnxruntime's default: one per physical core). Decisions hold "
                                         "for this count; the report, JSON, HTML and decision cache name it.")]
_MeasureBudget = Annotated[float | None, typer.Option("--measure-budget", help="Seconds for the whole "
                                                         "measuring phase, on the clock decisions are read on "
                                                         "(thread CPU time at --threads 1; default: automatic, "
                                                         "12 s and 225 runs of the model, 12-90 s, more past 1 GiB). "
                                                         "It limits what is timed, never what is kept: the rest "
                                                         "follows its prior.")]
_NoCache = Annotated[bool, typer.Option("--no-cache", help="Neither reuse nor record measured decisions "
                                           "(the decision cache: onnxfuse cache show).")]
_BenchAfter = Annotated[bool, typer.Option("--bench", help="Benchmark the input against the output "
                                              "afterwards (interleaved, same options).")]
_Html = Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report (implies "
                                             "--bench; adds the op-time profile of both models).")]
_AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
_Details = Annotated[bool, typer.Option("--details", "-v", help="Print every table (rules fired, op counts, "
                                          "validation per output, the measured selection) after the summary's "
                                          "facts; the default is a few lines, the answer first.")]
_Jobs = Annotated[int | None, typer.Option("--jobs", "-j", help="Several models: worker processes that "
                                             "rewrite and validate side by side (default: min(4, CPUs)); "
                                             "measuring stays one model at a time.")]
_Recursive = Annotated[bool, typer.Option("--recursive", "-r", help="Input folders: also the models in "
                                            "their subfolders.")]
_Ray = Annotated[str | None, typer.Option("--ray", help="Optimize the models on a Ray cluster instead of "
                                            "--jobs: auto (a running cluster, else one started here) or its "
                                            "address; each node measures one model at a time and all nodes "
                                            "share decisions (docs/fleet.md; pip install 'onnxfuse[ray]').")]


@app.command()
def optimize(
    ctx: typer.Context,
    paths: _Paths,
    patterns: PatternsOpt = None,
    only: _Only = None, skip: _Skip = None,
    target: TargetOpt = HOST,
    no_builtin: _NoBuiltin = False,
    no_validate: _NoValidate = False,
    dry_run: _DryRun = False,
    shape: _Shape = None,
    inputs: _Inputs = None,
    profile: _Profile = None,
    rtol: _Rtol = None, atol: _Atol = None,
    force: _Force = False,
    static: _Static = False,
    freeze_weights: _FreezeWeights = False,
    pad_channels: _PadChannels = False,
    no_fold: _NoFold = False,
    no_measure: _NoMeasure = False,
    threads: _Threads = "1",
    measure_budget: _MeasureBudget = None,
    no_cache: _NoCache = False,
    bench_after: _BenchAfter = False,
    html: _Html = None,
    as_json: _AsJson = False, details: _Details = False,
    jobs: _Jobs = None, recursive: _Recursive = False,
    ray: _Ray = None,
) -> None:
    """Apply fusion patterns to a fixed point, validate with onnxruntime, write OUT atomically. With several
    models (or a folder), write each into the folder OUT under its own file name."""
    from .. import OptimizeOptions
    from .. import optimize as run_optimize

    opts = OptimizeOptions(patterns=patterns or [], only=only or [], skip=skip or [], builtin=not no_builtin,
                           target=parse_target(target), validate=not no_validate, shapes=shape or [],
                           inputs_npz=inputs, rtol=rtol, atol=atol, force=force, dry_run=dry_run,
                           measure=not no_measure, fold=not no_fold, pad_channels=pad_channels, static=static,
                           freeze_weights=freeze_weights,
                           measure_threads=parse_threads(threads), measure_budget_s=measure_budget, profiles=profile or [],
                           cache=not no_cache).check()
    if jobs is not None:
        check_count("jobs", jobs)
    if jobs is not None and ray is not None:
        raise OnnxfuseError("--jobs and --ray are two ways of running a batch: give one",
                            hint="--ray runs as many models at once as the cluster has timing slots")
    if (bench_after or html) and dry_run:
        raise OnnxfuseError("--bench/--html need the written output; drop --dry-run")
    if len(paths) < 2:
        raise UsageError("Missing argument 'OUT': onnxfuse optimize IN OUT, or IN... OUTDIR", ctx)
    inputs, output = paths[:-1], paths[-1]
    if len(inputs) > 1 or os.path.isdir(inputs[0]) or ray is not None:
        _optimize_batch(inputs, output, opts, jobs, recursive, bench_after, html, as_json, ray, details)
        return
    input = inputs[0]
    from ..progress import status_line

    if os.path.isdir(output):  # an existing folder: the output is OUT/<input's file name>
        output = os.path.join(output, os.path.basename(input))
    if html:  # before any work: a report never replaces the input, the output or their data files
        check_report_path(html, "html", [input], [] if dry_run else [output],
                          also_read=[opts.inputs_npz or "", *opts.patterns])
    # shared: never beside a process that is timing; measuring takes it exclusive
    with status_line(not as_json) as progress, busy_lock() as waited:
        result = run_optimize(input, output, opts, progress=progress)
    if waited > REPORT_WAIT_S:
        result.timings[WAIT_KEY] = result.timings.get(WAIT_KEY, 0.0) + waited
    _report_optimize(result, input, output, opts, bench_after or bool(html), html, as_json, details)


def _report_optimize(result, input: str, output: str, opts, bench_after: bool, html: str | None,
                     as_json: bool, details: bool = False) -> None:
    """Print the result (text or JSON), after benchmarking and profiling input against output if asked; its
    warnings go to stderr, one line each (JSON has them too)."""
    for w in result.warnings:
        print(f"onnxfuse: warning: {w}", file=sys.stderr)
    bench_res, profiles = None, None
    if bench_after:
        from .. import bench as run_bench

        with bench_status(not as_json, 5.0) as progress, timing_lock():
            bench_res = run_bench([input, output], ["input", "output"], provider=opts.target,
                                  threads=opts.measure_threads, shapes=opts.shapes or None,
                                  inputs_npz=opts.inputs_npz, profiles=opts.profiles or None, progress=progress)
    if html:
        from .. import profile as run_profile
        from ..inspect.html_report import render, write

        with profile_status(not as_json) as progress, timing_lock():
            # the latency the profile reports is bench's where it ran (one number per model on the page)
            profiles = [run_profile(p, opts.target, opts.measure_threads, shapes=opts.shapes or None,
                                    inputs_npz=opts.inputs_npz, progress=progress(label), inputs_from=input,
                                    latency_ms=bench_res.models[i].median_ms if bench_res else None)
                        for i, (label, p) in enumerate((("input", input), ("output", output)))]
        write(html, render(f"onnxfuse optimize: {os.path.abspath(input)}", bench=bench_res, profiles=profiles,
                           labels=["input", "output"], result=result))
        if not as_json:
            print(f"report written to {os.path.abspath(html)}", file=sys.stderr)
    if as_json:
        data = result.to_json()
        if bench_res is not None:
            data["bench"] = bench_res.to_json()
        if profiles:
            data["profile"] = [p.to_json() for p in profiles]
        print(json.dumps(data, indent=2, default=str))
    elif details:
        from ..inspect.report import print_bench, print_result

        print_result(result, out)
        if bench_res is not None:
            print_bench(bench_res, out)
    else:
        from ..inspect.summary import bench_summary, optimize_summary

        for line in optimize_summary(result, out.width, f"onnxfuse explain {input}"):
            out.print(line, markup=False, soft_wrap=True)
        if bench_res is not None:
            for line in bench_summary(bench_res, out.width):
                out.print(line, markup=False, soft_wrap=True)


def _optimize_batch(inputs: list[str], out_dir: str, opts, jobs: int | None, recursive: bool, bench_after: bool,
                    html: str | None, as_json: bool, ray: str | None = None, details: bool = False) -> None:
    """Several models (or folders) into the folder OUT_DIR: one line per model as it finishes, then a total;
    with --json, the list of per-model results. Exit code 1 if any model failed. With `ray` (an address or
    auto) on a Ray cluster (fleet/), with a bar of done, failed, running and queued models on a terminal."""
    import time

    from ..batch import BatchItem, collect, default_jobs, optimize_many

    if html:
        raise OnnxfuseError("--html writes the report of one model; with several models use --bench, or --html "
                            "on each model alone")
    one_file = ray is not None and len(inputs) == 1 and not os.path.isdir(inputs[0]) and not os.path.isdir(out_dir)
    items = [BatchItem(inputs[0], out_dir)] if one_file else collect(inputs, out_dir, recursive)  # --ray IN OUT
    n_jobs = min(jobs or default_jobs(), len(items))
    t0 = time.perf_counter()

    finished: list[dict] = []

    def show(d: dict) -> None:
        finished.append(d)
        if d["error"]:
            print(f"onnxfuse: error: {_failure_line(d)}", file=sys.stderr, flush=True)
            return
        for w in d.get("warnings", []):
            print(f"onnxfuse: warning: {d['input']}: {w}", file=sys.stderr, flush=True)
        if not as_json:
            print(_batch_line(d) if details else _short_batch_line(d, out.width), flush=True)

    how = f"--jobs {n_jobs}"
    try:
        if ray is None:
            results = optimize_many(items, opts, n_jobs, show)
        else:
            results, how = _on_ray(items, opts, ray, show, as_json)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (signals.py)
        print(f"onnxfuse: {signals.word(e)} after {len(finished)} of {len(items)} model(s); the models finished "
              "by then are written, nothing partial", file=sys.stderr)
        raise BatchInterrupted() from None
    if bench_after:
        _bench_batch(results, opts, as_json)
    failed = [d for d in results if d["error"]]
    if as_json:
        print(json.dumps(results, indent=2, default=str))
    else:
        from ..inspect.summary import fit, fit_list, short_path

        width = out.width if not details else PIPED_WIDTH
        done = "checked (dry run: nothing written)" if opts.dry_run else f"written to {short_path(out_dir, max(30, width - 60))}"
        tail = f"; {time.perf_counter() - t0:.1f} s with {how}"
        head = f"{len(results)} model(s): {len(results) - len(failed)} {done}, {len(failed)} failed"
        print(fit_list(head + " (", [os.path.basename(d["input"]) for d in failed], width, ")" + tail)
              if failed else fit(head + tail, width))
    if failed:
        raise typer.Exit(1)


def _on_ray(items, opts, address: str, show, as_json: bool) -> tuple[list[dict], str]:
    """The batch on Ray, its bar on a terminal's stderr; (results, how it ran, for the total line)."""
    from ..fleet import optimize_on_ray
    from ..fleet.driver import nodes_used
    from ..progress import counts_bar, status_line

    with status_line(not as_json) as progress:
        results = optimize_on_ray(items, opts, address, show,
                                  on_progress=lambda c: progress(counts_bar(c["done"], c["failed"], c["running"],
                                                                            c["queued"])))
    return results, f"Ray ({nodes_used(results)} node(s))"


class BatchInterrupted(Exception):
    """Ctrl-C or SIGTERM during a batch, already reported (with what was written before it)."""


def _failure_line(d: dict) -> str:
    """`INPUT: message`, the message on one line (it names the input already when it starts with it)."""
    msg = " ".join(line.strip() for line in str(d["error"]).splitlines() if line.strip())
    return msg if msg.startswith(d["input"] + ":") else f"{d['input']}: {msg}"


def _batch_line(d: dict) -> str:
    """One model of a batch: nodes before -> after, fused ops, validation, measured ratio, seconds."""
    before = d["ops_before"]  # op types that grew: contrib (fused) ops, and other op types the input lacked
    grew = {op: n - before.get(op, 0) for op, n in d["ops_after"].items()
            if n > before.get(op, 0) and ("." in op or op not in before) and op != "Constant"}

    def listed(ops: dict[str, int]) -> str:
        return ", ".join(f"{op.removeprefix('com.microsoft.')} x{n}" for op, n in sorted(ops.items(),
                                                                                         key=lambda kv: -kv[1]))

    fused, added = listed({k: v for k, v in grew.items() if "." in k}), listed({k: v for k, v in grew.items()
                                                                                if "." not in k})
    parts = [f"nodes {d['nodes_before']} -> {d['nodes_after']}", f"fused ops {fused}" if fused else "no fused ops"]
    parts += [f"ops added {added}"] if added else []
    parts += ["validation " + d["validation"]["status"].split(";")[0]]
    m = d.get("measure")
    if m is not None:
        r = m.get("final_ratio")
        if r:
            whole = "weighted over profiles" if m.get("profiles") else "whole model"
            parts.append(f"time ratio ({whole}, kept / original, {m.get('threads')} thread(s)) {r['median']:.3f} "
                         f"[{r['low']:.3f}, {r['high']:.3f}] {m.get('final_verdict')}")
        else:
            why = m.get("note") or m.get("confirmed") or "no whole-model ratio"
            parts.append(f"measured ({m.get('threads')} thread(s)): {why[:70]}")
    waited = d.get("timings_s", {}).get(WAIT_KEY)
    if waited:
        parts.append(f"waited {waited:.1f} s for the timing lock")
    node = d.get("node")
    if node:
        parts.append(f"{'measured' if node.get('measured') else 'ran'} on {node['host']} ({node['address']}, "
                     f"node {node['id'][:8]})")
    parts.append(f"{d['seconds']:.1f} s")
    where = d["output"] or "(dry run)"
    return f"{d['input']} -> {where}: " + ", ".join(parts)


def _short_batch_line(d: dict, width: int) -> str:
    """One model of a batch in one line of the terminal's width: the verdict, nodes, validation, seconds (the
    rest is --details and --json)."""
    from ..inspect.summary import fit, short_path, short_word, validation_word

    m = d.get("measure")
    r = m and m.get("final_ratio")
    verdict = ("no faster selection: the output is the input" if m and m.get("dropped_everything")
               and not d.get("applications") else f"{short_word(m.get('final_verdict') or '')} {r['median']:.3f}x"
               if r else "measured: no whole-model ratio" if m else "not measured" if d.get("applications")
               else "nothing rewritten")
    tail = (f": {verdict}, nodes {d['nodes_before']} -> {d['nodes_after']}, "
            f"{validation_word(d['validation']['status'], short=True)}, {d['seconds']:.1f} s")
    return fit(short_path(os.path.basename(d["input"]), max(12, width - len(tail))) + tail, width)


def _bench_batch(results: list[dict], opts, as_json: bool) -> None:
    """--bench with several models: each written output against its input, one model at a time, afterwards."""
    from .. import bench as run_bench

    for d in results:
        if d["error"] or not d["output"]:
            continue
        with timing_lock():
            res = run_bench([d["input"], d["output"]], ["input", "output"], provider=opts.target,
                            threads=opts.measure_threads, shapes=opts.shapes or None, inputs_npz=opts.inputs_npz,
                            profiles=opts.profiles or None)
        d["bench"] = res.to_json()
        if not as_json:
            print(f"bench {d['input']}: " + "; ".join(
                (f"{r.profile} " if res.profiles else "") + f"speedup {r.speedup or 0:.3f}x, {r.verdict}"
                for r in [res, *res.profiles]), flush=True)
