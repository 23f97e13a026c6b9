"""Output comparison: each output of the optimized model against the original's, within a tolerance by dtype
(max abs/rel error, cosine, the smallest tolerance that would pass, NaN/Inf accounting)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from ..tensors import is_inexact
from ..words import count

__all__ = ["OutputCheck", "Tolerance", "compare_one", "compare_outputs", "default_tolerance", "is_inexact"]

# --------------------------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Tolerance:
    rtol: float
    atol: float


_FLOAT_WIDE = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.COMPLEX64, TensorProto.COMPLEX128}
_FLOAT_NARROW = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


def default_tolerance(elem_type: int) -> Tolerance:
    """fp32/fp64: 1e-4; fp16/bf16 (and smaller floats): 1e-2; integers and bool: exact."""
    if elem_type in _FLOAT_WIDE:
        return Tolerance(rtol=1e-4, atol=1e-4)
    if elem_type in _FLOAT_NARROW or _is_float8(elem_type):
        return Tolerance(rtol=1e-2, atol=1e-2)
    return Tolerance(rtol=0.0, atol=0.0)


def _is_float8(elem_type: int) -> bool:
    return helper.tensor_dtype_to_string(elem_type).startswith("TensorProto.FLOAT8")


# --------------------------------------------------------------------------------------------------------------
# compare_outputs
# --------------------------------------------------------------------------------------------------------------

_TINY = 1e-12
_EXACT = Tolerance(rtol=0.0, atol=0.0)


@dataclass
class OutputCheck:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    cosine: float
    min_tolerance: float
    tolerance: Tolerance
    passed: bool
    ref_nan: int
    new_nan: int
    note: str
    decided_by: str = ""  # the tolerance that bounds the closest-to-failing element: "atol" (atol >= rtol * |ref|
    # there) or "rtol"; "exact" (compared exactly), "equal" (no element differs), "" (not compared)


def compare_outputs(
    ref: dict[str, np.ndarray], got: dict[str, np.ndarray], tolerance: Tolerance | None = None
) -> list[OutputCheck]:
    """One check per output (reference order, then outputs only the optimized model has)."""
    checks = [compare_one(name, ref[name], got.get(name), tolerance) for name in ref]
    checks += [
        _missing_check(name, got[name], "output only in the optimized model")
        for name in got
        if name not in ref
    ]
    return checks


def _tolerance_for(dtype: np.dtype, tolerance: Tolerance | None) -> Tolerance:
    if not is_inexact(dtype):
        return _EXACT  # integer / bool / string outputs are always compared exactly
    if tolerance is not None:
        return tolerance
    try:
        return default_tolerance(helper.np_dtype_to_tensor_dtype(dtype))
    except Exception:  # dtypes onnx does not know
        return Tolerance(rtol=1e-4, atol=1e-4)


def _missing_check(name: str, arr: np.ndarray, note: str) -> OutputCheck:
    arr = np.asarray(arr)
    return OutputCheck(
        name=name,
        dtype=arr.dtype.name,
        shape=tuple(arr.shape),
        max_abs=math.nan,
        max_rel=math.nan,
        cosine=math.nan,
        min_tolerance=math.nan,
        tolerance=_EXACT,
        passed=False,
        ref_nan=0,
        new_nan=0,
        note=note,
    )


def _mismatch_check(name: str, a: np.ndarray, tol: Tolerance, note: str) -> OutputCheck:
    check = _missing_check(name, a, note)
    check.tolerance = tol
    check.ref_nan = _count_nonfinite(a)
    return check


def _count_nonfinite(arr: np.ndarray) -> int:
    if not is_inexact(arr.dtype):
        return 0
    return int(np.count_nonzero(~np.isfinite(arr)))


def _widen(arr: np.ndarray) -> np.ndarray:
    """float64 (complex128 for complex) copy, flattened; bool becomes 0/1."""
    if arr.dtype.kind == "c":
        return arr.astype(np.complex128).ravel()
    return arr.astype(np.int64 if arr.dtype == np.bool_ else np.float64).astype(np.float64, copy=False).ravel()


def compare_one(
    name: str, ref: np.ndarray, got: np.ndarray | None, tolerance: Tolerance | None = None
) -> OutputCheck:
    if got is None:
        return _missing_check(name, ref, "output missing from the optimized model")
    ref, got = np.asarray(ref), np.asarray(got)
    tol = _tolerance_for(ref.dtype, tolerance)
    if ref.dtype != got.dtype:
        return _mismatch_check(name, ref, tol, f"dtype mismatch {ref.dtype.name} vs {got.dtype.name}")
    if ref.shape != got.shape:
        return _mismatch_check(name, ref, tol, f"shape mismatch {tuple(ref.shape)} vs {tuple(got.shape)}")
    if ref.dtype.kind in "OSU" or (ref.dtype.kind == "V" and not is_inexact(ref.dtype)):
        return _compare_exact_objects(name, ref, got, tol)
    return _compare_numeric(name, ref, got, tol)


def _compare_exact_objects(name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    differing = int(np.count_nonzero(ref != got)) if ref.size else 0
    return OutputCheck(
        name=name,
        dtype=ref.dtype.name,
        shape=tuple(ref.shape),
        max_abs=math.nan if differing else 0.0,
        max_rel=math.nan if differing else 0.0,
        cosine=math.nan if differing else 1.0,
        min_tolerance=math.nan if differing else 0.0,
        tolerance=tol,
        passed=differing == 0,
        ref_nan=0,
        new_nan=0,
        note=f"{count(differing, 'element differs', 'elements differ')}" if differing else "",
        decided_by="exact",
    )


@dataclass
class _Stats:
    max_abs: float
    max_rel: float
    cosine: float
    min_tolerance: float
    within: bool
    decided_by: str = "equal"


COMPARE_CHUNK = 1 << 20  # elements widened to float64 at a time: a 256 MB output costs 8 MB of temporaries, not 2 GB


def _chunks(ref: np.ndarray, got: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, int, int, int]]:
    """(ref, got, ref non-finite, new non-finite, lost non-finite) per chunk of the flattened outputs, as float64 (or
    complex128) at the positions where both are finite."""
    rf, gf = ref.reshape(-1), got.reshape(-1)
    for lo in range(0, rf.size, COMPARE_CHUNK):
        r, g = _widen(rf[lo:lo + COMPARE_CHUNK]), _widen(gf[lo:lo + COMPARE_CHUNK])
        ref_finite, got_finite = np.isfinite(r), np.isfinite(g)
        if ref_finite.all() and got_finite.all():  # the usual case: no copies of the finite positions
            yield r, g, 0, 0, 0
            continue
        both = ref_finite & got_finite
        yield (r[both], g[both], int(np.count_nonzero(~ref_finite)), int(np.count_nonzero(~got_finite & ref_finite)),
               int(np.count_nonzero(~ref_finite & got_finite)))


def _compare_numeric(name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    """Metrics over positions where both values are finite, a chunk at a time (two passes: the relative error's
    floor is 0.1% of the output's mean magnitude)."""
    exact = not is_inexact(ref.dtype)
    ref_nan = new_nan = lost_nan = count = 0
    sum_abs = max_abs = min_tol = nr2 = ng2 = 0.0
    dot: complex = 0.0
    within = True
    worst, decided = 0.0, "exact" if exact else "equal"
    for r, g, rn, nn, ln in _chunks(ref, got):
        ref_nan, new_nan, lost_nan = ref_nan + rn, new_nan + nn, lost_nan + ln
        if not r.size:
            continue
        diff, absr = np.abs(r - g), np.abs(r)
        count += r.size
        sum_abs += float(absr.sum())
        max_abs = max(max_abs, float(diff.max()))
        min_tol = max(min_tol, float((diff / (1.0 + absr)).max()))
        within = within and (bool(np.all(diff == 0)) if exact else bool(np.all(diff <= tol.atol + tol.rtol * absr)))
        if not exact and diff.max() > 0:  # the element nearest its bound: which term of atol + rtol * |ref| is larger
            share = diff / np.maximum(tol.atol + tol.rtol * absr, _TINY)
            i = int(np.argmax(share))
            if share[i] > worst:
                worst, decided = float(share[i]), "atol" if tol.atol >= tol.rtol * absr[i] else "rtol"
        dot += np.vdot(r, g)
        nr2, ng2 = nr2 + float(np.vdot(r, r).real), ng2 + float(np.vdot(g, g).real)
    max_rel = 0.0
    if count and max_abs > 0:
        # relative to each value, floored at 0.1% of the output's mean magnitude: values near zero would
        # otherwise report huge relative errors for tiny absolute ones
        floor = max(_TINY, 1e-3 * sum_abs / count)
        for r, g, *_ in _chunks(ref, got):
            if r.size:
                max_rel = max(max_rel, float((np.abs(r - g) / np.maximum(np.abs(r), floor)).max()))
    cosine = 1.0 if max_abs == 0.0 else 0.0 if nr2 == 0.0 or ng2 == 0.0 else \
        float(np.clip(np.real(dot) / (math.sqrt(nr2) * math.sqrt(ng2)), -1.0, 1.0))
    stats = _Stats(max_abs, max_rel, cosine, min_tol, within, decided)
    if exact:
        stats.within = bool(np.array_equal(ref, got))  # no float64 rounding for large int64 values
    notes = _nan_notes(ref_nan, new_nan, lost_nan)
    if not stats.within:
        notes.append(_tolerance_note(stats, tol, exact))
    return OutputCheck(
        name=name,
        dtype=ref.dtype.name,
        shape=tuple(ref.shape),
        max_abs=stats.max_abs,
        max_rel=stats.max_rel,
        cosine=stats.cosine,
        min_tolerance=stats.min_tolerance,
        tolerance=tol,
        passed=stats.within and new_nan == 0 and lost_nan == 0,
        ref_nan=ref_nan,
        new_nan=new_nan,
        note="; ".join(notes),
        decided_by="exact" if exact else stats.decided_by,
    )


def _nan_notes(ref_nan: int, new_nan: int, lost_nan: int) -> list[str]:
    notes: list[str] = []
    if ref_nan:
        notes.append(f"original output already contains {ref_nan} NaN/Inf; compared the finite positions")
    if lost_nan:
        notes.append(f"optimized output is finite at {lost_nan} of those positions")
    if new_nan:
        notes.append(f"optimized output has {new_nan} new NaN/Inf")
    return notes


def _tolerance_note(stats: _Stats, tol: Tolerance, exact: bool) -> str:
    if exact:
        return "values differ (exact match required)"
    return f"max abs diff {stats.max_abs:.3g} exceeds atol={tol.atol:g} + rtol={tol.rtol:g}*|ref|"
