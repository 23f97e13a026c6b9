"""Many models at once: `onnxfuse optimize IN... OUTDIR`. The models are optimized in a pool of worker
processes: loading, rewriting and validating run side by side (each worker holds the timing lock shared),
while measuring, which `optimize` does under the exclusive timing lock (timing_lock.py), runs alone: never
beside another measuring, or another worker's work, here or in another onnxfuse invocation.

Each worker calls the public `onnxfuse.optimize` and sends back only the JSON-able result (`Result.to_json()`,
plus `error` and `seconds`), never a ModelProto. Workers start with "forkserver" (or "spawn"): onnxruntime is
not fork-safe once sessions exist. A model that fails becomes an entry with its `error`; the others still run;
nothing is written for it (optimize writes atomically). A worker that dies (a crash in onnxruntime, the OOM
killer) breaks the pool: the models it took down with it are run again one at a time, so only the culprit
fails.

Workers die with the command: Ctrl-C or SIGTERM (signals.py) unwinds the parent, which terminates its pool; a
parent killed outright (SIGKILL) takes its forkserver with it (forkserver_guard.py), and each worker asked the
kernel for a SIGTERM when its parent process (the forkserver) dies (Linux: prctl PR_SET_PDEATHSIG), which
unwinds it the same way; a worker that starts once the command has gone exits at once. Nothing is written after
the command has gone, and no worker keeps the caller's pipes open."""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from .errors import OnnxfuseError
from .load.collisions import check_writes, same_file
from .measure.lock import REPORT_WAIT_S, WAIT_KEY, busy_lock
from .options import OptimizeOptions
from .select.decision_cache import cache_dir

__all__ = ["BatchItem", "collect", "default_jobs", "optimize_many", "optimize_one", "prepare_outputs"]

SCHEMA = "onnxfuse.optimize/1"
DIED = ("the worker process died while optimizing it (a crash in onnxruntime, or killed: out of memory?)")


@dataclass(frozen=True)
class BatchItem:
    input: str  # the model file
    output: str  # OUTDIR/<its file name>


def default_jobs() -> int:
    """min(4, the CPUs this process may use)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def collect(inputs: list[str], out_dir: str, recursive: bool = False) -> list[BatchItem]:
    """The models to optimize: files as given, folders as their *.onnx files (sorted by name; with `recursive`,
    those of subfolders too). Each output is OUTDIR/<the input's file name>; two inputs of one name are an
    error. A path that does not exist is kept: optimizing it fails with its own line."""
    if out_dir.endswith(".onnx") and not os.path.isdir(out_dir):
        folder = next((p for p in inputs if os.path.isdir(p)), None)
        what = f"{folder}: is a directory, and" if folder else "with several models"
        raise OnnxfuseError(f"{what} OUT {out_dir} names a file: the last argument must be an output folder",
                            hint="onnxfuse optimize IN... OUTDIR")
    files: list[str] = []
    for path in inputs:
        if not os.path.isdir(path):
            files.append(path)
            continue
        found = _models_in(path, recursive)
        if not found:
            raise OnnxfuseError(f"{path}: no .onnx models in this folder"
                                + ("" if recursive else " (--recursive looks in subfolders)"))
        files += found
    by_name: dict[str, str] = {}
    for f in files:
        name = os.path.basename(f)
        if name in by_name:
            raise OnnxfuseError(f"two inputs are named {name} ({by_name[name]} and {f}); both would be written to "
                                f"{os.path.join(out_dir, name)}", hint="optimize them into separate folders")
        by_name[name] = f
    return [BatchItem(f, os.path.join(out_dir, os.path.basename(f))) for f in files]


def _models_in(folder: str, recursive: bool) -> list[str]:
    if not recursive:
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                if n.endswith(".onnx") and os.path.isfile(os.path.join(folder, n))]
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, n) for n in sorted(names) if n.endswith(".onnx")]
    return found


def optimize_many(items: list[BatchItem], options: OptimizeOptions, jobs: int,
                  on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Optimize every item with `jobs` worker processes (in this process when jobs is 1 or there is one model);
    returns the per-model results in the items' order (each `Result.to_json()` with `error` None and
    `seconds`, or a failure: `schema`, `input`, `output` None, `error`, `seconds`). `on_result` is called
    with each result as it completes."""
    prepare_outputs(items, options)
    done: dict[int, dict] = {}

    def finish(i: int, result: dict) -> None:
        done[i] = result
        if on_result is not None:
            on_result(result)

    env = {"ONNXFUSE_CACHE_DIR": cache_dir()}  # workers use this process's cache (and so its lock file)
    todo = list(range(len(items)))
    if jobs <= 1 or len(items) == 1:
        for i in todo:
            finish(i, optimize_one(items[i].input, items[i].output, options, env))
        return [done[i] for i in range(len(items))]
    broken = _pool(todo, items, options, env, min(jobs, len(items)), finish)
    while broken:  # run again one at a time what a dying worker took down: only the culprit fails
        broken = _pool(broken, items, options, env, 1, finish)
    return [done[i] for i in range(len(items))]


