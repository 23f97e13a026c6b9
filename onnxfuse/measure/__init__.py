"""Measure: how onnxfuse times models, the one home of the protocol that optimize's measured selection,
`bench`, `profile` and the HTML report all use. Below select/ and inspect/; imports validate/ (sessions) only.

- `clock.py`: the estimator: this thread's CPU time at one intra-op thread on the CPU, wall time otherwise.
- `sessions.py`: timing sessions at ORT_ENABLE_ALL, and the A/A control (a second session of one model).
- `timing.py`: the one timing loop (rounds in rotating order over the shape profiles, both clocks, on
  while the verdict is undecided and the deadline allows), and `Timings`.
- `stats.py`: paired ratios with a seeded bootstrap CI, and `judge`. `verdicts.py`: the one verdict, a variant
  against a base beyond the A/A noise floor, on the estimator.
- `compare.py`: one model against another on given inputs, by the same protocol (for benchmarks and experiments).
- `lock.py`: the timing lock: one process times at a time on this machine.
"""

from .clock import estimator_for
from .sessions import timing_sessions
from .stats import SIGNIFICANT, Ratio, judge, paired_ratio
from .timing import Timings, interleave
from .verdicts import Verdict, verdict

__all__ = ["SIGNIFICANT", "Ratio", "Timings", "Verdict", "estimator_for", "interleave", "judge", "paired_ratio",
           "timing_sessions", "verdict"]
