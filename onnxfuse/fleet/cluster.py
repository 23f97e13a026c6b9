"""Connecting to Ray and what its nodes offer. Measuring runs alone on a node because every per-model task that
measures asks for one unit of the custom resource `onnxfuse_timing_slot`, which each node declares once
(`ray start --resources='{"onnxfuse_timing_slot": 1}'`): a node runs one such task at a time, so two measurements
never share its cores (the whole per-model task holds it: optimize times in the middle of one sequence of
in-memory steps, which does not split into separate Ray tasks)."""

from __future__ import annotations

import os

from ..errors import OnnxfuseError

__all__ = ["TIMING_SLOT", "connect", "import_ray", "slots"]

TIMING_SLOT = "onnxfuse_timing_slot"
INSTALL_HINT = "pip install 'onnxfuse[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise OnnxfuseError("--ray needs Ray, which is not installed", hint=INSTALL_HINT) from None
    return ray


def connect(address: str) -> bool:
    """Connect this process to Ray (unless it is already): `address` is a cluster's (`HOST:PORT`, `ray://...`),
    or `auto`: the cluster RAY_ADDRESS or a local `ray start` names, else a Ray instance started here for this
    run, whose node declares one timing slot. Returns True when this call connected (the caller disconnects)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False}
    try:
        if address == "auto":
            try:
                ray.init(address="auto", **quiet)
            except ConnectionError:
                ray.init(resources={TIMING_SLOT: 1}, num_cpus=os.cpu_count() or 1, **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OnnxfuseError(f"--ray {address}: cannot connect to the Ray cluster: {first}",
                            hint="`ray status` on the head node shows its address; `auto` uses a running "
                                 "cluster or starts one here") from None
    return True


def slots(measure: bool) -> int:
    """How many models the cluster runs at once: its timing slots when measuring (an error when no node declares
    one: the tasks would wait forever), else its CPUs."""
    ray = import_ray()
    total = ray.cluster_resources()
    if measure:
        n = int(total.get(TIMING_SLOT, 0))
        if n < 1:
            raise OnnxfuseError(f"no node of the Ray cluster declares the {TIMING_SLOT} resource, which measuring "
                                "needs (one per node: measurements never share a node's cores)",
                                hint=f"ray start ... --resources='{{\"{TIMING_SLOT}\": 1}}' on each node, or "
                                     "--no-measure")
        return n
    return max(1, int(total.get("CPU", 1)))
