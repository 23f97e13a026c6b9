"""The `onnxfuse` command: thin; parses flags, calls the API, prints. Errors are one line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .errors import OnnxfuseError
from .options import check_choice, check_count
from .select.timing_lock import REPORT_WAIT_S, WAIT_KEY, busy_lock, timing_lock

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Make ONNX models faster on onnxruntime with validated YAML fusions.")
patterns_app = typer.Typer(no_args_is_help=True, help="List, show, check and self-test fusion patterns.")
app.add_typer(patterns_app, name="patterns")
cache_app = typer.Typer(no_args_is_help=True, help="Show or clear the measured-decision cache.")
app.add_typer(cache_app, name="cache")

out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _print_version(value: bool) -> None:
    if value:
        print(f"onnxfuse {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Make ONNX models faster on onnxruntime with validated YAML fusions."""

PatternsOpt = Annotated[list[str] | None, typer.Option("--patterns", "-p", help="Extra pattern file or folder "
                                                       "(repeatable).")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Execution provider: cpu or cuda.")]


# API option names (OnnxfuseError.option) -> the flags that set them: a CLI error names the flag
FLAGS = {"target": "--target", "provider": "--provider", "measure_threads": "--threads", "threads": "--threads",
         "measure_budget_s": "--measure-budget", "budget_s": "--budget", "min_runs": "--runs", "runs": "--runs",
         "rtol": "--rtol", "atol": "--atol", "measure_by": "--measure-by", "jobs": "--jobs", "shapes": "--shape",
         "profiles": "--profile", "inputs_npz": "--inputs", "level": "--level", "batches": "--batch",
         "patterns": "--patterns", "only": "--only", "skip": "--skip", "rule": "--rule"}


def _threads(value: str) -> int:
    """--threads N or auto (one per physical core, what onnxruntime uses by default), as the number used."""
    from .validate.runtime import resolve_threads

    return resolve_threads(value, "--threads")


ThreadsOpt = Annotated[str, typer.Option("--threads", help="onnxruntime intra-op threads: a count, or auto "
                                         "(onnxruntime's default: one per physical core); reported.")]


def _target(value: str, option: str = "target") -> str:
    return check_choice(option, value, ("cpu", "cuda"))


@app.command()
def optimize(
    ctx: typer.Context,
    paths: Annotated[list[str], typer.Argument(metavar="PATHS", help="IN OUT: the model (.onnx) and "
                                               "where to write it (an existing folder OUT: OUT/<IN's file name>); or IN... OUTDIR: several models and/or folders "
                                               "of models (their *.onnx) and an output folder.")],
    patterns: PatternsOpt = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Apply only this rule id (repeatable).")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Never apply this rule id (repeatable).")] = None,
    target: TargetOpt = "cpu",
    no_builtin: Annotated[bool, typer.Option("--no-builtin", help="Use only the --patterns files.")] = False,
    no_validate: Annotated[bool, typer.Option("--no-validate", help="Skip the onnxruntime check.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would change; write nothing.")] = False,
    shape: Annotated[list[str] | None, typer.Option("--shape", help="Input shape name:1x3x224x224, or a "
                                                    "symbolic dim batch=4 (repeatable).")] = None,
    inputs: Annotated[str | None, typer.Option("--inputs", help="Validation inputs from an .npz file.")] = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable): validated on each, measured on "
                                                      "their weighted total.")] = None,
    rtol: Annotated[float | None, typer.Option("--rtol", help="Relative tolerance (default by dtype).")] = None,
    atol: Annotated[float | None, typer.Option("--atol", help="Absolute tolerance (default by dtype).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Allow OUTPUT to be the input file.")] = False,
    static: Annotated[bool, typer.Option("--static", help="Fix the dynamic input dims to the --shape values "
                                         "first (the output then accepts only those shapes).")] = False,
    pad_channels: Annotated[bool, typer.Option("--pad-channels", help="Pad Conv channels to a multiple of 8 with "
                                               "zero weights (exact); kept only where measured faster.")] = False,
    no_fold: Annotated[bool, typer.Option("--no-fold", help="Do not fold constants or inline If nodes whose "
                                          "condition is constant.")] = False,
    no_measure: Annotated[bool, typer.Option("--no-measure", help="Keep every validated rewrite without timing "
                                             "them (default: time groups of rewrites, keep only those that help).")]
    = False,
    threads: Annotated[str, typer.Option("--threads", help="onnxruntime intra-op threads while measuring: a count, "
                                         "or auto (onnxruntime's default: one per physical core). Decisions hold "
                                         "for this count; the report, JSON, HTML and decision cache name it.")] = "1",
    measure_budget: Annotated[float | None, typer.Option("--measure-budget", help="Seconds for the whole "
                                                         "measuring phase (default: automatic, 4-10 s, keeping "
                                                         "optimize near 12 s; more past 1 GiB of weights; with "
                                                         "--measure-by model, seconds per round, default 2).")]
    = None,
    measure_by: Annotated[str, typer.Option("--measure-by", help="regions: time each class of alike regions "
                                            "alone, then confirm on the whole model; model: rounds of "
                                            "whole-model variants.")] = "regions",
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither reuse nor record measured decisions "
                                           "(the decision cache: onnxfuse cache show).")] = False,
    bench_after: Annotated[bool, typer.Option("--bench", help="Benchmark the input against the output "
                                              "afterwards (interleaved, same options).")] = False,
    html: Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report (implies "
                                             "--bench; adds the op-time profile of both models).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Several models: worker processes that "
                                             "rewrite and validate side by side (default: min(4, CPUs)); "
                                             "measuring stays one model at a time.")] = None,
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Input folders: also the models in "
                                            "their subfolders.")] = False,
) -> None:
    """Apply fusion patterns to a fixed point, validate with onnxruntime, write OUT atomically. With several
    models (or a folder), write each into the folder OUT under its own file name."""
    from . import OptimizeOptions
    from . import optimize as run_optimize

    opts = OptimizeOptions(patterns=patterns or [], only=only or [], skip=skip or [], builtin=not no_builtin,
                           target=_target(target), validate=not no_validate, shapes=shape or [],
                           inputs_npz=inputs, rtol=rtol, atol=atol, force=force, dry_run=dry_run,
                           measure=not no_measure, fold=not no_fold, pad_channels=pad_channels, static=static,
                           measure_threads=_threads(threads), measure_budget_s=measure_budget, profiles=profile or [],
                           measure_by=measure_by, cache=not no_cache).check()
    if jobs is not None:
        check_count("jobs", jobs)
    if (bench_after or html) and dry_run:
        raise OnnxfuseError("--bench/--html need the written output; drop --dry-run")
    if len(paths) < 2:
        raise UsageError("Missing argument 'OUT': onnxfuse optimize IN OUT, or IN... OUTDIR", ctx)
    inputs, output = paths[:-1], paths[-1]
    if len(inputs) > 1 or os.path.isdir(inputs[0]):
        _optimize_batch(inputs, output, opts, jobs, recursive, bench_after, html, as_json)
        return
    input = inputs[0]
    from .progress import status_line

    if os.path.isdir(output):  # an existing folder: the output is OUT/<input's file name>
        output = os.path.join(output, os.path.basename(input))
    # shared: never beside a process that is timing; measuring takes it exclusive
    with status_line(not as_json) as progress, busy_lock() as waited:
        result = run_optimize(input, output, opts, progress=progress)
    if waited > REPORT_WAIT_S:
        result.timings[WAIT_KEY] = result.timings.get(WAIT_KEY, 0.0) + waited
    _report_optimize(result, input, output, opts, bench_after or bool(html), html, as_json)


