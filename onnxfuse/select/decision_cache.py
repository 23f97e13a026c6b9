"""The persistent decision cache: what measured selection decided, keyed by what the decision depends on (the
region's signature, the shapes it ran at, the execution provider, thread count, onnxruntime version and the
processor), so that a second run, or a second model of the same architecture, reuses it instead of timing
again, and writes the same output.

One JSON file, `decisions.json`, in the cache folder: $ONNXFUSE_CACHE_DIR, else $XDG_CACHE_HOME/onnxfuse, else
~/.cache/onnxfuse. Writes merge with what is on disk (another onnxfuse may have written meanwhile) and replace
the file atomically. `onnxfuse cache show` and `onnxfuse cache clear` inspect and empty it; `--no-cache`
neither reads nor writes it.

Where the decisions live is a seam (`shared_store`): inside a block that installs a store (an object with
`read() -> {key: decision}` and `merge({key: decision})`), every DecisionCache reads from and merges into it
instead of the file. onnxfuse on Ray (fleet/) installs one backed by an actor, so every node of a fleet sees the
decisions of the others; the driver persists them to its own file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..cache_folder import cache_dir
from ..files import NotRegularFile, TooLarge, read_regular
from .cache_entries import entry_problem

__all__ = ["DecisionCache", "cache_dir", "environment_key", "shared_store"]

FORMAT = 2  # 2: a cached selection's report in its own format (cached_report.py), not --json's
# How decisions are measured: a change that can change a verdict (protocol 2: several shape profiles count
# relative to the original's time at each; 3: whole-model comparisons run on to about a second, a selection
# measured slower as a whole is dropped; 4: decisions on thread CPU time at one thread, runs on while undecided;
# 5: evidence cached, not decisions; the budget on the budget clock) makes earlier decisions miss instead of being
# reused.
PROTOCOL = 5
FILE = "decisions.json"
MAX_BYTES = 256 << 20  # a cache file holding more is ignored (read only up to this bound; a safety bound)
MAX_ENTRIES = 4096  # decisions kept at most: a save drops the oldest past this (about 4 MB)


_store: list = [None]  # the store shared_store installed, if any


@contextlib.contextmanager
def shared_store(store) -> Iterator[None]:
    """For the `with` body, DecisionCaches read from and merge into `store` instead of the cache file."""
    previous, _store[0] = _store[0], store
    try:
        yield
    finally:
        _store[0] = previous


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


def bounded(entries: dict[str, dict], limit: int | None = None) -> dict[str, dict]:
    """At most `limit` (MAX_ENTRIES) decisions: the newest by when they were taken."""
    limit = MAX_ENTRIES if limit is None else limit
    if len(entries) <= limit:
        return entries
    newest = sorted(entries, key=lambda k: (str(entries[k].get("when", "")), k), reverse=True)[:limit]
    return {k: entries[k] for k in sorted(newest)}


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
    warnings: list[str] = field(default_factory=list)  # what reading the file left out, one line each
    usable: bool = True  # False: the path holds a FIFO, a device, a folder or a huge file: never written
    skipped: int = 0  # malformed decisions left out by the last read

    @property
    def path(self) -> str:
        return os.path.join(self.directory, FILE)

    def _read(self) -> dict[str, dict]:
        """The decisions on disk; what cannot be used is left out with one warning line (warnings), never an
        error: a file that is not a regular file (a FIFO is never opened, so never waited on) or is over
        MAX_BYTES is ignored and left as it is (`usable` False: save writes nothing); a file that is not JSON or
        not a cache is ignored (the next save replaces it); entries of the wrong shape (cache_entries.py) are
        skipped (the next save drops them)."""
        self.usable = True
        try:
            data = json.loads(read_regular(self.path, MAX_BYTES))
        except FileNotFoundError:
            return {}
        except NotRegularFile as e:
            return self._ignored(f"is {e.kind}, not a regular file", keep=True)
        except TooLarge:
            return self._ignored(f"is larger than {MAX_BYTES >> 20} MB", keep=True)
        except (OSError, RecursionError) as e:
            return self._ignored(f"cannot be read ({type(e).__name__})", keep=True)
        except ValueError:  # not JSON, or not UTF-8
            return self._ignored("is not JSON")
        if not isinstance(data, dict) or not isinstance(data.get("decisions"), dict):
            return self._ignored("is not a decision cache (an object with 'format' and 'decisions')")
        if data.get("format") != FORMAT:
            return {}  # another format's decisions: not ours to read (save replaces them)
        good: dict[str, dict] = {}
        bad: list[str] = []
        for key, entry in data["decisions"].items():
            problem = entry_problem(entry)
            if problem is None:
                good[key] = entry
            else:
                bad.append(f"{key[:12]}: {problem}")
        self.skipped = len(bad)
        if bad:
            self._warn(f"{self.path}: {len(bad)} malformed decision(s) skipped ({'; '.join(bad[:3])}"
                       + ("; ..." if len(bad) > 3 else "") + ")")
        return good

    def _ignored(self, why: str, keep: bool = False) -> dict[str, dict]:
        self.usable = not keep
        self._warn(f"{self.path}: {why}; the decision cache ignores it" + (" and leaves it as it is" if keep else "")
                   + " (`onnxfuse cache clear` removes it)")
        return {}

    def _warn(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings.append(line)

    def get(self, key: str, kinds: tuple[str, ...] | None = None) -> dict | None:
        """The decision under `key`; None when there is none, or (`kinds`) it is not of a kind the caller reads."""
        if not self.enabled:
            return None
        if not self.loaded:
            self.entries = self._read() if _store[0] is None else dict(_store[0].read())
            self.loaded = True
        hit = self.new.get(key) or self.entries.get(key)
        return None if hit is None or (kinds is not None and hit.get("kind") not in kinds) else hit

    def put(self, key: str, value: dict) -> None:
        if self.enabled:
            self.new[key] = {**value, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def save(self) -> None:
        """Merge the new decisions into the file on disk; a cache folder that cannot be written is skipped
        (the cache is an optimization: optimize never fails for it)."""
        if not self.enabled or not self.new:
            return
        if _store[0] is not None:
            _store[0].merge(self.new)
            self.entries, self.new = {**self.entries, **self.new}, {}
            return
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, exist_ok=True)
            merged = bounded({**self._read(), **self.new})
            if not self.usable:
                return
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

    def decisions(self) -> dict[str, dict]:
        """Every decision the file holds (malformed ones left out), with this run's new ones."""
        return {**self._read(), **self.new}

    def clear(self) -> int:
        """Remove the cache file; returns how many decisions it held."""
        n = len(self._read())
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(self.path)
        self.entries, self.new = {}, {}
        return n

    def summary(self) -> dict:
        data = self._read()
        kinds: dict[str, int] = {}
        for v in data.values():
            kinds[v.get("kind", "?")] = kinds.get(v.get("kind", "?"), 0) + 1
        size = os.path.getsize(self.path) if os.path.isfile(self.path) else 0
        return {"path": self.path, "decisions": len(data), "by_kind": kinds, "bytes": size,
                "entries": data, "skipped": self.skipped, "warnings": list(self.warnings)}
