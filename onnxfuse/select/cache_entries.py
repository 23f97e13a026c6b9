"""The shape of a decision cache entry, checked when the file is read: the cache is edited by hand, written by
other versions, or damaged, and an entry of the wrong shape is dropped (a miss), never a failed run.

Each kind's entry is a JSON object; SHAPES lists, per kind, the fields its readers use (region_run.py,
region_select.py, on_model.py, cli/cache.py), each with its check and whether it must be there."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["entry_problem"]

Check = Callable[[object], bool]


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: object) -> bool:
    return isinstance(v, str)


def _bool(v: object) -> bool:
    return isinstance(v, bool)


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _tuple(*checks: Check) -> Check:
    return lambda v: isinstance(v, list) and len(v) == len(checks) and all(c(x) for c, x in zip(checks, v,
                                                                                                  strict=True))


def _obj(fields: dict[str, tuple[Check, bool]], exact: bool = False) -> Check:
    """An object with these fields (and, `exact`, no others: it is passed on as keyword arguments)."""
    return lambda v: isinstance(v, dict) and _problem(v, fields) is None and (not exact or set(v) == set(fields))


_RATIO = _tuple(_num, _num, _num)  # [median, low, high]
_RATIO_OBJ = _obj({"median": (_num, True), "low": (_num, True), "high": (_num, True)}, exact=True)
_KEY = _tuple(_str, _str)  # one applied rewrite: [rule id, root value]
_COMMON: dict[str, tuple[Check, bool]] = {
    "kind": (_str, True), "when": (_str, False), "source": (_str, False), "budget": (_num, False),
    "why": (_str, False), "rules": (_list(_str), False), "model": (_opt(_str), False),
    "threads": (_opt(_int), False), "ratio": (_opt(_RATIO), False), "floor": (_num, False),
    "label": (_str, False), "profiles": (_list(_tuple(_str, _num, _RATIO)), False),
}
_GROUP = _obj({"group": (_str, True), "rules": (_list(_str), True), "rewrites": (_int, True),
               "kept": (_bool, True), "effect": (_opt(_RATIO), True), "source": (_str, True),
               "instances": (_int, True), "floor": (_num, True), "why": (_str, True)}, exact=True)
_REPORT = _obj({"groups": (_list(_GROUP), True), "final": (_opt(_RATIO), True), "floor": (_num, True),
                "undecided": (_int, True), "confirmed": (_str, True), "estimator": (_str, True),
                "profiles": (_list(_tuple(_str, _num, _RATIO)), True)})  # cached_report.py's format
SHAPES: dict[str, dict[str, tuple[Check, bool]]] = {
    "region": {**_COMMON, "ratio": (_RATIO, True), "share": (_num, False)},  # evidence, not a decision
    "model": _COMMON,
    "on model": _COMMON,
    "selection": {**_COMMON, "kept": (_list(_KEY), True), "dropped": (_list(_KEY), True),
                  "dropped_everything": (_bool, True), "undecided": (_int, True), "budget": (_num, True),
                  "report": (_REPORT, True)},
}


def _problem(entry: dict, fields: dict[str, tuple[Check, bool]]) -> str | None:
    for name, (check, required) in fields.items():
        if name not in entry:
            if required:
                return f"no {name!r}"
        elif not check(entry[name]):
            return f"{name!r} of the wrong type"
    return None


def entry_problem(entry: object) -> str | None:
    """What is wrong with one cache entry (a few words), None when its readers can use it."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not an object"
    kind = entry.get("kind")
    if not isinstance(kind, str):
        return "no 'kind'" if kind is None else "'kind' of the wrong type"
    if kind not in SHAPES:
        return f"unknown kind {kind[:20]!r}"
    return _problem(entry, SHAPES[kind])
