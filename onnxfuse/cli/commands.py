"""Every command registered, then `run()`: one line per error, never a traceback. Imported by the entry point
(main.py) once its signal handling is in place; this is where typer, onnx, onnxruntime and numpy load."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from .. import __version__, signals
from ..errors import OnnxfuseError

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

from .app import FLAGS, app
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
        print(f"{cmd}: error: {e.format_message()} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except OnnxfuseError as e:
        text = e.for_flags(FLAGS)
        print(text if ": error: " in text else f"onnxfuse: error: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(signals.message(e), file=sys.stderr)
        return signals.exit_code(e)
    except Exception as e:  # a bug: still one line, with a way to get the traceback
        if os.environ.get("ONNXFUSE_DEBUG"):
            raise
        print(f"onnxfuse: internal error: {type(e).__name__}: {e} (set ONNXFUSE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 70


# importing app.py bound the package's `app` to that module; `onnxfuse.cli.app` is the typer app (cli/__init__.py)
sys.modules[__package__].app = app
