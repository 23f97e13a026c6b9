"""The one verdict: a variant against a base, beyond the noise floor that A/A pairs (two sessions of one model,
sessions.py) show in the same rounds, on the estimator the timings were read with (clock.py). Optimize's
decisions and confirmation, `bench` and `profile` all judge through `verdict`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .clock import describe
from .stats import SIGNIFICANT, UNDECIDED, Ratio, decided, judge, paired_ratio

__all__ = ["MIN_FLOOR", "Verdict", "aa_contrast", "model_settled", "model_verdict", "offset", "reference",
           "region_verdict", "verdict"]

MIN_FLOOR = 0.005  # the noise floor at least: one A/A pair is one sample, a small one luck (a small CNN's ten
# class pairs differed by 0.0-2.6% in one quiet run; with a 0-0.1% floor a 0.5% Conv + Relu class flipped)

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
    Not |median - 1|, which adds the rounds' sampling noise (the comparison's own interval counts that already) and
    made the margin a random number (docs/measured-selection.md, "Sessions"); a real offset keeps its interval
    clear of 1 and counts whole."""
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
    """Per round, the four sessions' A/A contrast sqrt(c2/c x o2/o): two sessions against two with no change between
    them, with the comparison's per-round noise and variance of session offsets; its spread is what the comparison
    shows of a change that is not there (one pair's ratio spreads sqrt(2) times as wide)."""
    c, c2, o, o2 = (np.asarray(times[k]) for k in ("c", "c2", "o", "o2"))
    return np.sqrt(c2 / c * (o2 / o))


def region_verdict(times) -> Verdict:
    """A region's fused version ("f") against the mean of two sessions of its original ("a", "b")."""
    return verdict(times, "f", ("a", "b"))


def model_verdict(times) -> Verdict:
    """A candidate (two sessions, "c", "c2") against its base (two, "o", "o2") on the whole model."""
    return verdict(times, ("c", "c2"), ("o", "o2"))


def model_settled(times) -> bool:
    """Whether a confirmation's verdict is clear of the faster line; while it is not, it runs on within the budget
    (gpt2_tiny's selection, 1.6-2.4% faster against a 1% margin, was kept whole or cut by the load before)."""
    return model_verdict(times).decided