def _report_optimize(result, input: str, output: str, opts, bench_after: bool, html: str | None,
                     as_json: bool) -> None:
    """Print the result (text or JSON), after benchmarking and profiling input against output if asked."""
    bench_res, profiles = None, None
    if bench_after:
        from . import bench as run_bench

        with _bench_status(not as_json, 5.0) as progress, timing_lock():
            bench_res = run_bench([input, output], ["input", "output"], provider=opts.target,
                                  threads=opts.measure_threads, shapes=opts.shapes or None,
                                  inputs_npz=opts.inputs_npz, profiles=opts.profiles or None, progress=progress)
    if html:
        from . import profile as run_profile
        from .inspect.html_report import render, write

        with _profile_status(not as_json) as progress:
            profiles = [run_profile(p, opts.target, opts.measure_threads, shapes=opts.shapes or None,
                                    inputs_npz=opts.inputs_npz, progress=progress(label))
                        for label, p in (("input", input), ("output", output))]
        write(html, render(f"onnxfuse optimize: {input}", bench=bench_res, profiles=profiles,
                           labels=["input", "output"], result=result))
    if as_json:
        data = result.to_json()
        if bench_res is not None:
            data["bench"] = bench_res.to_json()
        if profiles:
            data["profile"] = [p.to_json() for p in profiles]
        print(json.dumps(data, indent=2, default=str))
    else:
        from .inspect.report import print_bench, print_result

        print_result(result, out)
        if bench_res is not None:
            print_bench(bench_res, out)


