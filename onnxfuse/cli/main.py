"""The process entry point, `onnxfuse.cli:main` (the console script, `python -m onnxfuse.cli`): light, so that
Ctrl-C or SIGTERM during the second or so the heavy imports take (typer, onnx, onnxruntime, numpy: commands.py
and everything it loads) still ends in one line and exit code 130 or 143, never a traceback. The signal handling
(signals.handled()) is installed before those imports; the package's `__init__` imports nothing heavy until a
public name is used."""

from __future__ import annotations

import sys

from .. import signals


def main(argv: list[str] | None = None) -> int:
    """Run the onnxfuse command line; returns the exit code (commands.run says which)."""
    with signals.handled():
        try:
            from .commands import run  # the heavy imports
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before any command ran: nothing was written
            print(signals.message(e), file=sys.stderr)
            return signals.exit_code(e)
        return run(argv)
