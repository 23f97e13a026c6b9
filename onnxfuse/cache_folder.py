"""The cache folder: where the decision cache (select/decision_cache.py) and the timing lock (measure/lock.py)
live: $ONNXFUSE_CACHE_DIR, else $XDG_CACHE_HOME/onnxfuse, else ~/.cache/onnxfuse."""

from __future__ import annotations

import os

__all__ = ["cache_dir"]


def cache_dir() -> str:
    if os.environ.get("ONNXFUSE_CACHE_DIR"):
        return os.environ["ONNXFUSE_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxfuse")