def _optimize_batch(inputs: list[str], out_dir: str, opts, jobs: int | None, recursive: bool, bench_after: bool,
                    html: str | None, as_json: bool) -> None:
    """Several models (or folders) into the folder OUT_DIR: one line per model as it finishes, then a total;
    with --json, the list of per-model results. Exit code 1 if any model failed."""
    import time

    from .batch import collect, default_jobs, optimize_many

    if html:
        raise OnnxfuseError("--html writes the report of one model; with several models use --bench, or --html "
                            "on each model alone")
    items = collect(inputs, out_dir, recursive)
    n_jobs = min(jobs or default_jobs(), len(items))
    t0 = time.perf_counter()

    finished: list[dict] = []

    def show(d: dict) -> None:
        finished.append(d)
        if d["error"]:
            print(f"onnxfuse: error: {_failure_line(d)}", file=sys.stderr, flush=True)
        elif not as_json:
            print(_batch_line(d), flush=True)

    try:
        results = optimize_many(items, opts, n_jobs, show)
    except KeyboardInterrupt:
        print(f"onnxfuse: interrupted after {len(finished)} of {len(items)} model(s); the models finished by then "
              "are written, nothing partial", file=sys.stderr)
        raise _BatchInterrupted() from None
    if bench_after:
        _bench_batch(results, opts, as_json)
    failed = [d for d in results if d["error"]]
    if as_json:
        print(json.dumps(results, indent=2, default=str))
    else:
        done = "checked (dry run: nothing written)" if opts.dry_run else f"written to {out_dir}"
        print(f"{len(results)} model(s): {len(results) - len(failed)} {done}, {len(failed)} failed"
              + (f" ({', '.join(os.path.basename(d['input']) for d in failed)})" if failed else "")
              + f"; {time.perf_counter() - t0:.1f} s with --jobs {n_jobs}")
    if failed:
        raise typer.Exit(1)


class _BatchInterrupted(Exception):
    """Ctrl-C during a batch, already reported (with what was written before it)."""


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
    parts.append(f"{d['seconds']:.1f} s")
    where = d["output"] or "(dry run)"
    return f"{d['input']} -> {where}: " + ", ".join(parts)


def _bench_batch(results: list[dict], opts, as_json: bool) -> None:
    """--bench with several models: each written output against its input, one model at a time, afterwards."""
    from . import bench as run_bench

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


