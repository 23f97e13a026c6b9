"""The paired ratio every verdict reads (speed itself is measured in benchmarks/)."""

import numpy as np

from onnxfuse.measure.stats import Ratio, paired_ratio


def test_paired_ratio_verdicts():
    ref = [1.0] * 50
    assert paired_ratio([0.9] * 50, ref).verdict == "faster"
    assert paired_ratio([1.1] * 50, ref).verdict == "slower"
    noisy = list(1 + 0.05 * np.random.default_rng(0).standard_normal(50))
    assert paired_ratio(noisy, ref).verdict == "no significant change"
    r = paired_ratio([0.9] * 50, ref)
    assert isinstance(r, Ratio) and r.low <= r.median <= r.high


def test_a_paired_ratio_is_the_same_for_the_same_timings():
    """Seeded bootstrap: a given set of timings always gives the same interval (and so the same decision)."""
    rng = np.random.default_rng(1)
    a, b = list(1 + 0.05 * rng.standard_normal(40)), list(1 + 0.05 * rng.standard_normal(40))
    assert paired_ratio(a, b) == paired_ratio(a, b)
