"""One Ray task per model: the input laid out on this node if it does not see the driver's files, then
batch.optimize_one (the public optimize, under this node's timing lock) into a private folder, with the fleet's
decision cache; the result comes back as batch's JSON-able entry with the bytes of the files written (the driver
writes OUTDIR) and the node it ran and measured on. Names of the private folder in the result (its messages,
warnings) are the driver's names again."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable

from ..batch import optimize_one
from ..options import OptimizeOptions
from ..select.decision_cache import shared_store
from .decisions import ActorStore
from .shipping import Shipped, lay_out, read_written, visible

__all__ = ["FILES_KEY", "run_model"]

FILES_KEY = "_files"  # the written files, (name, bytes), the model first: taken out by the driver


def run_model(shipped: Shipped, output: str, options: OptimizeOptions, decisions=None,
              setup: Callable[[], None] | None = None) -> dict:
    import ray

    if setup is not None:  # tests: fake timings installed in this worker process
        setup()
    tmp = tempfile.mkdtemp(prefix="onnxfuse-ray-")
    try:
        if visible(shipped):
            path = shipped.path
        elif shipped.data is not None:
            path = lay_out(shipped, ray.get(shipped.data), os.path.join(tmp, "in"))
        else:
            path = shipped.path  # neither seen here nor shipped: optimize says it cannot read it
        os.mkdir(os.path.join(tmp, "out"))
        out = os.path.join(tmp, "out", os.path.basename(output))
        store = shared_store(ActorStore(decisions)) if decisions is not None else contextlib.nullcontext()
        with store:
            data = optimize_one(path, out, options)
        if not data["error"] and data.get("written"):
            data[FILES_KEY] = read_written(data["written"], out)
        shown = shipped.shown or shipped.path
        data = _renamed(data, {path: shown, os.path.dirname(path): os.path.dirname(shipped.path), out: output,
                               os.path.dirname(out): os.path.dirname(output)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx = ray.get_runtime_context()
    data["node"] = {"id": ctx.get_node_id(), "address": ray.util.get_node_ip_address(),
                    "host": platform.node(), "measured": data.get("measure") is not None}
    return data


def _renamed(data: dict, names: dict[str, str]) -> dict:
    """`data` with each private path replaced by the driver's (in every string of it); the files' bytes kept."""
    files = data.pop(FILES_KEY, None)
    text = json.dumps(data)
    for local, driver in sorted(names.items(), key=lambda kv: -len(kv[0])):
        if local != driver:
            text = text.replace(json.dumps(local)[1:-1], json.dumps(driver)[1:-1])
    data = json.loads(text)
    if files is not None:
        data[FILES_KEY] = files
    return data
