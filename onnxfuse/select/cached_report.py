"""A measured selection's report as the decision cache keeps it: its own format, not the public `--json` schema
(renaming a key there must not silently break the reuse of every cached selection). `to_cache` and
`from_cache` are each other's inverse; cache_entries.py checks the shape when the file is read."""

from __future__ import annotations

from dataclasses import fields

from ..measure.stats import Ratio
from .report import GroupEffect, MeasureReport

__all__ = ["GROUP_FIELDS", "from_cache", "to_cache"]

# what a cached row keeps of a GroupEffect (seconds_each and share are this run's timing details, not a decision)
GROUP_FIELDS = tuple(f.name for f in fields(GroupEffect) if f.name not in ("seconds_each", "share"))


def _ratio(r: Ratio | None) -> list[float] | None:
    return None if r is None else [r.median, r.low, r.high]


def _unratio(v: list[float] | None) -> Ratio | None:
    return None if v is None else Ratio(*v)


def to_cache(report: MeasureReport) -> dict:
    return {"groups": [{f: _ratio(g.effect) if f == "effect" else getattr(g, f) for f in GROUP_FIELDS}
                       for g in report.groups],
            "final": _ratio(report.final), "floor": report.floor, "undecided": report.undecided,
            "confirmed": report.confirmed, "estimator": report.estimator,
            "profiles": [[n, w, _ratio(r)] for n, w, r in report.profiles]}


def from_cache(data: dict, into: MeasureReport) -> None:
    """The cached report's rows, final ratio and verdict inputs, into `into` (rows decided by timing become
    "cached")."""
    for g in data["groups"]:
        row = GroupEffect(**{f: _unratio(g[f]) if f == "effect" else g[f] for f in GROUP_FIELDS})
        if row.source in ("timed", "cached"):
            row.source = "cached"
        elif row.source == "model":
            row.why = "cached"
        into.groups.append(row)
    into.final, into.floor, into.undecided = _unratio(data["final"]), data["floor"], data["undecided"]
    into.confirmed = "cached" if data["confirmed"] == "timed" else data["confirmed"]
    into.profiles = [(n, w, Ratio(*r)) for n, w, r in data["profiles"]]
