"""Connecting to Ray and what its nodes offer. Measuring runs alone on a node because every per-model task that
measures asks for one unit of the custom resource `onnxfuse_timing_slot`, which each node declares once
(`ray start --resources='{"onnxfuse_timing_slot": 1}'`): a node runs one such task at a time, so two measurements
never share its cores (the whole per-model task holds it: optimize times in the middle of one sequence of
in-memory steps, which does not split into separate Ray tasks)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading

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
    with _keep_sigterm():
        _init(ray, address, quiet)
    return True


@contextlib.contextmanager
def _keep_sigterm():
    """ray.init installs its own SIGTERM handler (a crash dump, then death); the command's (signals.py: SIGTERM
    unwinds as Ctrl-C does, exit 143) is put back."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if before is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGTERM, before)


def _init(ray, address: str, quiet: dict) -> None:
    try:
        if address == "auto":
            try:
                ray.init(address="auto", **quiet)
            except ConnectionError:
                ray.init(resources={TIMING_SLOT: 1}, num_cpus=os.cpu_count() or 1, **quiet)
        else:
            _reachable(address)
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OnnxfuseError(f"--ray {address}: cannot connect to the Ray cluster: {first}",
                            hint="`ray status` on the head node shows its address; `auto` uses a running "
                                 "cluster or starts one here") from None


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """A HOST:PORT that nothing answers is one line at once (Ray itself retries for minutes, logging as it
    goes); other forms (ray://) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {address} ({e.strerror or type(e).__name__})") from None


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
