"""The statistics of a timing: the paired ratio of two sessions' times round by round, with a seeded bootstrap
95% confidence interval (a given set of timings always gives the same interval), and the one verdict every
command gives (`judge`): faster, slower, within the noise floor, no significant change, or undecided."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NOISE_PREFIX", "SIGNIFICANT", "UNDECIDED", "Ratio", "decided", "judge", "paired_ratio", "percentile",
           "profile_scale"]

SIGNIFICANT = 0.005  # a ratio's whole CI must clear 1 -/+ this (plus the noise floor) to count as a change
NOISE_PREFIX = "within the noise floor"
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        return self.verdict_beyond(0.0)

    def sign(self, margin: float) -> int:
        """1 where the whole CI lies below 1 - `margin` (faster), -1 above 1 + `margin` (slower), else 0."""
        return 1 if self.high < 1 - margin else -1 if self.low > 1 + margin else 0

    def faster_beyond(self, floor: float) -> bool:
        return self.sign(SIGNIFICANT + floor) > 0

    def verdict_beyond(self, floor: float) -> str:
        """faster/slower only if the whole CI clears 1 by SIGNIFICANT plus `floor` (an A/A difference)."""
        return judge(self, SIGNIFICANT + floor)

    def slower_beyond(self, floor: float) -> bool:
        """Measured slower: beyond the noise floor, or with the whole interval above 1 (by SIGNIFICANT) even where
        the floor is wider (a change measured slower has no evidence that it helps)."""
        return self.sign(SIGNIFICANT + floor) < 0 or self.sign(SIGNIFICANT) < 0

    def no_better(self, floor: float) -> bool:
        """Measured slower (`slower_beyond`), or no faster at all: the median at or above 1. A kept selection so
        measured on the whole model has no evidence there that it helps, whatever its parts measured alone."""
        return self.slower_beyond(floor) or self.median >= 1

    def final_word(self, floor: float) -> str:
        """The verdict on a kept selection: slower where `slower_beyond` says so, else `verdict_beyond`."""
        return "slower" if self.slower_beyond(floor) else self.verdict_beyond(floor)

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"


def judge(ratio: Ratio, margin: float) -> str:
    """"faster" / "slower" when the whole CI clears 1 by `margin`; a CI that excludes 1 but not by the margin
    is "within the noise floor (±X%)", not "no significant change", which would contradict the CI itself;
    "no significant change" is for a CI that contains 1."""
    if ratio.high < 1 - margin:
        return "faster"
    if ratio.low > 1 + margin:
        return "slower"
    if ratio.high < 1 or ratio.low > 1:
        return f"{NOISE_PREFIX} (±{margin:.1%}): not counted as {'faster' if ratio.high < 1 else 'slower'}"
    return "no significant change"


def decided(ratio: Ratio, margin: float) -> bool:
    """Whether more runs could still change whether `ratio` counts as faster by `margin`: decided when the whole
    CI lies on one side of 1 - margin (faster, or not faster whatever more runs show). A CI across that line is
    undecided: noise is a reason to measure longer, and what the budget leaves undecided is not "slower"."""
    return ratio.high < 1 - margin or ratio.low >= 1 - margin


def paired_ratio(variant: list[float], reference: list[float], seed: int = 0) -> Ratio:
    r = np.asarray(variant, dtype=np.float64) / np.asarray(reference, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(r, size=(1000, r.size), replace=True), axis=1)
    return Ratio(float(np.median(r)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))


def profile_scale(weight: float, reference: list[float], several: bool) -> float:
    """A shape profile's factor in a weighted total of run times: with several profiles, its weight divided by
    the reference's median time there, so that each profile counts by its weight and not by its duration (a
    decode step is 10-100x shorter than a prefill); with one, its weight."""
    return weight / max(float(np.median(reference)), 1e-12) if several else weight


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))
