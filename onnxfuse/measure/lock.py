"""The timing lock: one process at a time times models on this machine (timings taken beside other onnxruntime
work lie). Measured selection and the CLI's benchmarks hold an exclusive `fcntl.flock` while they time; batch
workers hold it shared while they load, rewrite and validate (`busy_lock`), and a worker's own measuring turns
its shared hold exclusive. The file is `timing.lock` in the cache folder, else `onnxfuse-timing-<uid>.lock` in
the temporary folder. A dead process's lock goes with its descriptor; where no lock can be taken, timing runs
unlocked: the lock never makes optimize fail.

The file is opened safely (`_open`): never through a symbolic link (O_NOFOLLOW) or blocking on a FIFO
(O_NONBLOCK), only a regular file, in the temporary folder only one this user owns; anything else skips the
lock. Only a file this process has just created (O_CREAT|O_EXCL) gets its mode, through its descriptor (0644:
flock needs read access, so users sharing a cache folder can lock it too)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from ..cache_folder import cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["REPORT_WAIT_S", "WAIT_KEY", "busy_lock", "lock_path", "timing_lock"]

LOCK_FILE = "timing.lock"
FALLBACK_FILE = "onnxfuse-timing-{uid}.lock"  # in the temporary folder, one per user
LOCK_MODE = 0o644  # what a lock file this process creates gets (flock needs read access only)
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
WAIT_KEY = "wait for timing lock"  # the Result.timings entry (seconds), when the wait was noticeable
REPORT_WAIT_S = 0.1  # a wait for the lock shorter than this is not reported (below notice, not measured)
_held = threading.local()  # .fd, .path: the shared hold busy_lock took in this thread, if any


def lock_path() -> str:
    """The lock file: in the cache folder, else in the temporary folder."""
    folder = cache_dir()
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK) or os.path.exists(os.path.join(folder, LOCK_FILE)):
            return os.path.join(folder, LOCK_FILE)
    return fallback_path()


def fallback_path() -> str:
    """This user's lock file in the temporary folder."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), FALLBACK_FILE.format(uid=uid))


def _open(path: str) -> int | None:
    """A descriptor to lock (read-only is enough for flock, so another user's lock file in a shared cache folder
    works too), or None where `path` is not a lock file to trust: a symbolic link, a FIFO, a device, a folder; in
    the temporary folder, a file another user owns."""
    created = True
    try:
        fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, LOCK_MODE)
    except FileExistsError:  # also a symbolic link, dangling or not: O_EXCL never follows one
        created = False
        try:
            fd = os.open(path, _OPEN_FLAGS)  # ELOOP on a symbolic link
        except OSError:
            return None
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (not created and path == fallback_path()
                                            and hasattr(os, "getuid") and st.st_uid != os.getuid()):
            os.close(fd)
            return None
        if created:  # ours, just made: the mode is set on the descriptor, never on a path that may have changed
            with contextlib.suppress(OSError):
                os.fchmod(fd, LOCK_MODE)
    except OSError:
        os.close(fd)
        return None
    return fd


def _flock(fd: int | None, op: int) -> int | None:
    """flock, or None (and the descriptor closed) where the file system has no locks."""
    if fd is None:
        return None
    try:
        fcntl.flock(fd, op)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def busy_lock(path: str | None = None) -> Iterator[float]:
    """Hold the lock shared for the `with` body (a batch worker loading, rewriting, validating): holders of the
    shared lock run together, never while someone times. Yields the seconds spent waiting. A timing_lock taken
    inside it, in the same thread, converts this hold to exclusive (and gives it up when done)."""
    path = path or lock_path()
    fd = _open(path) if fcntl is not None else None
    t0 = time.perf_counter()
    fd = _flock(fd, fcntl.LOCK_SH) if fd is not None else None
    _held.fd, _held.path = fd, path
    try:
        yield time.perf_counter() - t0
    finally:
        fd = _held.fd  # None if a timing_lock inside lost it
        _held.fd = _held.path = None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@contextlib.contextmanager
def timing_lock(timings: dict[str, float] | None = None, path: str | None = None,
                waiting: Callable[[], None] | None = None) -> Iterator[float]:
    """Hold the timing lock for the `with` body; yields the seconds spent waiting for it. With `timings`, a wait
    over REPORT_WAIT_S is recorded there as timings[WAIT_KEY] (added up if the lock is taken twice). `waiting()`
    is called once when the lock is held by another process, before waiting for it (a status line says so).

    Start any time budget inside the body: the wait must not count against it."""
    path = path or lock_path()
    shared = getattr(_held, "fd", None) if getattr(_held, "path", None) == path else None
    # inside busy_lock: convert its shared hold (flock releases it, then waits for the exclusive lock), since a
    # second descriptor of this process would wait for our own shared hold forever
    fd = shared if shared is not None else (_open(path) if fcntl is not None else None)
    t0 = time.perf_counter()
    if fd is not None and waiting is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = True
        except BlockingIOError:
            taken = False
            waiting()
        except OSError:
            taken = False
        if not taken:
            fd = _flock(fd, fcntl.LOCK_EX)
    else:
        fd = _flock(fd, fcntl.LOCK_EX) if fd is not None else None
    if shared is not None and fd is None:  # the conversion failed and closed it: busy_lock must not close it
        _held.fd = _held.path = None
    waited = time.perf_counter() - t0
    if timings is not None and waited > REPORT_WAIT_S:
        timings[WAIT_KEY] = timings.get(WAIT_KEY, 0.0) + waited
    try:
        yield waited
    finally:
        if fd is not None:  # a busy holder does not take its shared hold back: what is left (writing) is light
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            if shared is None:
                os.close(fd)