def prepare_outputs(items: list[BatchItem], options: OptimizeOptions) -> None:
    """Before any work: no output replaces a file another input reads (its own: refused by its own run, so the
    others still run), and the output folders exist."""
    if options.dry_run:
        return
    check_writes([(i.input, i.output) for i in items if not same_file(i.input, i.output)], options.force,
                 [i.input for i in items])
    for d in sorted({os.path.dirname(os.path.abspath(i.output)) for i in items}):
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise OnnxfuseError(f"{d}: cannot create the output folder: {e.strerror or e}") from None


def _pool(todo: list[int], items: list[BatchItem], options: OptimizeOptions, env: dict[str, str], jobs: int,
          finish: Callable[[int, dict], None]) -> list[int]:
    """Run `todo` in a pool of `jobs` workers; returns the items a broken pool did not finish (with one job,
    the first of them has failed: it was running when its worker died)."""
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=_context(), initializer=_worker_init,
                               initargs=(os.getpid(),))
    futures: dict[Future, int] = {}
    try:
        futures = {pool.submit(optimize_one, items[i].input, items[i].output, options, env): i for i in todo}
        broken: list[int] = []
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                finish(i, fut.result())
            except BrokenProcessPool:
                broken.append(i)
    except BaseException:  # Ctrl-C (workers ignore it) or SIGTERM: stop them, each unwinding what it was writing
        workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
        manager = getattr(pool, "_executor_manager_thread", None)  # and this
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            with contextlib.suppress(OSError):
                proc.terminate()
        _forget_manager(manager)
        raise
    pool.shutdown(wait=True)
    broken.sort()
    if broken and jobs == 1:  # one at a time: the first unfinished one was running when the worker died
        finish(broken[0], _failure(items[broken[0]], DIED, 0.0))
        broken = broken[1:]
    return broken


def _forget_manager(manager) -> None:
    """Python 3.11's exit hook for process pools writes to each pool manager's wake-up pipe, which a pool
    stopped this way has already closed: it then prints a traceback after onnxfuse's one line. The manager
    thread ends once its workers are gone; it is then taken off the hook's list."""
    import concurrent.futures.process as cfp

    if manager is None:
        return
    manager.join(timeout=5)
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        wakeup = cfp._threads_wakeups.get(manager)
        if not manager.is_alive() or getattr(wakeup, "_closed", False):  # closed: it is ending
            cfp._threads_wakeups.pop(manager, None)


COMMAND_PID_ENV = "ONNXFUSE_FORKSERVER_PARENT"  # read by forkserver_guard, in the forkserver


