"""The driver of a Ray batch: the same contract as batch.optimize_many (results in the items' order, each
`Result.to_json()` with `error` and `seconds`, or a failure entry; `on_result` as each finishes), plus `node`:
where the model ran and measured.

Tasks are submitted a window at a time (twice the models the cluster runs at once), so the object store holds
only the inputs of models running or about to; the rest wait here, queued. A task whose worker or node dies is
retried by Ray (`max_retries`); one that died every time fails alone with one line. Ctrl-C (or SIGTERM,
signals.py) cancels every submitted task (each unwinds, removing its private folder) and is raised again; the
models finished by then are written, nothing partial. Outputs are written here only, atomically."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ..batch import SCHEMA, BatchItem, prepare_outputs
from ..errors import OnnxfuseError
from ..options import OptimizeOptions
from ..select.decision_cache import DecisionCache
from .cluster import TIMING_SLOT, connect, import_ray, slots
from .shipping import Shipped, describe, read_bytes
from .worker import FILES_KEY, run_model

__all__ = ["MAX_RETRIES", "optimize_on_ray"]

MAX_RETRIES = 3
DIED = "the Ray worker running it died {n} time(s) (a crash in onnxruntime, out of memory, or its node lost): {why}"


def optimize_on_ray(items: list[BatchItem], options: OptimizeOptions, address: str = "auto",
                    on_result: Callable[[dict], None] | None = None,
                    on_progress: Callable[[dict[str, int]], None] | None = None,
                    ship: bool | None = None, max_retries: int = MAX_RETRIES,
                    setup: Callable[[], None] | None = None) -> list[dict]:
    """Optimize every item on the Ray cluster at `address` (see cluster.connect). `ship`: send the inputs'
    bytes through the object store (None: when some node is on another machine than this one); a node that sees
    the same files reads them by path anyway. `on_progress({done, failed, running, queued})` after each change.
    `setup`: called in the worker before each model (tests install fake timings with it)."""
    ray = import_ray()
    connected = connect(address)
    try:
        window = 2 * slots(options.measure)  # before any output folder is made: a cluster that cannot run it
        prepare_outputs(items, options)
        return _run(ray, items, options, window, on_result, on_progress, ship, max_retries, setup)
    finally:
        if connected:
            ray.shutdown()


def _run(ray, items, options, window, on_result, on_progress, ship, max_retries, setup) -> list[dict]:
    if ship is None:
        here = ray.util.get_node_ip_address()
        ship = any(n["Alive"] and n["NodeManagerAddress"] != here for n in ray.nodes())
    cache = DecisionCache(enabled=options.cache)
    actor = None
    if options.cache:
        from .decisions import start

        actor = start(cache.decisions())
    # a worker's folder is not the driver's: files the options name are given by absolute path
    options = replace(options, patterns=[os.path.abspath(p) for p in options.patterns],
                      inputs_npz=options.inputs_npz and os.path.abspath(options.inputs_npz))
    resources = {TIMING_SLOT: 1} if options.measure else {}
    task = ray.remote(run_model).options(num_cpus=1, resources=resources, max_retries=max_retries,
                                         retry_exceptions=False)
    done: dict[int, dict] = {}
    queued = deque(range(len(items)))
    running: dict = {}  # ObjectRef -> item index
    counts = {"done": 0, "failed": 0}

    def report() -> None:
        if on_progress is not None:
            on_progress({**counts, "running": len(running), "queued": len(queued)})

    try:
        while queued or running:
            while queued and len(running) < window:
                i = queued.popleft()
                running[task.remote(_shipped(ray, items[i].input, ship), items[i].output, options, actor,
                                    setup)] = i
            report()
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in ready:
                i = running.pop(ref)
                result = _collect(ray, ref, items[i], options, max_retries)
                if actor is not None:
                    _persist(ray, actor, cache)
                done[i] = result
                counts["failed" if result["error"] else "done"] += 1
                if on_result is not None:
                    on_result(result)
        report()
    except BaseException:  # Ctrl-C, SIGTERM: every submitted task unwinds (its private folder removed)
        for ref in running:
            ray.cancel(ref, recursive=True)
        raise
    finally:
        if actor is not None:
            _persist(ray, actor, cache)
            ray.kill(actor)
    return [done[i] for i in range(len(items))]


def _shipped(ray, path: str, ship: bool) -> Shipped:
    _, files = describe(path)
    data = None
    if ship and files:
        try:
            data = ray.put(read_bytes(path))
        except OSError:
            data = None  # unreadable here: the worker fails on it with the loader's line
    return Shipped(os.path.abspath(path), files, data, shown=path)


def _collect(ray, ref, item: BatchItem, options: OptimizeOptions, max_retries: int) -> dict:
    """The task's result, its output written; a task that died every time is a failure entry."""
    t0 = time.perf_counter()
    try:
        data = ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # a bug in the task itself (optimize_one catches what optimize raises)
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
        first = (str(cause).strip().splitlines() or [""])[0]
        return _failure(item, f"internal error: {type(cause).__name__}: {first}", time.perf_counter() - t0)
    except ray.exceptions.RayError as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return _failure(item, DIED.format(n=max_retries + 1, why=why), time.perf_counter() - t0)
    files = data.pop(FILES_KEY, None)
    if data["error"] or options.dry_run:
        return data
    try:
        data["written"] = _write(files, item.output)
    except OnnxfuseError as e:
        return {**_failure(item, str(e), data["seconds"]), "node": data.get("node")}
    except OSError as e:
        return {**_failure(item, f"{item.output}: cannot write it: {e.strerror or e}", data["seconds"]),
                "node": data.get("node")}
    data["output"] = item.output
    return data


def _write(files, output: str) -> list[str]:
    from .shipping import write_output

    if not files:
        raise OnnxfuseError(f"{output}: the worker sent back no model file")
    return write_output(files, output)


def _persist(ray, actor, cache: DecisionCache) -> None:
    """What the fleet decided since the last call, merged into the driver's cache file."""
    try:
        new = ray.get(actor.take_new.remote(), timeout=60)
    except ray.exceptions.RayError:
        return
    if new:
        cache.new.update(new)
        cache.save()


def _failure(item: BatchItem, message: str, seconds: float) -> dict:
    return {"schema": SCHEMA, "input": item.input, "output": None, "error": message, "seconds": seconds,
            "node": None}


def nodes_used(results: list[dict]) -> int:
    return len({(d.get("node") or {}).get("id") for d in results if d.get("node")})


