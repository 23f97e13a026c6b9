"""The persistent decision cache: what measured selection decided, keyed by what the decision depends on (the
region's signature, the shapes it ran at, the execution provider, thread count, onnxruntime version and the
processor), so that a second run, or a second model of the same architecture, reuses it instead of timing
again, and writes the same output.

One JSON file, `decisions.json`, in the cache folder: $ONNXFUSE_CACHE_DIR, else $XDG_CACHE_HOME/onnxfuse, else
~/.cache/onnxfuse. Writes merge with what is on disk (another onnxfuse may have written meanwhile) and replace
the file atomically. `onnxfuse cache show` and `onnxfuse cache clear` inspect and empty it; `--no-cache`
neither reads nor writes it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field

__all__ = ["DecisionCache", "cache_dir", "environment_key"]

FORMAT = 1
# How decisions are measured: a change that can change a verdict (protocol 2: several shape profiles count
# relative to the original's time at each; 3: whole-model comparisons run on to about a second, a selection
# measured slower as a whole is dropped) makes earlier decisions miss instead of being reused.
PROTOCOL = 3
FILE = "decisions.json"


def cache_dir() -> str:
    if os.environ.get("ONNXFUSE_CACHE_DIR"):
        return os.environ["ONNXFUSE_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxfuse")


def _processor() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment_key(provider: str, threads: int) -> str:
    """What a timing decision depends on besides the region: provider, threads, onnxruntime, processor."""
    import onnxruntime as ort

    return f"{provider}|{threads}|ort {ort.__version__}|{_processor()}|format {FORMAT}|protocol {PROTOCOL}"


def digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


@dataclass
class DecisionCache:
    """Decisions by key; `enabled` False makes it a cache that never hits and never writes (--no-cache)."""

    enabled: bool = True
    directory: str = field(default_factory=cache_dir)
    entries: dict[str, dict] = field(default_factory=dict)
    new: dict[str, dict] = field(default_factory=dict)
    loaded: bool = False

    @property
    def path(self) -> str:
        return os.path.join(self.directory, FILE)

    def _read(self) -> dict[str, dict]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data.get("decisions", {}) if isinstance(data, dict) and data.get("format") == FORMAT else {}

    def get(self, key: str) -> dict | None:
        if not self.enabled:
            return None
        if not self.loaded:
            self.entries = self._read()
            self.loaded = True
        return self.new.get(key) or self.entries.get(key)

    def put(self, key: str, value: dict) -> None:
        if self.enabled:
            self.new[key] = {**value, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def save(self) -> None:
        """Merge the new decisions into the file on disk; a cache folder that cannot be written is skipped
        (the cache is an optimization: optimize never fails for it)."""
        if not self.enabled or not self.new:
            return
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, exist_ok=True)
            merged = {**self._read(), **self.new}
            fd, tmp = tempfile.mkstemp(prefix=".decisions-", dir=self.directory)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": FORMAT, "decisions": merged}, f, indent=0, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:  # a full disk, Ctrl-C: no partial file left in the cache folder
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self.entries, self.new = merged, {}

    def clear(self) -> int:
        """Remove the cache file; returns how many decisions it held."""
        n = len(self._read())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.entries, self.new = {}, {}
        return n

    def summary(self) -> dict:
        data = self._read()
        kinds: dict[str, int] = {}
        for v in data.values():
            kinds[v.get("kind", "?")] = kinds.get(v.get("kind", "?"), 0) + 1
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        return {"path": self.path, "decisions": len(data), "by_kind": kinds, "bytes": size,
                "entries": data}