# the forkserver listens on a Unix socket at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (Python 3.11), whose path must
# fit sun_path (107 bytes on Linux): a longer TMPDIR made the batch fail ("AF_UNIX path too long")
SOCKET_PATH_MAX = 107 - len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def _context():
    """forkserver where there is one (workers fork from a clean server with onnxfuse imported, which dies with
    this process: forkserver_guard.py) and the temporary folder's path leaves room for its socket, else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods() and \
            len(os.fsencode(tempfile.gettempdir())) <= SOCKET_PATH_MAX:
        ctx = multiprocessing.get_context("forkserver")
        os.environ[COMMAND_PID_ENV] = str(os.getpid())  # the forkserver inherits it when it starts
        # onnxfuse.pipeline imports onnxruntime and creates no session: fork-safe
        ctx.set_forkserver_preload(["onnxfuse.forkserver_guard", "onnxfuse.pipeline"])
        return ctx
    return multiprocessing.get_context("spawn")


_worker = {"in_pool": False, "busy": False, "stopping": False}


def _worker_init(command_pid: int) -> None:
    """A pool worker ignores Ctrl-C (the parent decides) and stops on SIGTERM: at once when idle, else by
    unwinding optimize (its atomic writer removes what it had begun to write). It gets that SIGTERM when its
    parent process dies too, and does not start if the command (`command_pid`) has gone already."""
    _worker["in_pool"] = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    _release_forkserver()
    die_with_parent()
    if not _alive(command_pid):  # it died before the line above took effect
        os._exit(128 + signal.SIGTERM)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process `signum` when its parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _release_forkserver() -> None:
    """A forkserver's process holds the command's end of the pipe the forkserver watches to notice that the
    command has gone (so that it could start forkserver processes of its own; a worker never does). Closed, the
    forkserver exits with the command, and its workers (its children) get their PR_SET_PDEATHSIG."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if multiprocessing.parent_process() is None or fd is None:  # not a worker, or not started by a forkserver
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None


def _alive(pid: int) -> bool:
    """Whether `pid` runs. A process killed but not yet reaped by its parent (a zombie) has gone: a worker that
    starts in that moment, its forkserver already dead, must not stay (seen on a loaded machine: it then waited
    for work forever, holding the caller's pipes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's (cannot be ours, but do not guess)
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:  # gone since
        return not os.path.isdir("/proc/self")
    except OSError:
        return True


def _on_term(signum, frame) -> None:
    if _worker["stopping"]:  # SIGTERM again (to the process group, then from the parent): let the cleanup run
        return
    if _worker["busy"]:
        _worker["stopping"] = True
        raise KeyboardInterrupt
    os._exit(128 + signum)


def optimize_one(input: str, output: str, options: OptimizeOptions, env: dict[str, str] | None = None) -> dict:
    """One model, as a pool worker runs it: `onnxfuse.optimize`, its result as plain JSON data."""
    if env:
        os.environ.update(env)
    t0 = time.perf_counter()
    item = BatchItem(input, output)
    try:
        from . import optimize

        _worker["busy"] = True
        with busy_lock() as waited:  # shared: other workers work alongside, nobody times meanwhile
            data = optimize(input, output, options).to_json()
        if waited > REPORT_WAIT_S:
            data["timings_s"][WAIT_KEY] = data["timings_s"].get(WAIT_KEY, 0.0) + waited
    except OnnxfuseError as e:
        return _failure(item, str(e), time.perf_counter() - t0)
    except Exception as e:  # a bug (or MemoryError): this model fails, the others go on
        return _failure(item, f"internal error: {type(e).__name__}: {e}", time.perf_counter() - t0)
    except KeyboardInterrupt:
        if _worker["in_pool"]:  # stopped by the parent: what optimize was writing is cleaned up by now
            os._exit(130)
        raise
    finally:
        _worker["busy"] = False
    data["error"] = None
    data["seconds"] = time.perf_counter() - t0
    return json.loads(json.dumps(data, default=str))  # plain JSON types: cheap to send, printable as is


def _failure(item: BatchItem, message: str, seconds: float) -> dict:
    return {"schema": SCHEMA, "input": item.input, "output": None, "error": message, "seconds": seconds}
