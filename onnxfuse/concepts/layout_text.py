"""The layout text of the `layout(x, "b s (n d) -> b n s d")` concept: source axes and result axes as groups
of named atoms (einops-style), and the ops a concept's chain may consist of. The matcher proves a chain is the
layout (layout_proof.py); this module is the language side: parsing, with the column of a problem."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LAYOUT_OPS", "MASK_OPS", "SCALE_OPS", "Layout", "LayoutError", "parse_layout"]

# Ops that only move elements: a chain of them is a rearrangement.
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
# Ops that scale by a factor (`scale=S`): Mul by a scalar, Div by one.
SCALE_OPS = frozenset({"Mul", "Div"})
# the ops `masked(x, M)` walks through: Add of a term, Where(c, x, MIN) (a fill at most -1e30 or -inf)
MASK_OPS = frozenset({"Add", "Where"})


class LayoutError(ValueError):
    """A layout text that does not parse (with the offset of the problem)."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.message, self.offset = message, offset


@dataclass(frozen=True)
class Layout:
    """`b s (n d) -> b n s d`: the source's axes as groups of named atoms, and the result's."""

    text: str
    source: tuple[tuple[str, ...], ...]
    result: tuple[tuple[str, ...], ...]

    @property
    def atoms(self) -> tuple[str, ...]:
        return tuple(a for g in self.source for a in g)


_TOKEN = re.compile(r"\s*(?:(\()|(\))|([A-Za-z_][A-Za-z0-9_]*))")


def _side(text: str, base: int) -> tuple[tuple[str, ...], ...]:
    groups: list[tuple[str, ...]] = []
    open_: list[str] | None = None
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LayoutError(f"unexpected {text[pos:].strip()[0]!r} in a layout (axes are names, groups are "
                              "in parentheses)", base + pos + len(text[pos:]) - len(text[pos:].lstrip()))
        if m.group(1):
            if open_ is not None:
                raise LayoutError("groups do not nest", base + m.start(1))
            open_ = []
        elif m.group(2):
            if open_ is None:
                raise LayoutError("')' without '('", base + m.start(2))
            if not open_:
                raise LayoutError("an empty group '()'", base + m.start(2))
            groups.append(tuple(open_))
            open_ = None
        else:
            name = m.group(3)
            if open_ is not None:
                open_.append(name)
            else:
                groups.append((name,))
        pos = m.end()
    if open_ is not None:
        raise LayoutError("'(' without ')'", base + len(text))
    if not groups:
        raise LayoutError("a side of the layout names no axis", base)
    return tuple(groups)


def parse_layout(text: str) -> Layout:
    """Parse `source axes -> result axes`; every atom appears once on each side."""
    if text.count("->") != 1:
        raise LayoutError("a layout is 'source axes -> result axes', e.g. 'b s (n d) -> b n s d'")
    left, right = text.split("->")
    src, res = _side(left, 0), _side(right, len(left) + 2)
    for side, name in ((src, "source"), (res, "result")):
        atoms = [a for g in side for a in g]
        dup = next((a for a in atoms if atoms.count(a) > 1), None)
        if dup is not None:
            raise LayoutError(f"axis {dup!r} appears twice on the {name} side")
    a, b = {x for g in src for x in g}, {x for g in res for x in g}
    if a != b:
        odd = sorted(a ^ b)[0]
        raise LayoutError(f"axis {odd!r} is on one side of the layout only (a rearrangement keeps every axis)")
    return Layout(text.strip(), src, res)

