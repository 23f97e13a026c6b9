"""Every command registered, then `run()`: one line per error, never a traceback. Imported by the entry point
(main.py) once its signal handling is in place; this is where typer, onnx, onnxruntime and numpy load."""

from __future__ import annotations

import errno
import importlib
import os
import sys

import typer
from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError  # typer vendors click

from .. import __version__, signals
from ..errors import OnnxfuseError, write_error
from ..words import close_matches
from .app import FLAGS, app, fit_output
from .optimize import BatchInterrupted

# the commands register on the apps as their modules are imported, in the order `--help` lists them
for _name in ("optimize", "patterns", "bench", "inputs", "cache"):
    importlib.import_module(f"{__package__}.{_name}")


@app.command()
def version() -> None:
    """Print the version."""
    print(f"onnxfuse {__version__}")


def run(argv: list[str] | None = None) -> int:
    """The commands (main.py's `main` is the process entry point and calls this): one line per error, exit
    code 1 (input problem), 2 (usage), 130 (interrupted: Ctrl-C), 143 (terminated: SIGTERM, under
    signals.handled())."""
    fit_output()
    try:
        rv = app(args=argv, prog_name="onnxfuse", standalone_mode=False)
        if rv == 130:  # typer turned Ctrl-C (or SIGTERM) into an exit code; the atomic writer left nothing behind
            print(signals.message(), file=sys.stderr)
            return signals.exit_code()
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except BatchInterrupted:  # its line is printed already
        return signals.exit_code()
    except typer.Abort:
        print(signals.message(), file=sys.stderr)
        return signals.exit_code()
    except NoArgsIsHelpError as e:
        print(e.format_message() if hasattr(e, "format_message") else str(e))
        return 0
    except UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "onnxfuse"
        print(f"{cmd}: error: {_usage_message(e)} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except OnnxfuseError as e:
        text = e.for_flags(FLAGS)
        print(text if ": error: " in text else f"onnxfuse: error: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(signals.message(e), file=sys.stderr)
        return signals.exit_code(e)
    except Exception as e:  # a bug: still one line, with a way to get the traceback
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # a full disk is not a bug: say where
            print(f"onnxfuse: error: {_no_space(e)}", file=sys.stderr)
            return 1
        if os.environ.get("ONNXFUSE_DEBUG"):
            raise
        print(f"onnxfuse: internal error: {type(e).__name__}: {e} (set ONNXFUSE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 70


def _usage_message(e: UsageError) -> str:
    """click's message, an unknown option's suggestions made ours: only the command's options close to it
    (words.close_matches on the names without their dashes: `--fast` is not `--atol`), else none."""
    if not isinstance(e, NoSuchOption) or e.ctx is None:
        return e.format_message()
    names = {o.lstrip("-"): o for p in e.ctx.command.params if p.param_type_name == "option"
             for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
    close = [names[n] for n in close_matches(e.option_name.lstrip("-"), names, n=3)]
    return e.message + (f" (did you mean {' or '.join(close)}?)" if close else "")


def _no_space(e: OSError) -> str:
    """ENOSPC that no step turned into its own message (a temporary folder onnxruntime writes into): where."""
    if not e.filename:
        return str(write_error(e, "a temporary file"))
    path = os.path.abspath(os.fsdecode(e.filename))
    return str(write_error(e, path, os.path.dirname(path)))


# importing app.py bound the package's `app` to that module; `onnxfuse.cli.app` is the typer app (cli/__init__.py)
sys.modules[__package__].app = app
