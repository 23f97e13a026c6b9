"""Inputs from an .npz file (`--inputs`): checked against the model's inputs, dtypes coerced where exact."""

from __future__ import annotations

import zipfile

import numpy as np

from ..errors import InputSpecError, first_line
from ..files import NotRegularFile, open_regular
from ..tensors import is_inexact
from .budget import BUDGET_FRACTION, default_budget_bytes, fmt_bytes
from .shapes import InputInfo, ShapeSpec, fmt_shape, np_dtype

# ---- npz -----------------------------------------------------------------------------------------------------


def load_npz(path: str, inputs: list[InputInfo]) -> dict[str, np.ndarray]:
    """The model's inputs from `path`. Each array's .npy header is read and checked against the model's input
    (name, rank, fixed dims) and the memory budget before its data is read: an archive whose header declares
    32 GB is one line, not a MemoryError."""
    arrays = _read_npz(path, inputs)
    feeds: dict[str, np.ndarray] = {}
    bound: dict[str, tuple[int, str]] = {}  # symbolic dim -> (value, input that fixed it)
    for info in inputs:
        if info.name not in arrays:
            raise InputSpecError(f"{path}: missing array for model input '{info.name}'")
        feeds[info.name] = _check_npz_array(path, info, arrays[info.name], bound)
    return feeds


def _read_npz(path: str, inputs: list[InputInfo]) -> dict[str, np.ndarray]:
    """The arrays of a regular .npz file (a FIFO or a device is refused before it is read), each read only
    after its header passed _check_header."""
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise InputSpecError(f"inputs file not found: {path}") from None
    except NotRegularFile as e:
        if e.kind == "a directory":
            raise InputSpecError(f"inputs file not found: {path}") from None
        raise InputSpecError(f"{path}: is {e.kind}, not an .npz file (an inputs file must be a regular "
                             "file)") from None
    except OSError as exc:
        raise InputSpecError(f"{path}: cannot read .npz file: {first_line(str(exc))}") from None
    with f:
        if f.read(6) == b"\x93NUMPY":
            raise InputSpecError(f"{path}: not an .npz archive (save inputs with numpy.savez)")
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as z:
                return _read_members(path, z, inputs)
        except InputSpecError:
            raise
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, NotImplementedError) as exc:
            raise InputSpecError(f"{path}: cannot read .npz file: {first_line(str(exc))}") from None


def _read_members(path: str, z: zipfile.ZipFile, inputs: list[InputInfo]) -> dict[str, np.ndarray]:
    by_name = {i.name: i for i in inputs}
    budget = default_budget_bytes()
    out: dict[str, np.ndarray] = {}
    total = 0
    for member in z.infolist():
        if member.is_dir():
            continue
        name = member.filename.removesuffix(".npy")
        if name not in by_name:
            raise InputSpecError(f"{path}: array '{name}' is not a model input; model inputs are: "
                                 f"{', '.join(by_name) or '(none)'}")
        with z.open(member) as m:
            shape, _, dtype = _header(path, name, m)
        total += _check_header(path, by_name[name], shape, dtype, budget - total)
        with z.open(member) as m:  # read_array reads the header again
            out[name] = np.lib.format.read_array(m, allow_pickle=False)
    return out


def _header(path: str, name: str, m) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) from the .npy header of one archive member, nothing else read."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(m)
        if version == (1, 0):
            return fmt.read_array_header_1_0(m)
        if version == (2, 0):
            return fmt.read_array_header_2_0(m)
    except ValueError as exc:
        raise InputSpecError(f"{path}: array '{name}' is not an .npy array ({first_line(str(exc))})") from None
    raise InputSpecError(f"{path}: array '{name}' has .npy format version {version[0]}.{version[1]}, which "
                         "onnxfuse does not read (save inputs with numpy.savez)")


def _check_header(path: str, info: InputInfo, shape: tuple[int, ...], dtype: np.dtype, left: int) -> int:
    """The bytes the declared array holds; refused when it cannot be the model's input (rank, fixed dims) or
    would not fit what is left of the memory budget."""
    if dtype.hasobject:
        raise InputSpecError(f"{path}: array '{info.name}' holds Python objects ({dtype}), not numbers")
    if info.shape is not None:
        _check_shape(path, info, shape)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > left:
        raise InputSpecError(f"{path}: array '{info.name}' declares shape {tuple(shape)} {dtype} "
                             f"({fmt_bytes(nbytes)}), more than the memory budget leaves for it ({fmt_bytes(left)}: "
                             f"{BUDGET_FRACTION:.0%} of the memory available)")
    return nbytes


def _check_shape(path: str, info: InputInfo, shape: tuple[int, ...]) -> None:
    assert info.shape is not None
    if len(shape) != len(info.shape):
        raise InputSpecError(
            f"{path}: input '{info.name}' has rank {len(shape)} (shape {tuple(shape)}), "
            f"the model expects rank {len(info.shape)} {fmt_shape(info.shape)}"
        )
    for axis, (want, got) in enumerate(zip(info.shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputSpecError(
                f"{path}: input '{info.name}' has shape {tuple(shape)}, the model expects "
                f"{fmt_shape(info.shape)} (dim {axis} must be {want})"
            )


def _check_npz_array(
    path: str, info: InputInfo, arr: np.ndarray, bound: dict[str, tuple[int, str]]
) -> np.ndarray:
    arr = _coerce_dtype(path, info, arr)
    if info.shape is None:
        return arr
    _check_shape(path, info, arr.shape)
    for want, got in zip(info.shape, arr.shape, strict=True):
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
