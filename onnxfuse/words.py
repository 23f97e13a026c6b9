"""Words in what onnxfuse prints: a count with its noun in the right number, and the close matches a
'did you mean' names (one source for both, so every command says them alike)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["close_matches", "count", "similarity"]

CUTOFF = 0.6  # difflib's similarity ratio a suggestion needs: below it, nothing is suggested


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 rule', '2 rules', '0 rules'; `plural` where adding an s is wrong ('near misses', 'tries')."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def close_matches(word: str, options: Iterable[str], n: int = 1) -> list[str]:
    """Up to `n` of `options` close to `word` (a misspelling), closest first; none when nothing is close."""
    return difflib.get_close_matches(word, list(options), n=n, cutoff=CUTOFF)


def similarity(a: str, b: str) -> float:
    """How alike two words are (0..1, difflib's ratio): what ranks close matches from several lists."""
    return difflib.SequenceMatcher(None, a, b).ratio()
