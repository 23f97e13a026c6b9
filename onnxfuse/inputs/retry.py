"""Retries read from onnxruntime's errors: when the original fails on a candidate set of shapes, what its error
message says to try next (dims that must be equal, a multiple, a given value). The search is discover.py."""

from __future__ import annotations

import math
import re

import numpy as np

from .roles import DimState

__all__ = ["retry_from_error", "short_message"]



def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def retry_from_error(message: str, values: dict[str, int], dims: dict[str, DimState]) -> list[tuple[dict, str]]:
    """Next tries a failed run suggests, with why, for one free dim: a Reshape whose target is fully known needs
    exactly its element count (scale the dim by requested/actual: {33,2,256} -> {20,8,64} takes 15840 samples to
    9600); one with a -1 needs a multiple of the known dims' product (the largest multiple below); a broadcast of
    v against k takes k."""
    out_eq = _equalize(message, values, dims)
    free = [k for k, d in dims.items() if d.fixed is None and d.role not in ("past", "total")]
    if len(free) != 1:
        return out_eq
    key = free[0]
    v = values[key]
    out: list[tuple[dict, str]] = []
    m = re.search(r"Input shape:\s*\{([-\d, ]*)\},\s*requested shape:\s*\{([-\d, ]+)\}", message)
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", message)
    where = (f"{node[-1][0]} '{node[-1][1]}'" if node[-1][1] else node[-1][0]) if node else "a Reshape"
    if m:
        have, want = _ints(m.group(1)), _ints(m.group(2))
        want = [have[i] if w == 0 and i < len(have) else w for i, w in enumerate(want)]
        n_have = int(np.prod(have, dtype=np.int64)) if have else 1
        if -1 not in want:
            n_want = int(np.prod(want, dtype=np.int64))
            if n_have and (v * n_want) % n_have == 0 and v * n_want // n_have > 0:
                out.append(({**values, key: v * n_want // n_have},
                            f"{where} needs exactly {'x'.join(map(str, want))} elements"))
        else:
            p = int(np.prod([w for w in want if w != -1], dtype=np.int64))
            if p > 0 and n_have % v == 0:
                step = p // math.gcd(p, n_have // v)
                if v // step * step > 0 and v % step:
                    out.append(({**values, key: v // step * step}, f"{where} cuts it into multiples of {step}"))
        for k in sorted({w for w in want if w > 1 and v % w}, reverse=True):  # frames of a size named there
            if v // k * k > 0 and all(t[key] != v // k * k for t, _ in out):
                out.append(({**values, key: v // k * k}, f"{where} cuts it into frames of {k}"))
    b = re.search(r"broadcast an axis by a dimension other than 1\. (\d+) by (\d+)", message)
    if b and v in (int(b.group(1)), int(b.group(2))):
        k = int(b.group(2)) if int(b.group(1)) == v else int(b.group(1))
        if k > 1:
            out.append(({**values, key: k}, f"broadcast against {k} ({where})"))
    return out + [t for t in out_eq if all(t[0] != o[0] for o in out)]


def _equalize(message: str, values: dict[str, int], dims: dict[str, DimState]) -> list[tuple[dict, str]]:
    """Tries from an error that says two dims must be equal, whatever the number of free dims: an LSTM/GRU state
    that 'must have shape {1,2,128}. Actual:{1,1,128}', a Concat's 'mismatched dimensions of 2 and 1', a
    broadcast of 3 by 5. Each dim (free, or the default batch) now at the wrong value is tried at the right one;
    for the symmetric messages, both ways."""
    pairs: list[tuple[int, int]] = []  # (wanted, given)
    m = re.search(r"must have shape\s*\{([-\d, ]*)\}\.?\s*Actual:?\s*\{([-\d, ]*)\}", message)
    if m:
        pairs += [(w, h) for w, h in zip(_ints(m.group(1)), _ints(m.group(2)), strict=False) if w != h and w > 0]
    for pat in (r"mismatched dimensions of (\d+) and (\d+)", r"broadcast an axis by a dimension other than 1\. "
                r"(\d+) by (\d+)"):
        for a, b in re.findall(pat, message):
            pairs += [(int(a), int(b)), (int(b), int(a))]
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", message)
    where = (f"{node[-1][0]} '{node[-1][1]}'" if node[-1][1] else node[-1][0]) if node else "a node"
    movable = [k for k, d in dims.items() if d.role not in ("past", "total") and (d.fixed is None or d.why == "batch")]
    # a contrib op's check that an input's dim is one of the op's sizes: RotaryEmbedding's "Input 'position_ids'
    # dimension 0 should be of size batch_size, got 1" (position ids [1, s] shared by the batch): that size is
    # what the input holds, so each dim named like it (batch_size: the batch) is tried there
    for size, got in re.findall(r"dimension \d+ should be of size (\w+), got (\d+)", message):
        named = [k for k in movable if dims[k].role in size]  # batch_size: the batch's role
        pairs += [(int(got), values[k]) for k in named or movable if values[k] != int(got)]
    out: list[tuple[dict, str]] = []
    for want, have in dict.fromkeys(pairs):
        for k in movable:
            if values[k] == have and want > 0:
                tried = {**values, k: want}
                if all(t != tried for t, _ in out):
                    out.append((tried, f"{where} needs {want} where {have} was given"))
    return out


def short_message(message: str, limit: int = 160) -> str:
    """onnxruntime's innermost status message (it nests one per If/Loop level), on one line."""
    text = " ".join(message.removeprefix("onnxruntime failed to run the model: ").split())
    inner = text.rsplit("Status Message: ", 1)[-1]
    inner = re.sub(r"^/\S+:\d+ .*? was false\. ", "", inner)  # onnxruntime's source line and failed condition
    inner = re.sub(r"^/\S+:\d+ \S+\(.*?\) ", "", inner)
    node = re.findall(r"running (\w+) node\. Name:'([^']*)'", text)
    where = f"{node[-1][0]} '{node[-1][1]}': " if node else ""
    out = where + inner
    return out if len(out) <= limit else out[: limit - 3] + "..."
