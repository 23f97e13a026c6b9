"""Inputs from an .npz file (`--inputs`): checked against the model's inputs, dtypes coerced where exact."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from ..errors import InputSpecError, first_line
from ..tensors import is_inexact
from .shapes import InputInfo, ShapeSpec, fmt_shape, np_dtype

# ---- npz -----------------------------------------------------------------------------------------------------


def load_npz(path: str, inputs: list[InputInfo]) -> dict[str, np.ndarray]:
    arrays = _read_npz(path)
    names = [i.name for i in inputs]
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise InputSpecError(
            f"{path}: array '{extra[0]}' is not a model input; model inputs are: {', '.join(names) or '(none)'}"
        )
    feeds: dict[str, np.ndarray] = {}
    bound: dict[str, tuple[int, str]] = {}  # symbolic dim -> (value, input that fixed it)
    for info in inputs:
        if info.name not in arrays:
            raise InputSpecError(f"{path}: missing array for model input '{info.name}'")
        feeds[info.name] = _check_npz_array(path, info, arrays[info.name], bound)
    return feeds


def _read_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise InputSpecError(f"inputs file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise InputSpecError(f"{path}: not an .npz archive (save inputs with numpy.savez)")
        with data:
            return {name: data[name] for name in data.files}
    except InputSpecError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputSpecError(f"{path}: cannot read .npz file: {first_line(str(exc))}") from exc


def _check_npz_array(
    path: str, info: InputInfo, arr: np.ndarray, bound: dict[str, tuple[int, str]]
) -> np.ndarray:
    arr = _coerce_dtype(path, info, arr)
    if info.shape is None:
        return arr
    if arr.ndim != len(info.shape):
        raise InputSpecError(
            f"{path}: input '{info.name}' has rank {arr.ndim} (shape {tuple(arr.shape)}), "
            f"the model expects rank {len(info.shape)} {fmt_shape(info.shape)}"
        )
    for axis, (want, got) in enumerate(zip(info.shape, arr.shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputSpecError(
                f"{path}: input '{info.name}' has shape {tuple(arr.shape)}, the model expects "
                f"{fmt_shape(info.shape)} (dim {axis} must be {want})"
            )
        if isinstance(want, str):
            _check_symbolic(path, info.name, want, got, bound)
    return arr


def _check_symbolic(path: str, name: str, dim: str, value: int, bound: dict[str, tuple[int, str]]) -> None:
    if dim not in bound:
        bound[dim] = (value, name)
        return
    prev_value, prev_name = bound[dim]
    if prev_value != value:
        raise InputSpecError(
            f"{path}: dimension '{dim}' is {prev_value} in input '{prev_name}' but {value} in input '{name}'"
        )


def _coerce_dtype(path: str, info: InputInfo, arr: np.ndarray) -> np.ndarray:
    want = np_dtype(info)
    if arr.dtype == want:
        return arr
    if np.can_cast(arr.dtype, want, casting="safe"):
        return arr.astype(want)
    both_float = is_inexact(arr.dtype) and is_inexact(want) and "c" not in (arr.dtype.kind, want.kind)
    both_int = arr.dtype.kind in "iu" and want.kind in "iu"
    if both_float:
        return arr.astype(want)
    if both_int and (arr.size == 0 or _ints_fit(arr, want)):
        return arr.astype(want)
    raise InputSpecError(
        f"{path}: input '{info.name}' has dtype {arr.dtype}, the model expects {info.type_name.lower()} ({want})"
    )


def _ints_fit(arr: np.ndarray, dtype: np.dtype) -> bool:
    limits = np.iinfo(dtype)
    return bool(int(arr.min()) >= limits.min and int(arr.max()) <= limits.max)


def check_npz_against_spec(feeds: dict[str, np.ndarray], shapes: ShapeSpec) -> None:
    for name, dims in shapes.tensors.items():
        got = tuple(feeds[name].shape)
        if got != tuple(dims):
            raise InputSpecError(
                f"--shape {name}:{'x'.join(map(str, dims))} disagrees with the inputs file {got}"
            )
