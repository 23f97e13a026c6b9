"""The `onnxfuse` command (typer): thin; parses flags into `OptimizeOptions`, calls the public API, prints with
inspect/report.py. Errors are one line, never a traceback.

- `app.py`: the typer apps, the console and the options commands share.
- `optimize.py` (`optimize`, one model or a batch), `patterns.py` (`explain`, `patterns ...`), `bench.py` (`bench`,
  `profile`), `inputs.py` (`inputs`), `cache.py` (`cache show/clear`): one module per command group.
- `main.py`: `main()`, the entry point (`onnxfuse = onnxfuse.cli:main`; `python -m onnxfuse.cli`).

May import everything: it sits above the pipeline.
"""

from .main import app, main

__all__ = ["app", "main"]
