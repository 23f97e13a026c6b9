"""One model against another on given inputs, by the protocol optimize's confirmation uses: two sessions of
each (the A/A pairs give the noise floor), made twice in opposite orders, interleaved run by run over the
inputs, on the estimator's clock, until the verdict is clear or the seconds allow no more. For benchmarks
and experiments that compare models of their own (kernels alone, a rule left out): their numbers then come
from the protocol the tool describes, not from a loop of their own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..targets import HOST
from .clock import WALL, estimator_for
from .sessions import Source, timing_sessions
from .timing import Filtered, in_generations
from .verdicts import Verdict, model_settled, model_verdict

__all__ = ["Compared", "compare"]


@dataclass(frozen=True)
class Compared:
    verdict: Verdict  # variant / base, with its interval and the noise floor
    base_s: float  # the base's median seconds a run (wall time, per profile's weighted total)
    variant_s: float

    def line(self) -> str:
        v = self.verdict
        floor = "" if "noise floor" in v.word else f", noise floor ±{v.floor:.1%}"
        return f"{self.base_s * 1e3:8.3f} ms -> {self.variant_s * 1e3:8.3f} ms, ratio {v.ratio} ({v.word}{floor})"


def compare(base: Source, variant: Source, feeds: dict | list[tuple[float, dict]], *, provider: str = HOST,
            threads: int = 1, seconds: float = 2.0, min_runs: int = 20, subset_inputs: bool = False) -> Compared:
    """`variant` against `base` (model paths or bytes) on `feeds` (one set of inputs, or weighted profiles):
    at least `min_runs` rounds and `seconds` of runs, on while the verdict is not clear, up to three times
    `seconds`. `subset_inputs`: each model takes only the feeds it declares (two spellings with other inputs)."""
    profiles = feeds if isinstance(feeds, list) else [(1.0, feeds)]
    times = in_generations(
        lambda reverse: timing_sessions({"o": base, "c": variant}, provider, threads,
                                        control=[("c", "c2"), ("o", "o2")], reverse=reverse,
                                        wrap=Filtered if subset_inputs else None),
        profiles, estimator=estimator_for(provider, threads), min_runs=min_runs, min_seconds=seconds,
        max_seconds=3 * seconds, settled=model_settled)
    wall = times.read_on(WALL)
    return Compared(model_verdict(times), float(np.median(wall["o"])), float(np.median(wall["c"])))