@app.command()
def explain(
    model: Annotated[str, typer.Argument(help="Model to inspect.")],
    rule: Annotated[str | None, typer.Option("--rule", "-r", help="Only this rule (shows every attempt).")] = None,
    patterns: PatternsOpt = None,
    target: TargetOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
) -> None:
    """Why fusions did not happen: the near misses of every rule, with the node and constraint that failed."""
    from . import explain as run_explain

    ex = run_explain(model, patterns or [], _target(target), rule)
    if as_json:
        print(json.dumps(ex.to_json(), indent=2))
        return
    from .inspect.report import print_near_misses

    if ex.fired:
        out.print("would fire: " + ", ".join(f"{k} x{v}" for k, v in sorted(ex.fired.items())))
    for s in ex.skipped:
        if rule is not None and s.rule != rule:
            continue
        out.print(f"[dim]rule {s.rule} not used for {target}: {s.reason}[/dim]")
    print_near_misses(ex.near_misses, out)
    if ex.misaligned:
        worst = sorted(ex.misaligned, key=lambda m: -m.waste)
        out.print(f"alignment: {len(worst)} conv/matmul dims are not a multiple of {ex.vector_width} (fp32 lanes on "
                  f"{target}); lanes idle on them: " + ", ".join(
                      f"{m.node} {m.dim} {m.value} ({m.waste * 100:.0f}%)" for m in worst[:8])
                  + (" ..." if len(worst) > 8 else ""))


BenchShape = Annotated[list[str] | None, typer.Option("--shape", help="Input shape name:1x3x224x224 or dim=4.")]


@contextlib.contextmanager
def _bench_status(enabled: bool, budget_s: float):
    """bench's `progress(what, fraction)` on the status line (progress.py): the step, how far, the budget."""
    from .progress import status_line

    with status_line(enabled) as show:
        yield lambda what, f: show(f"bench: {what} ({f:.0%})", budget_s)


@contextlib.contextmanager
def _profile_status(enabled: bool):
    """profile's phases on the status line, per model: `progress(label)` is the callback for that model."""
    from .progress import status_line

    with status_line(enabled) as show:
        yield lambda label: lambda phase, budget_s=None: show(f"profile {label}: {phase}", budget_s)


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
    provider: Annotated[str, typer.Option("--provider", help="cpu or cuda.")] = "cpu",
    threads: ThreadsOpt = "1",
    level: Annotated[str, typer.Option("--level", help="ORT optimization level: disable|basic|extended|all.")]
    = "all",
    shape: BenchShape = None,
    inputs: Annotated[str | None, typer.Option("--inputs", help="Inputs from an .npz file.")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Minimum timed runs per model.")] = 50,
    budget: Annotated[float, typer.Option("--budget", help="Seconds of interleaved timing.")] = 5.0,
    batch: Annotated[str | None, typer.Option("--batch", help="Batch sweep, e.g. 1,2,4,8,16.")] = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable): each timed (default for a decoder "
                                                      "with a KV cache: prefill and decode).")] = None,
    html: Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (docs/json.md).")] = False,
) -> None:
    """Latency of A (and B, interleaved): median, p90, p99, min, spread, speedup with a 95% CI and a verdict;
    a decoder with a KV cache at prefill and at decode."""
    from . import bench as run_bench

    paths = [a] + ([b] if b else [])
    for p in paths:
        if not os.path.isfile(p):
            raise OnnxfuseError(f"{p}: no such file")
    with _bench_status(not as_json, budget) as progress, timing_lock():  # side by side, timings lie
        res = run_bench(paths, provider=_target(provider, "provider"), threads=_threads(threads), level=level, shapes=shape,
                        inputs_npz=inputs, min_runs=runs, budget_s=budget, batches=_batches(batch),
                        profiles=profile or None, progress=progress)
    if html:
        from .inspect.html_report import render, write

        write(html, render(f"onnxfuse bench: {' vs '.join(paths)}", bench=res))
    if as_json:
        print(json.dumps(res.to_json(), indent=2))
    else:
        from .inspect.report import print_bench

        print_bench(res, out)


