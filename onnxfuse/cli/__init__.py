"""The `onnxfuse` command (typer): thin; parses flags into `OptimizeOptions`, calls the public API, prints with
inspect/report.py. Errors are one line, never a traceback.

- `app.py`: the typer apps, the console and the options commands share.
- `optimize.py` (`optimize`, one model or a batch), `patterns.py` (`explain`, `patterns ...`), `bench.py` (`bench`,
  `profile`), `inputs.py` (`inputs`), `cache.py` (`cache show/clear`): one module per command group.
- `main.py`: `main()`, the entry point (`onnxfuse = onnxfuse.cli:main`; `python -m onnxfuse.cli`): light, it
  installs the signal handling (signals.py) and then imports `commands.py`, which registers every command, and
  whose `run()` maps errors to one line and an exit code.

May import everything: it sits above the pipeline. This `__init__` itself stays light (`app` is imported when
first used), so that the entry point runs before onnx, onnxruntime and numpy load.
"""

from .main import main

__all__ = ["app", "main"]


def __getattr__(name: str):
    if name == "app":
        from .commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
