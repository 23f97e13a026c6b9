"""onnxfuse on Ray against one machine: a zoo of 20 small models (models/ and models/styles) optimized with
measured selection three ways, each from an empty decision cache: serially, `--jobs 2`, and on a local Ray
cluster of a head and 2 worker nodes on loopback (one CPU and one timing slot each). Then the cluster again,
seeded with the serial run's decisions: it must time nothing and write the same bytes as the serial run.
Prints wall time, models failed, groups timed, peak memory per node (the largest worker process RSS; the
driver's own for serial) and whether the outputs are byte-identical to the serial run's.

    python -m benchmarks.fleet_ray [--budget 2] [--models 20]

The nodes of a loopback cluster share this machine's cores and its timing lock file (measure/lock.py), so its
measuring is serialized as --jobs' is: the cluster's gain here is the rewriting and validating done side by side
and, above all, decisions reused; on separate machines each node measures in parallel with the others."""

from __future__ import annotations

import argparse
import glob
import os
import resource
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def zoo(n: int, folder: str) -> list[str]:
    picked = sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx")))
    picked += sorted(p for p in glob.glob(os.path.join(ROOT, "models", "styles", "*.onnx"))
                     if "outer_scope" not in p)
    out = []
    for p in picked[:n]:
        target = os.path.join(folder, os.path.basename(p))
        shutil.copy(p, target)
        if p.endswith("_external_data.onnx"):
            shutil.copy(p.replace(".onnx", ".weights"), os.path.join(folder, os.path.basename(p)
                                                                     .replace(".onnx", ".weights")))
        out.append(target)
    return out


def outputs(folder: str) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def timed_groups(results: list[dict]) -> int:
    return sum(1 for d in results for g in (d.get("measure") or {}).get("groups", []) if g["source"] == "timed")


def mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=2.0, help="--measure-budget per model (s)")
    ap.add_argument("--models", type=int, default=20)
    args = ap.parse_args()
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("needs Ray: pip install 'onnxfuse[ray]'", file=sys.stderr)
        return 2
    from onnxfuse import OptimizeOptions
    from onnxfuse.batch import collect, optimize_many
    from onnxfuse.fleet import TIMING_SLOT, optimize_on_ray

    work = tempfile.mkdtemp(prefix="onnxfuse-fleet-bench-")
    os.environ["ONNXFUSE_CACHE_DIR"] = os.path.join(work, "lock")  # the nodes' timing lock (shared: one machine)
    src = os.path.join(work, "zoo")
    os.mkdir(src)
    inputs = zoo(args.models, src)
    opts = OptimizeOptions(measure_budget_s=args.budget)
    rows = []

    def run(name: str, fn, cache: str, seed: str | None = None) -> list[dict]:
        os.environ["ONNXFUSE_CACHE_DIR"] = os.path.join(work, cache)
        if seed:
            os.makedirs(os.environ["ONNXFUSE_CACHE_DIR"])
            shutil.copy(os.path.join(work, seed, "decisions.json"), os.environ["ONNXFUSE_CACHE_DIR"])
        out = os.path.join(work, name)
        t0 = time.perf_counter()
        results = fn(collect(inputs, out))
        wall = time.perf_counter() - t0
        os.environ["ONNXFUSE_CACHE_DIR"] = os.path.join(work, "lock")
        rows.append((name, wall, results, out))
        return results

    print(f"{len(inputs)} models, --measure-budget {args.budget:g}", file=sys.stderr, flush=True)
    run("serial", lambda items: optimize_many(items, opts, 1), "cache-serial")
    serial_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run("--jobs 2", lambda items: optimize_many(items, opts, 2), "cache-jobs")

    t0 = time.perf_counter()
    node = {"num_cpus": 1, "resources": {TIMING_SLOT: 1}, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 << 20})
    cluster.add_node(**node)
    cluster.add_node(**node)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    cluster.wait_for_nodes()
    start_s = time.perf_counter() - t0
    try:
        run("ray, 2 nodes", lambda items: optimize_on_ray(items, opts), "cache-ray")
        run("ray, 2 nodes, seeded", lambda items: optimize_on_ray(items, opts), "cache-ray-seeded",
            seed="cache-serial")
    finally:
        ray.shutdown()
        cluster.shutdown()

    reference = outputs(rows[0][3])
    print(f"\nlocal Ray cluster started in {start_s:.1f} s (not counted below)\n")
    print("decisions: each run from an empty cache decides for itself (timings differ run to run, so may its\n"
          "choices); the seeded run starts from the serial run's decision file: same decisions, same bytes.\n")
    print(f"{'run':<22} {'wall s':>7} {'failed':>6} {'timed':>6} {'same bytes as serial':>21}  peak MiB per node")
    for name, wall, results, out in rows:
        failed = sum(1 for d in results if d["error"])
        same = outputs(out) == reference
        if name == "serial":
            peaks = f"this process {mib(serial_rss)}"
        elif name.startswith("--jobs"):
            peaks = f"largest worker {mib(max(d.get('peak_rss_bytes', 0) for d in results))}"
        else:
            by_node: dict[str, int] = {}
            for d in results:
                n = (d.get("node") or {}).get("id", "?")[:8]
                by_node[n] = max(by_node.get(n, 0), d.get("peak_rss_bytes", 0))
            peaks = ", ".join(f"{n} {mib(v)} ({sum(1 for d in results if (d.get('node') or {}).get('id', '?')[:8] == n)} models)"
                              for n, v in sorted(by_node.items()))
        print(f"{name:<22} {wall:>7.1f} {failed:>6} {timed_groups(results):>6} {'yes' if same else 'NO':>21}  {peaks}")
    for name, _, results, _ in rows:
        for d in results:
            if d["error"]:
                print(f"  {name}: {d['input']}: {d['error']}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