@app.command()
def profile(
    a: Annotated[str, typer.Argument(help="Model to profile.")],
    b: Annotated[str | None, typer.Argument(help="A second model (e.g. the optimized one), side by side.")] = None,
    provider: Annotated[str, typer.Option("--provider", help="cpu or cuda.")] = "cpu",
    threads: ThreadsOpt = "1",
    level: Annotated[str, typer.Option("--level", help="ORT optimization level: disable|basic|extended|all.")]
    = "all",
    shape: BenchShape = None,
    inputs: Annotated[str | None, typer.Option("--inputs", help="Inputs from an .npz file.")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Profiled runs (after 10 warm-up runs).")] = 30,
    nodes: Annotated[bool, typer.Option("--nodes", help="Also list the slowest nodes.")] = False,
    batch: Annotated[str | None, typer.Option("--batch", help="Batch sizes for the utilization signal, e.g. 1,8.")]
    = None,
    html: Annotated[str | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (docs/json.md).")] = False,
) -> None:
    """Op-time table (onnxruntime profiler), bytes and FLOPs per op, utilization against measured peaks, and
    the memory-bound signals."""
    from . import profile as run_profile

    paths = [a] + ([b] if b else [])
    labels = ["A", "B"][: len(paths)]
    for p in paths:
        if not os.path.isfile(p):
            raise OnnxfuseError(f"{p}: no such file")
    sizes = _batches(batch)
    n_threads = _threads(threads)
    results = []
    with _profile_status(not as_json) as progress:
        for label, p in zip(labels, paths, strict=True):
            results.append(run_profile(p, _target(provider, "provider"), n_threads, level, runs, shapes=shape,
                                       inputs_npz=inputs, batches=sizes, progress=progress(label)))
    if html:
        from .inspect.html_report import render, write

        write(html, render(f"onnxfuse profile: {' vs '.join(paths)}", profiles=results, labels=labels))
    if as_json:
        print(json.dumps({"schema": "onnxfuse.profile/1", "models": [r.to_json() for r in results]}, indent=2))
    else:
        from .inspect.report import print_profile

        print_profile(results, labels, out, nodes)


@patterns_app.command("list")
def patterns_list(patterns: PatternsOpt = None,
                  no_builtin: Annotated[bool, typer.Option("--no-builtin", help="Only the --patterns files.")]
                  = False,
                  target: Annotated[str | None, typer.Option("--target", "-t", help="Say for each rule whether it "
                                                             "is used on this target (cpu or cuda), and why not.")]
                  = None) -> None:
    """All rules, in the order they are tried (bigger matches first)."""
    from . import load_rules, rules_in_order
    from .inspect.report import print_rule_usage, print_rules

    rules = rules_in_order(load_rules(patterns or [], not no_builtin))
    if target is None:
        print_rules(rules, out)
    else:
        print_rule_usage(rules, _target(target), out)


@patterns_app.command("show")
def patterns_show(rule_id: Annotated[str, typer.Argument(help="Rule id.")], patterns: PatternsOpt = None) -> None:
    """Print one rule's source text and where it comes from."""
    from . import load_rules

    rules = {r.id: r for r in load_rules(patterns or [])}
    if rule_id not in rules:
        from .rewrite.fold import CLEANUP_STEPS

        if rule_id in CLEANUP_STEPS:
            raise OnnxfuseError(f"{rule_id!r} is an exact cleanup step, not a rule",
                                hint="docs/commands.md lists the cleanup steps; --no-fold turns them off")
        raise OnnxfuseError(f"no rule with id {rule_id!r}", hint="see `onnxfuse patterns list`")
    r = rules[rule_id]
    out.print(f"# {r.file}:{r.span.line}  size={r.size} targets={','.join(r.targets)}")
    print(_rule_source(r.file, r.span.line))


def _rule_source(path: str, line: int) -> str:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = line - 1
    while start > 0 and not lines[start].lstrip().startswith("- id:"):
        start -= 1
    end = start + 1
    while end < len(lines) and not lines[end].lstrip().startswith("- id:"):
        end += 1
    return "\n".join(lines[start:end]).rstrip()


@patterns_app.command("check")
def patterns_check(files: Annotated[list[str], typer.Argument(help="Pattern files or folders.")]) -> None:
    """Validate pattern files; print every problem as file:line:col: error: ..., and as warnings the rules that
    can never be used (no kernel on any of their targets) or whose id is a built-in rule's."""
    from . import PatternError, load_rules
    from .rewrite.ruleset import rule_warnings

    problems = 0
    for f in files:
        if not os.path.exists(f):
            raise OnnxfuseError(f"{f}: no such pattern file or folder")
        try:
            rules = load_rules([f], builtin=False)
            warnings = rule_warnings(rules)
            for w in warnings:
                print(w, file=sys.stderr)
            out.print(f"{f}: {len(rules)} rules, {len(warnings)} warning(s)" if warnings else
                      f"{f}: ok ({len(rules)} rules)")
        except PatternError as e:
            diags = getattr(e, "diagnostics", None) or [e.message]
            for d in diags:
                print(str(d), file=sys.stderr)
            problems += len(diags)
    if problems:
        raise typer.Exit(1)


@patterns_app.command("test")
def patterns_test(files: Annotated[list[str] | None, typer.Argument(help="Pattern files (default: built-in).")]
                  = None, rule: Annotated[str | None, typer.Option("--rule", "-r", help="Only this rule id.")] = None
                  ) -> None:
    """Self-test rules: build a model per alternative and operand order, check the rule fires once with equal
    onnxruntime outputs, and that mutants (constant off, extra consumer, wrong dtype) do not fire."""
    from . import load_rules, self_test

    rules = load_rules(files or [], builtin=not files)
    if rule:
        rules = [r for r in rules if r.id == rule]
        if not rules:
            raise OnnxfuseError(f"no rule with id {rule!r}")
    from rich.markup import escape

    colour = {"ok": "green", "FAIL": "red"}
    counts: dict[str, int] = {}
    for report in self_test(rules):
        status = report.status
        counts[status] = counts.get(status, 0) + 1
        out.print(f"[{colour.get(status, 'yellow')}]{status}[/] {report.rule}: {escape(report.summary)}")
        for problem in report.problems:
            out.print(f"    {escape(problem)}")
    out.print(f"{len(rules)} rule(s): " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "not validated here",
                                                                                        "FAIL")))
    if counts.get("FAIL"):
        raise typer.Exit(1)


