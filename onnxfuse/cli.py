"""The `onnxfuse` command: thin; parses flags, calls the API, prints. Errors are one line, never a traceback."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .errors import OnnxfuseError

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Make ONNX models faster on onnxruntime with validated YAML fusions.")
patterns_app = typer.Typer(no_args_is_help=True, help="List, show, check and self-test fusion patterns.")
app.add_typer(patterns_app, name="patterns")

out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

PatternsOpt = Annotated[list[str] | None, typer.Option("--patterns", "-p", help="Extra pattern file or folder "
                                                       "(repeatable).")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Execution provider: cpu or cuda.")]


def _target(value: str) -> str:
    if value not in ("cpu", "cuda"):
        raise OnnxfuseError(f"--target {value}: unknown target", hint="use cpu or cuda")
    return value


@app.command()
def optimize(
    input: Annotated[str, typer.Argument(help="Model to optimize (.onnx).")],
    output: Annotated[str, typer.Argument(help="Where to write the optimized model.")],
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
    rtol: Annotated[float | None, typer.Option("--rtol", help="Relative tolerance (default by dtype).")] = None,
    atol: Annotated[float | None, typer.Option("--atol", help="Absolute tolerance (default by dtype).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Allow OUTPUT to be the input file.")] = False,
    no_measure: Annotated[bool, typer.Option("--no-measure", help="Keep every validated rewrite without timing "
                                             "them (default: time groups of rewrites, keep only those that help).")]
    = False,
    threads: Annotated[int, typer.Option("--threads", help="onnxruntime intra-op threads for --measure.")] = 1,
    measure_budget: Annotated[float, typer.Option("--measure-budget", help="Seconds of timing per measuring "
                                                  "round.")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Apply fusion patterns to a fixed point, validate with onnxruntime, write OUTPUT atomically."""
    from .api import OptimizeOptions
    from .api import optimize as run_optimize

    opts = OptimizeOptions(patterns=patterns or [], only=only or [], skip=skip or [], builtin=not no_builtin,
                           target=_target(target), validate=not no_validate, shapes=shape or [],
                           inputs_npz=inputs, rtol=rtol, atol=atol, force=force, dry_run=dry_run,
                           measure=not no_measure, measure_threads=threads, measure_budget_s=measure_budget)
    if threads < 1 or measure_budget <= 0:
        raise OnnxfuseError("--threads must be >= 1 and --measure-budget > 0")
    result = run_optimize(input, output, opts)
    if as_json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    else:
        from .report import print_result

        print_result(result, out)


@app.command()
def explain(
    model: Annotated[str, typer.Argument(help="Model to inspect.")],
    rule: Annotated[str | None, typer.Option("--rule", "-r", help="Only this rule (shows every attempt).")] = None,
    patterns: PatternsOpt = None,
    target: TargetOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Why fusions did not happen: the near misses of every rule, with the node and constraint that failed."""
    from .api import explain as run_explain

    ex = run_explain(model, patterns or [], _target(target), rule)
    if as_json:
        print(json.dumps({"fired": ex.fired, "near_misses": [m.__dict__ for m in ex.near_misses],
                          "skipped_rules": [s.__dict__ for s in ex.skipped]}, indent=2))
        return
    from .report import print_near_misses

    if ex.fired:
        out.print("would fire: " + ", ".join(f"{k} x{v}" for k, v in sorted(ex.fired.items())))
    for s in ex.skipped:
        if rule is not None and s.rule != rule:
            continue
        out.print(f"[dim]rule {s.rule} not used for {target}: {s.reason}[/dim]")
    print_near_misses(ex.near_misses, out)


@patterns_app.command("list")
def patterns_list(patterns: PatternsOpt = None,
                  no_builtin: Annotated[bool, typer.Option("--no-builtin")] = False) -> None:
    """All rules, in the order they are tried (bigger matches first)."""
    from .api import load_rules
    from .report import print_rules
    from .rewrite.engine import order_rules

    print_rules(order_rules(load_rules(patterns or [], not no_builtin)), out)


@patterns_app.command("show")
def patterns_show(rule_id: Annotated[str, typer.Argument(help="Rule id.")], patterns: PatternsOpt = None) -> None:
    """Print one rule's source text and where it comes from."""
    from .api import load_rules

    rules = {r.id: r for r in load_rules(patterns or [])}
    if rule_id not in rules:
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
    """Validate pattern files; print every problem as file:line:col: error: ..."""
    from .errors import PatternError
    from .patterns.parser import load_path

    problems = 0
    for f in files:
        if not os.path.exists(f):
            raise OnnxfuseError(f"{f}: no such pattern file or folder")
        try:
            rules = load_path(f)
            out.print(f"{f}: ok ({len(rules)} rules)")
        except PatternError as e:
            diags = getattr(e, "diagnostics", None) or [e.message]
            for d in diags:
                print(str(d), file=sys.stderr)
            problems += len(diags)
    if problems:
        raise typer.Exit(1)


@patterns_app.command("test")
def patterns_test(files: Annotated[list[str] | None, typer.Argument(help="Pattern files (default: built-in).")]
                  = None, rule: Annotated[str | None, typer.Option("--rule", "-r")] = None) -> None:
    """Self-test rules: build a model per alternative and operand order, check the rule fires once with equal
    onnxruntime outputs, and that mutants (constant off, extra consumer, wrong dtype) do not fire."""
    from .api import builtin_patterns_dir
    from .patterns.parser import load_path
    from .selftest import check_rules

    rules = [r for f in (files or [builtin_patterns_dir()]) for r in load_path(f)]
    if rule:
        rules = [r for r in rules if r.id == rule]
        if not rules:
            raise OnnxfuseError(f"no rule with id {rule!r}")
    failures = 0
    for report in check_rules(rules):
        status = "[green]ok[/green]" if report.ok else "[red]FAIL[/red]"
        out.print(f"{status} {report.rule}: {report.summary}")
        for problem in report.problems:
            out.print(f"    {problem}")
        failures += not report.ok
    if failures:
        raise typer.Exit(1)


@patterns_app.command("schema")
def patterns_schema() -> None:
    """Print the JSON Schema of pattern files (for editor completion)."""
    from .patterns.spec import json_schema_text

    sys.stdout.write(json_schema_text())


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
        text = str(e)
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
