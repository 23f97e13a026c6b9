"""A measured selection's report: one row per unit (GroupEffect), built at the end from the decisions
(region_select.py), and the selection as a whole (MeasureReport: the confirmation, the budget, the phases)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from ..measure.stats import Ratio
from ..regions.cut import Key  # one applied rewrite: (rule id, root value)
from ..validate.runtime import peak_rss_bytes

__all__ = ["GroupEffect", "Key", "MeasureReport", "Phases"]


@dataclass
class GroupEffect:
    group: str  # the fused op type(s) the group creates
    rules: list[str]
    rewrites: int
    kept: bool
    effect: Ratio | None = None  # latency with the group / without it, in the last round that measured it
    source: str = "timed"  # timed | cached (decided by an earlier run) | exact | untimed | budget (not reached)
    # | undecided (the budget ended with its interval across the line) | model (decided on the whole model)
    instances: int = 1  # regions decided together (alike regions are one class)
    floor: float = 0.0  # the noise floor of the round that decided it
    seconds_each: float = 0.0  # a region's original version, per run (region selection)
    share: float | None = None  # |1 - effect| x its regions' time, over the model's: what it changes of the model
    why: str = ""  # why it was not timed

    @property
    def gain(self) -> float | None:
        """Fraction of latency this group saves (negative: it costs)."""
        return None if self.effect is None else 1.0 - self.effect.median


@dataclass
class MeasureReport:
    provider: str
    threads: int
    rounds: int
    groups: list[GroupEffect] = field(default_factory=list)
    final: Ratio | None = None  # kept candidate vs original
    dropped_everything: bool = False
    seconds: float = 0.0
    note: str = ""
    strategy: str = ""  # "backward" (drop what costs) or "forward" (add what helps, after backward failed)
    floor: float = 0.0  # mean A/A offset of the two sessions of each model (the candidate's and its base's)
    denied: set[Key] = field(default_factory=set)  # rewrites left out of groups kept only in part (by region)
    confirmed: str = ""  # the whole-model confirmation: timed, cached, or skipped: why (region selection)
    undecided: int = 0  # region classes the budget did not reach (left as the original)
    budget_s: float = 0.0  # on the budget clock (measure/budget.py)
    spent_s: float = 0.0  # what measuring took on that clock (`seconds` is its wall time)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (region selection)
    phase_peaks: dict[str, int] = field(default_factory=dict)  # the process's peak RSS at the end of each phase
    # the whole-model confirmation per shape profile (prefill, decode): (name, weight, candidate / original)
    profiles: list[tuple[str, float, Ratio]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. what the decision cache left out, one line each
    estimator: str = ""  # the clock decisions were read on (measure/clock.py): cpu or wall
    final_wall: Ratio | None = None  # the confirmation on wall time, where the estimator is CPU time
    aa_spread: tuple[float, float] | None = None  # the confirmation's A/A contrast per round, p10 and p90

    def to_json(self) -> dict:
        return {
            "provider": self.provider, "threads": self.threads, "rounds": self.rounds, "seconds": self.seconds,
            "note": self.note, "final_ratio": None if self.final is None else asdict(self.final),
            "final_verdict": None if self.final is None else self.final.final_word(self.floor),
            "noise_floor": self.floor, "denied": [list(k) for k in sorted(self.denied)],
            "dropped_everything": self.dropped_everything,
            "groups": [{"group": g.group, "rules": g.rules, "rewrites": g.rewrites, "kept": g.kept, "gain": g.gain,
                        "with_over_without": None if g.effect is None else asdict(g.effect), "source": g.source,
                        "instances": g.instances, "noise_floor": g.floor, "share": g.share, "why": g.why}
                       for g in self.groups],
            "strategy": self.strategy, "confirmed": self.confirmed, "undecided": self.undecided,
            "budget_s": self.budget_s, "spent_s": self.spent_s, "phases": self.phases, "phase_peak_rss_bytes": self.phase_peaks,
            "profiles": [{"name": n, "weight": w, "ratio": asdict(r)} for n, w, r in self.profiles],
            "warnings": self.warnings, "estimator": self.estimator,
            "final_ratio_wall": None if self.final_wall is None else asdict(self.final_wall),
            "aa_spread": None if self.aa_spread is None else list(self.aa_spread),
        }

    @property
    def dropped_rules(self) -> list[str]:
        """Rules of dropped groups, except those a group kept in part (by region) still needs."""
        needed = {r for g in self.groups if g.kept for r in g.rules}
        return sorted({r for g in self.groups if not g.kept for r in g.rules} - needed)


class Phases:
    """Seconds per phase, added up (a phase may run twice)."""

    def __init__(self, into: dict[str, float], peaks: dict[str, int],
                 starting: Callable[[str], None] = lambda name: None) -> None:
        self.into, self.peaks, self.starting = into, peaks, starting

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.starting(name)
        t = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - t
            self.peaks[name] = peak_rss_bytes()