@patterns_app.command("schema")
def patterns_schema() -> None:
    """Print the JSON Schema of pattern files (for editor completion)."""
    from . import pattern_schema

    sys.stdout.write(pattern_schema())


@app.command("inputs")
def inputs_cmd(
    model: Annotated[str, typer.Argument(help="Model to inspect.")],
    shape: BenchShape = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="A named shape profile NAME:DIM=V,..."
                                                      "[@WEIGHT] (repeatable), as optimize takes it (default for a "
                                                      "decoder with a KV cache: prefill and decode).")] = None,
    target: TargetOpt = "cpu",
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Do not run the model; print the first "
                                           "candidate within the memory budget.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the inputs as JSON (docs/json.md).")] = False,
) -> None:
    """The input shapes optimize would use when none are given, and why (read from the model, probed on it):
    one set per shape profile (a decoder with a KV cache: prefill and decode)."""
    from . import find_profiles
    from .inspect.report import print_inputs

    found = find_profiles(model, shape or [], None, _target(target), probe=not no_probe, profiles=profile or [])
    if as_json:
        print(json.dumps({"schema": "onnxfuse.inputs/1", **found[0][2].to_json(),
                          "profiles": [{"name": n, "weight": w, "inputs": p.to_json()} for n, w, p in found]},
                         indent=2))
        return
    for name, weight, plan in found:
        if len(found) > 1 or name != "default":
            out.print(f"{name} profile (weight {weight:g}):", markup=False)
        print_inputs(plan, out)


