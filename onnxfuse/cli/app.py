"""The `onnxfuse` command's typer apps, console and the options its commands share (the commands are in the
other modules of cli/, the entry point in main.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from .. import __version__
from ..options import check_target
from ..targets import names

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Make ONNX models faster on onnxruntime with validated YAML fusions.")
patterns_app = typer.Typer(no_args_is_help=True, help="List, show, check and self-test fusion patterns.")
app.add_typer(patterns_app, name="patterns")
cache_app = typer.Typer(no_args_is_help=True, help="Show or clear the measured-decision cache.")
app.add_typer(cache_app, name="cache")

out = Console(highlight=False)
PIPED_WIDTH = 10_000  # output that is not a terminal is not wrapped (a line stays one line for grep)


def fit_output() -> None:
    """Set the console's width for this command: $COLUMNS where it is set, else the terminal's width on a
    terminal, else (piped, redirected) wide enough that no line is wrapped and no table cell is cut."""
    columns = os.environ.get("COLUMNS", "")
    out.width = int(columns) if columns.isdigit() and int(columns) > 0 else (
        None if sys.stdout.isatty() else PIPED_WIDTH)  # type: ignore[assignment]


def _print_version(value: bool) -> None:
    if value:
        print(f"onnxfuse {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Make ONNX models faster on onnxruntime with validated YAML fusions."""

# What --help shows for a value (typer's default is the Python type: `--only <list[str]>`, `{model}`): by
# parameter name, one table for every command; other parameters show their name in capitals.
METAVARS = {"patterns": "FILE", "only": "RULE_ID", "skip": "RULE_ID", "rule": "RULE_ID", "rule_id": "RULE_ID",
            "target": "|".join(names()), "provider": "|".join(names()), "shape": "NAME:1x3x224x224|DIM=V", "inputs": "X.npz",
            "profile": "NAME:DIM=V,...[@WEIGHT]", "rtol": "R", "atol": "A", "threads": "N|auto",
            "measure_budget": "SECONDS", "budget": "SECONDS", "html": "FILE",
            "jobs": "N", "runs": "N", "level": "all|extended|basic|disable", "batch": "1,2,4,...|N",
            "paths": "IN... OUT", "files": "FILE...", "a": "A.onnx", "b": "B.onnx"}


def _human_metavars() -> None:
    """typer's help draws each value from its Python type; here from METAVARS (or the name in capitals), and a
    required argument without typer's braces (`explain MODEL`, not `explain {model}`)."""
    from typer import core

    def metavar(param) -> str:
        return param.metavar or METAVARS.get(param.name or "", (param.name or "").upper())

    if hasattr(core.TyperOption, "display_type_rich"):
        plain = core.TyperOption.display_type_rich
        core.TyperOption.display_type_rich = lambda self, ctx: None if plain(self, ctx) is None else metavar(self)
    if hasattr(core.TyperArgument, "_usage_display_name"):
        def usage(self) -> str:
            name, many = metavar(self), self.nargs != 1 and "..." not in metavar(self)
            return (name if self.required else f"[{name}]") + ("..." if many else "")

        core.TyperArgument._usage_display_name = usage
        core.TyperArgument._rich_display_name = lambda self: metavar(self)
        core.TyperArgument.display_type_rich = lambda self, ctx: None
        core.TyperArgument.get_error_hint = lambda self, ctx=None: f"'{metavar(self)}'"  # "Missing argument 'MODEL'"


_human_metavars()

PatternsOpt = Annotated[list[str] | None, typer.Option("--patterns", "-p", help="Extra pattern file or folder "
                                                       "(repeatable).")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help=f"The execution provider the output is for: {', '.join(names())} (docs/targets.md).")]


# API option names (OnnxfuseError.option) -> the flags that set them: a CLI error names the flag
FLAGS = {"target": "--target", "provider": "--provider", "measure_threads": "--threads", "threads": "--threads",
         "measure_budget_s": "--measure-budget", "budget_s": "--budget", "min_runs": "--runs", "runs": "--runs",
         "rtol": "--rtol", "atol": "--atol", "jobs": "--jobs", "shapes": "--shape",
         "profiles": "--profile", "inputs_npz": "--inputs", "level": "--level", "batches": "--batch",
         "patterns": "--patterns", "only": "--only", "skip": "--skip", "rule": "--rule", "html": "--html"}


def parse_threads(value: str) -> int:
    """--threads N or auto (one per physical core, what onnxruntime uses by default), as the number used."""
    from ..validate.runtime import resolve_threads

    return resolve_threads(value, "--threads")


ThreadsOpt = Annotated[str, typer.Option("--threads", help="onnxruntime intra-op threads: a count, or auto "
                                         "(onnxruntime's default: one per physical core); reported.")]


def parse_target(value: str, option: str = "target") -> str:
    return check_target(option, value)


BenchShape = Annotated[list[str] | None, typer.Option("--shape", help="Input shape name:1x3x224x224 or dim=4.")]
ProviderOpt = Annotated[str, typer.Option("--provider", help=f"Execution provider: {', '.join(names())}.")]
LevelOpt = Annotated[str, typer.Option("--level", help="ORT optimization level: disable|basic|extended|all.")]
InputsOpt = Annotated[str | None, typer.Option("--inputs", help="Inputs from an .npz file.")]


@contextlib.contextmanager
def bench_status(enabled: bool, budget_s: float):
    """bench's `progress(what, fraction)` on the status line (progress.py): the step, how far, the budget."""
    from ..progress import status_line

    with status_line(enabled) as show:
        yield lambda what, f: show(f"bench: {what} ({f:.0%})", budget_s)


@contextlib.contextmanager
def profile_status(enabled: bool):
    """profile's phases on the status line, per model: `progress(label)` is the callback for that model."""
    from ..progress import status_line

    with status_line(enabled) as show:
        yield lambda label: lambda phase, budget_s=None: show(f"profile {label}: {phase}", budget_s)
