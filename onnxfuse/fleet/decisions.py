"""The decision cache a fleet shares. One actor holds the decisions (seeded from the driver's cache file); each
worker reads and merges into it through decision_cache.shared_store, so a model decided on one node is reused
on another without timing. Decisions stay keyed by what they depend on (select/decision_cache.py: the model's
content, the rewrites the rules made, the profiles, provider, thread count, onnxruntime version, processor
model, protocol): a node of another processor model misses and decides afresh. The driver takes what is new
after each model and merges it into its own file; nothing assumes a file system the nodes share.

The cache is an optimization: a worker that cannot reach the actor decides afresh, it never fails for it."""

from __future__ import annotations

import contextlib

__all__ = ["ActorStore", "DecisionsActor", "start"]

REMOTE_TIMEOUT_S = 120.0


class DecisionsActor:
    """The fleet's decisions in memory, with what arrived since the driver last took it."""

    def __init__(self, seed: dict[str, dict]) -> None:
        self.entries = dict(seed)
        self.fresh: dict[str, dict] = {}

    def read(self) -> dict[str, dict]:
        return self.entries

    def merge(self, new: dict[str, dict]) -> None:
        self.entries.update(new)
        self.fresh.update(new)

    def take_new(self) -> dict[str, dict]:
        out, self.fresh = self.fresh, {}
        return out


def start(seed: dict[str, dict]):
    """The actor, on the driver's node (so a worker node's death does not take it down)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    cls = ray.remote(num_cpus=0)(DecisionsActor)
    return cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote(seed)


class ActorStore:
    """decision_cache's store interface over the actor (worker side)."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def read(self) -> dict[str, dict]:
        import ray

        with contextlib.suppress(ray.exceptions.RayError):
            return ray.get(self.actor.read.remote(), timeout=REMOTE_TIMEOUT_S)
        return {}

    def merge(self, new: dict[str, dict]) -> None:
        import ray

        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.actor.merge.remote(new), timeout=REMOTE_TIMEOUT_S)
