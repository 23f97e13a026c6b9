"""onnxfuse on Ray: `onnxfuse optimize IN... OUTDIR --ray auto|ADDRESS`, the many-models batch (batch.py) on a
Ray cluster instead of one machine's process pool. Ray is an optional extra (`pip install 'onnxfuse[ray]'`);
nothing here imports it until a run starts.

- `cluster.py`: connecting (an address, or `auto`: a running cluster, else a local one), the nodes, the
  per-node timing resource `onnxfuse_timing_slot`.
- `shipping.py`: a model's files to the node that optimizes it (by path where that node sees the same file, else
  the bytes of the model and its external data through Ray's object store) and the written files back.
- `decisions.py`: the decision cache every node shares: an actor seeded from the driver's cache file, which the
  driver persists as models finish (decision_cache.shared_store is the seam the workers use).
- `worker.py`: one Ray task per model (batch.optimize_one in a private folder); `driver.py`: submitting, retrying
  what died, progress, Ctrl-C, and writing each output atomically (load/write.py) on the driver only.

Sits at the top with batch.py: may import every stage."""

from .cluster import TIMING_SLOT
from .driver import optimize_on_ray

__all__ = ["TIMING_SLOT", "optimize_on_ray"]