@cache_app.command("show")
def cache_show(as_json: Annotated[bool, typer.Option("--json", help="Print every decision as JSON.")] = False,
               ) -> None:
    """Where the decision cache is and what it holds (region decisions, whole-model confirmations)."""
    from .select.decision_cache import DecisionCache

    summary = DecisionCache().summary()
    if as_json:
        print(json.dumps({"schema": "onnxfuse.cache/1", **summary}, indent=2))
        return
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(summary["by_kind"].items())) or "empty"
    print(f"{summary['path']}: {summary['decisions']} decision(s) ({kinds}), {summary['bytes']} bytes")
    for key, d in sorted(summary["entries"].items(), key=lambda kv: kv[1].get("when", "")):
        print("  " + _cache_line(key, d))


def _cache_line(key: str, d: dict) -> str:
    """One decision: date, kind, the model it was taken on, threads, rules, what was decided and how."""
    kind, rules = d.get("kind", "?"), ", ".join(d.get("rules", [])) or "-"
    model = d.get("model") or "(model not recorded)"
    threads = f"{d['threads']} thread(s)" if d.get("threads") is not None else "threads not recorded"

    def ratio(r) -> str:
        return f"ratio {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"

    if kind == "region":
        what = f"region {d.get('label', '?')}: " + (("kept" if d.get("keep") else "left as the original")
                                                   + (f", {ratio(d['ratio'])}" if d.get("ratio") else
                                                      f", budget ({d.get('budget', 0):g} s) ran out before it"))
    elif kind == "model":
        what = "whole-model confirmation: " + (ratio(d["ratio"]) if d.get("ratio") else
                                               d.get("why") or f"not reached within {d.get('budget', 0):g} s")
    elif kind == "selection":
        rep = d.get("report") or {}
        final = rep.get("final_ratio")
        what = (f"selection: {len(d.get('kept', []))} rewrite(s) kept, {len(d.get('dropped', []))} dropped; "
                f"confirmation {rep.get('confirmed') or 'not recorded'}"
                + (f", {ratio([final['median'], final['low'], final['high']])}" if final else ""))
    else:
        what = kind
    return f"{d.get('when', '?')}  {model}  {threads}  rules {rules}  {what}  ({key[:12]})"


@cache_app.command("clear")
def cache_clear() -> None:
    """Forget every measured decision (the next optimize times everything again)."""
    from .select.decision_cache import DecisionCache

    cache = DecisionCache()
    n = cache.clear()
    print(f"{cache.path}: removed {n} decision(s)")


@app.command()
def version() -> None:
    """Print the version."""
    print(f"onnxfuse {__version__}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line per error, exit code 1 (input problem), 2 (usage), 130 (interrupted)."""
    try:
        rv = app(args=argv, prog_name="onnxfuse", standalone_mode=False)
        if rv == 130:  # typer turned Ctrl-C into an exit code; the atomic writer left nothing behind
            print("onnxfuse: interrupted; nothing written", file=sys.stderr)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except _BatchInterrupted:
        return 130
    except typer.Abort:
        print("onnxfuse: interrupted; nothing written", file=sys.stderr)
        return 130
    except NoArgsIsHelpError as e:
        print(e.format_message() if hasattr(e, "format_message") else str(e))
        return 0
    except UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "onnxfuse"
        print(f"{cmd}: error: {e.format_message()} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except OnnxfuseError as e:
        text = e.for_flags(FLAGS)
        print(text if ": error: " in text else f"onnxfuse: error: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("onnxfuse: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line, with a way to get the traceback
        if os.environ.get("ONNXFUSE_DEBUG"):
            raise
        print(f"onnxfuse: internal error: {type(e).__name__}: {e} (set ONNXFUSE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
