"""The one verdict: a variant against a base, beyond the noise floor that A/A pairs (two sessions of one of
them, or of each, sessions.py) show in the same rounds, on the estimator the timings were read with (clock.py). Optimize's
decisions and confirmation, `bench` and `profile` all judge through `verdict`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .clock import describe
from .stats import SIGNIFICANT, UNDECIDED, Ratio, decided, judge, paired_ratio

__all__ = ["MIN_FLOOR", "Verdict", "aa_contrast", "model_settled", "model_verdict", "offset", "reference",
           "region_verdict", "verdict"]

# The noise floor at least: one A/A pair is one sample of how much two sessions of one model differ (memory
# placement), and a small one is luck. In one quiet run of a small CNN the pairs of its ten region classes
# differed by 0.0% to 2.6%; with a floor of 0.0-0.1% a class whose effect was 0.4-0.6% (Conv + Relu, which
# onnxruntime fuses itself) counted as faster in one run and not in the next.
MIN_FLOOR = 0.005

Labels = str | tuple[str, str]  # one session, or an A/A pair (its rounds' mean is the reference)


@dataclass(frozen=True)
class Verdict:
    ratio: Ratio  # variant / base, per round
    floor: float  # what two sessions of one model differ by beyond their rounds' noise (`offset`)
    estimator: str  # the clock (clock.py)

    @property
    def margin(self) -> float:
        return SIGNIFICANT + self.floor

    @property
    def word(self) -> str:
        """faster / slower / within the noise floor (±margin) / no significant change."""
        return judge(self.ratio, self.margin)

    @property
    def faster(self) -> bool:
        return self.ratio.sign(self.margin) > 0

    @property
    def decided(self) -> bool:
        """Whether the ratio's interval lies clear of the "faster" line (stats.decided)."""
        return decided(self.ratio, self.margin)

    @property
    def outcome(self) -> str:
        """faster, or not faster (its verdict word), or undecided (the interval crosses the line)."""
        return self.word if self.decided or self.faster else UNDECIDED

    def line(self) -> str:
        """The ratio, the floor and the clock in one phrase (one floor, one number each)."""
        return (f"{self.ratio} on {describe(self.estimator)}, noise floor ±{self.floor:.1%}"
                f" ({self.word})")


def reference(times: Mapping[str, list[float]], labels: Labels) -> list[float]:
    """One session's per-round times, or an A/A pair's per-round mean."""
    if isinstance(labels, str):
        return times[labels]
    a, b = labels
    return [(x + y) / 2 for x, y in zip(times[a], times[b], strict=True)]


def offset(aa: Ratio) -> float:
    """What an A/A pair's two sessions differ by for sure: how far its interval lies from 1 (0 where it holds 1).

    Why not |median - 1|: that is the sessions' placement offset plus the sampling noise of a median of rounds,
    and the noise is the comparison's own interval's business already; counted again in the floor it made the
    margin itself a random number, and the same pair's verdict with it. gpt2_tiny against its output (an effect
    of 1.3-1.5%), 10 benches of 3 s with 2 busy loops on 2 cores: |median - 1| put the floor at 0.50-0.77% and
    3 of the 10 said "within the noise floor"; the interval's distance from 1 kept it at 0.50% (MIN_FLOOR), and
    9 of the 10 said faster, as optimize's confirmation did. A real offset (a session placed on slower memory,
    constant over rounds) keeps its interval clear of 1 and still counts whole."""
    return max(0.0, aa.low - 1, 1 - aa.high)


def verdict(times: Mapping[str, list[float]], variant: Labels, base: Labels, estimator: str = "") -> Verdict:
    """`variant` against `base`; one of them or both are A/A pairs, whose two sessions give the noise floor (the
    mean of the pairs' `offset`s, at least MIN_FLOOR). `times` is interleave's Timings (its estimator is used) or
    a plain mapping (then `estimator` names it)."""
    pairs = [p for p in (variant, base) if isinstance(p, tuple)]
    assert pairs, "one side must be an A/A pair"
    floor = max(MIN_FLOOR, sum(offset(paired_ratio(times[b], times[a])) for a, b in pairs) / len(pairs))
    return Verdict(paired_ratio(reference(times, variant), reference(times, base)), floor,
                   getattr(times, "estimator", estimator))


def aa_contrast(times) -> np.ndarray:
    """Per round, the four sessions' A/A contrast sqrt(c2/c x o2/o): a comparison of two sessions against two in
    which no change is (each side holds one session of each model), independent of the comparison itself and with
    the same per-round noise and the same variance of session offsets. Its spread is what the comparison shows of
    a change that is not there; one pair's ratio (c2 / c) spreads sqrt(2) times as wide."""
    c, c2, o, o2 = (np.asarray(times[k]) for k in ("c", "c2", "o", "o2"))
    return np.sqrt(c2 / c * (o2 / o))


def region_verdict(times) -> Verdict:
    """A region's fused version ("f") against the mean of two sessions of its original ("a", "b")."""
    return verdict(times, "f", ("a", "b"))


def model_verdict(times) -> Verdict:
    """A candidate (two sessions, "c", "c2") against its base (two, "o", "o2") on the whole model."""
    return verdict(times, ("c", "c2"), ("o", "o2"))


def model_settled(times) -> bool:
    """Whether a confirmation's verdict is clear of the faster line: while it is not, it runs on within the
    budget (a selection 1.6-2.4% faster against a 1% margin, gpt2_tiny's, was kept whole when its interval
    cleared the line and cut to its best group when it did not: two outputs for one model, by the load)."""
    return model_verdict(times).decided
