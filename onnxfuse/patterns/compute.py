"""A small, safe expression language for computed constants and rewrite attributes.

Expressions are parsed by Python's `ast` module and interpreted here node by node; nothing is ever passed to
`eval`. Only the operators, functions and fields listed below exist. Floating values are computed in float64
and a computed tensor is stored in the dtype of the first floating input it read (so a folded Conv weight
stays float32 when the model is float32).

    names      bound values (their constant value), bound nodes (for `node.attr`), earlier compute names
    fields     see VALUE_FIELDS (values) and NODE_FIELDS (matched nodes)
    operators  + - * / // % ** @ unary - + not, and/or, comparisons, x if c else y, indexing and slicing,
               [lists], (tuples)
    functions  see FUNCTIONS (each with its doc line and an example; docs/patterns.md lists them)
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from .syntax import SyntaxProblem, offset_of, parse_python
from .vocab import DTYPES, Field, Function, Table


class ComputeError(Exception):
    """Evaluation failed for this match (e.g. a value that is not constant); the rule does not apply."""


MAX_ELEMENTS = 1 << 28


def _matmul_view(rank: int, trans_batch: int, trans: int) -> list[int]:
    """FusedMatMul's view of an operand (onnxruntime's kernel, checked on every combination at ranks 3 and 4)."""
    if trans_batch and trans:
        return [*range(1, rank), 0]
    if trans_batch:
        return [*range(1, rank - 1), 0, rank - 1]
    if trans:
        return [*range(rank - 2), rank - 1, rank - 2]
    return list(range(rank))


def _matmul_flags(perm) -> list[int]:
    p = [int(x) for x in np.asarray(perm).reshape(-1)]
    for tb in (0, 1) if len(p) >= 3 else (0,):
        for t in (0, 1):
            if _matmul_view(len(p), tb, t) == p:
                return [tb, t]
    return [-1, -1]


def _dims(shape) -> list[int]:
    dims = [int(s) for s in np.asarray(shape).reshape(-1)]
    if any(d < 0 for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise ComputeError(f"shape {dims} is negative or too large")
    return dims


def _reshape(x, shape):
    return np.reshape(np.asarray(x), [int(s) for s in np.asarray(shape).reshape(-1)])


def _pow(a, b):
    if isinstance(b, int) and not isinstance(b, bool) and abs(b) > 64:
        raise ComputeError("exponent too large")
    return a**b


def _default(x, fallback):
    return fallback if x is None else x


def _astype(x, dtype):
    """x in the element type an ONNX name gives (X.dtype: float, float16, double, ...)."""
    name = str(dtype)
    code = DTYPES.get(name) or DTYPES.get(name.removeprefix("tensor(").removesuffix(")"))
    if code is None:
        raise ComputeError(f"unknown element type {name!r}")
    return np.asarray(x).astype(onnx.helper.tensor_dtype_to_np_dtype(code))


def _broadcasts_into(small, big) -> bool:
    """Broadcasting dims `small` against `big` (-1: unknown) leaves `big` as it is."""
    small = [int(d) for d in np.asarray(small).reshape(-1)]
    big = [int(d) for d in np.asarray(big).reshape(-1)]
    if len(small) > len(big):
        return False
    return all(s == 1 or (s >= 0 and s == b) for s, b in zip(small, big[len(big) - len(small):], strict=True))


FUNCTIONS: Table[Function] = Table("Functions", "Functions of `compute`, `require` and rewrite attribute values.", [
    Function("sqrt", np.sqrt, "x", "Square root, element-wise.", "sqrt(4.0)", 2.0),
    Function("exp", np.exp, "x", "e to the power x, element-wise.", "exp(0.0)", 1.0),
    Function("log", np.log, "x", "Natural logarithm, element-wise.", "log(1.0)", 0.0),
    Function("abs", np.abs, "x", "Absolute value, element-wise.", "abs([-2, 3])", [2, 3]),
    Function("reshape", _reshape, "x, shape", "x with a new shape (numpy rules: -1 takes the remaining size).",
       "reshape([1, 2, 3, 4], [2, -1])", [[1, 2], [3, 4]]),
    Function("transpose", lambda x, perm=None: np.transpose(np.asarray(x), perm), "x, perm=None",
       "x with its axes permuted (reversed without perm).", "transpose([[1, 2]], [1, 0])", [[1], [2]]),
    Function("concat", lambda xs, axis=0: np.concatenate([np.asarray(x) for x in xs], axis=int(axis)), "xs, axis=0",
       "The tensors of the list xs joined along an existing axis.", "concat([[1, 2], [3]])", [1, 2, 3]),
    Function("stack", lambda xs, axis=0: np.stack([np.asarray(x) for x in xs], axis=int(axis)), "xs, axis=0",
       "The tensors of the list xs joined along a new axis.", "stack([[1, 2], [3, 4]], axis=1)", [[1, 3], [2, 4]]),
    Function("squeeze", lambda x, axis=None: np.squeeze(np.asarray(x), axis), "x, axis=None",
       "x without its size-1 axes (or only axis).", "squeeze([[1, 2]])", [1, 2]),
    Function("expand_dims", lambda x, axis: np.expand_dims(np.asarray(x), int(axis)), "x, axis",
       "x with a new size-1 axis at axis.", "expand_dims([1, 2], 0)", [[1, 2]]),
    Function("zeros", lambda shape: np.zeros(_dims(shape)), "shape", "A tensor of zeros.", "zeros([2])", [0.0, 0.0]),
    Function("ones", lambda shape: np.ones(_dims(shape)), "shape", "A tensor of ones.", "ones([2])", [1.0, 1.0]),
    Function("full", lambda shape, v: np.full(_dims(shape), v), "shape, v", "A tensor filled with v.", "full([2], 7)",
       [7, 7]),
    Function("float", lambda x: float(np.asarray(x).reshape(-1)[0]) if np.size(x) == 1 else float(x), "x",
       "A Python float (x must have one element): a float attribute.", "float([0.5])", 0.5),
    Function("int", lambda x: int(np.asarray(x).reshape(-1)[0]) if np.size(x) == 1 else int(x), "x",
       "A Python int (x must have one element), truncated: an int attribute.", "int(3.7)", 3),
    Function("int64", lambda x: np.asarray(x, dtype=np.int64), "x", "x as an int64 tensor (e.g. a Reshape shape input).",
       "int64([2, -1])", [2, -1]),
    Function("int32", lambda x: np.asarray(x, dtype=np.int32), "x", "x as an int32 tensor.", "int32([1.9])", [1]),
    Function("float32", lambda x: np.asarray(x, dtype=np.float32), "x", "x as a float32 tensor.", "float32([1, 2])",
       [1.0, 2.0]),
    Function("floats", lambda x: [float(v) for v in np.asarray(x, dtype=np.float64).reshape(-1)], "x",
       "The elements of x as a flat list of floats: a floats attribute.", "floats([[1, 2]])", [1.0, 2.0]),
    Function("ints", lambda x: [int(v) for v in np.asarray(x).reshape(-1)], "x",
       "The elements of x as a flat list of ints: an ints attribute.", "ints([[1, 2]])", [1, 2]),
    Function("size", lambda x: int(np.size(x)), "x", "The number of elements of x.", "size([[1, 2], [3, 4]])", 4),
    Function("prod", lambda x: np.prod(np.asarray(x)), "x", "The product of the elements of x.", "prod([2, 3, 4])", 24),
    Function("max", lambda *xs: max(xs) if len(xs) > 1 else np.max(xs[0]), "*xs",
       "The largest argument; with one argument, its largest element.", "max(2, 5)", 5),
    Function("min", lambda *xs: min(xs) if len(xs) > 1 else np.min(xs[0]), "*xs",
       "The smallest argument; with one argument, its smallest element.", "min([4, 1, 3])", 1),
    Function("default", _default, "x, fallback",
       "x, or fallback where x is absent (an optional input left out, an attribute without a default).",
       "default(B, 0) + BIAS"),
    Function("len", len, "x", "The length of a list (the first dim of a tensor).", "len([3, 4, 5])", 3),
    Function("isqrt", lambda x: 1.0 / math.sqrt(float(x)), "x", "1 / sqrt(x) of one number, as a float.", "isqrt(4)", 0.5),
    Function("compose_perm",
       lambda first, then: [int(np.asarray(first).reshape(-1)[i]) for i in np.asarray(then).reshape(-1)],
       "first, then", "The one permutation of Transpose(Transpose(x, perm=first), perm=then).",
       "compose_perm([0, 2, 1], [1, 0, 2])", [2, 0, 1]),
    Function("matmul_view", lambda rank, trans_batch, trans: _matmul_view(int(rank), int(trans_batch), int(trans)),
       "rank, trans_batch, trans",
       "The permutation com.microsoft.FusedMatMul reads an operand of that rank through, for its transBatch and "
       "trans flags (as Transpose's perm): trans swaps the last two axes, trans_batch moves the first axis to "
       "the second-to-last place.", "matmul_view(3, 1, 0)", [1, 0, 2]),
    Function("matmul_flags", _matmul_flags, "perm",
       "[trans_batch, trans]: the FusedMatMul flags whose view (matmul_view) is the permutation perm, or "
       "[-1, -1] where no flags are (trans_batch only at rank 3 or more).", "matmul_flags([0, 2, 1])", [0, 1]),
    Function("broadcasts_into", _broadcasts_into, "small, big",
       "True when broadcasting dims small against dims big leaves big as it is (-1: an unknown dim).",
       "broadcasts_into([1, 4], [2, 3, 4])", True),
    Function("take", lambda x, idx: np.take(np.asarray(x), np.asarray(idx, dtype=np.int64)), "x, idx",
       "The elements of x (flattened) at the indices idx.", "take([10, 20, 30], [2, 0])", [30, 10]),
    Function("unknown_dims", lambda dims: sum(1 for d in np.asarray(dims).reshape(-1) if int(d) < 0), "dims",
       "How many dims are unknown (-1), e.g. of X.dims.", "unknown_dims([2, -1, 64])", 1),
    Function("norm_axes", lambda a, rank: sorted(int(x) % int(rank) for x in np.asarray(a).reshape(-1)), "a, rank",
       "Axes made non-negative for a tensor of that rank, sorted.", "norm_axes([-1, 0], 3)", [0, 2]),
    Function("inverse_perm", lambda p: [int(i) for i in np.argsort(np.asarray(p).reshape(-1))], "p",
       "The permutation that undoes the permutation p.", "inverse_perm([2, 0, 1])", [1, 2, 0]),
    Function("is_identity_perm",
       lambda p: [int(x) for x in np.asarray(p).reshape(-1)] == list(range(np.size(p))), "p",
       "True when the permutation p leaves every axis in place.", "is_identity_perm([0, 1, 2])", True),
    Function("astype", _astype, "x, dtype",
       "x as a tensor of the element type an ONNX name gives (as `X.dtype` reads it: float, float16, double, ...): a "
       "computed constant in a value's type without reading its value.", "astype([1.5], 'float16')", [1.5]),
    Function("nan", lambda: math.nan, "", "Not-a-number (a float).", "nan()", math.nan),
    Function("arange", lambda n: np.arange(int(n)), "n", "The integers 0 .. n-1.", "arange(3)", [0, 1, 2]),
    Function("all", lambda x: bool(np.all(x)), "x", "True when every element of x is true.", "all([True, False])", False),
    Function("any", lambda x: bool(np.any(x)), "x", "True when some element of x is true.", "any([True, False])", True),
    Function("cpu_nchwc", lambda: _cpu_nchwc(), "",
       "True when onnxruntime runs this machine's CPU convolutions in its blocked NCHWc layout (x86 with AVX2 or "
       "AVX-512), asked of onnxruntime once: a condition for rewrites that would take a Conv out of that layout.",
       "cpu_nchwc()"),
])


def _cpu_nchwc() -> bool:
    from ..targets import cpu_nchwc  # onnxruntime is imported only when a rule asks

    return cpu_nchwc()

_BINOPS: dict[type, Callable[[object, object], object]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: _pow(a, b),
    ast.MatMult: lambda a, b: a @ b,
}
_CMPOPS: dict[type, Callable[[object, object], object]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
# What `X.<field>` reads from a value (an input of the match, or a match line's output where its op has no
# attribute of that name); `field in VALUE_FIELDS` asks the table.
VALUE_FIELDS: Table[Field] = Table("Value fields", "What `X.<field>` reads from a value.", [
    Field("value", "value", "The constant tensor (a bare name X means X.value); the value must be `constant: true` "
          "or have a `const` in `where`.", "W.value * 2"),
    Field("shape", "value", "The dims as a list of integers; the rule does not apply where one is symbolic.",
          "W.shape[0]"),
    Field("dims", "value", "The dims as a list of integers, -1 where a dim is symbolic or unknown.", "X.dims[-1]"),
    Field("rank", "value", "The number of dims.", "W.rank - 1"),
    Field("dtype", "value", "The element type's ONNX name in lowercase: float, float16, bfloat16, double, int64, ...",
          "X.dtype == Y.dtype"),
    Field("size", "value", "The number of elements (static shapes only).", "W.size"),
    Field("constant", "value", "Whether the value is a constant (an initializer, or folded to one), not computed at "
          "run time: what a kernel that takes a tensor input does not need, and `X.value` does.",
          "not B.constant or any(B.value != 0)"),
])
NODE_FIELDS: Table[Field] = Table("Node fields", "What `line.<field>` reads from a match line's node.", [
    Field("op_type", "line", "The matched node's operator (which alternative matched).", "Y.op_type == 'Relu'"),
    Field("<attribute>", "line", "An attribute of the matched node, its schema default where absent, none where it "
          "has no default (`default(n.attr, x)` picks x); a value field where the op has no such attribute.",
          "Y.epsilon"),
])


@dataclass
class CompiledExpr:
    """A checked expression: its AST, source text and the names it reads."""

    node: ast.expr
    text: str
    names: list[tuple[str, str | None, int]] = field(default_factory=list)  # (name, field, offset)


def compile_expr(text: str | int | float | list) -> CompiledExpr:
    """Parse and check an expression; raise SyntaxProblem (with an offset) for anything not allowed."""
    src = text if isinstance(text, str) else repr(text)
    node, flat = parse_python(src)
    names: list[tuple[str, str | None, int]] = []
    _check(node, flat, names)
    return CompiledExpr(node, flat, names)


def compile_ast(node: ast.expr, text: str) -> CompiledExpr:
    names: list[tuple[str, str | None, int]] = []
    _check(node, text, names)
    return CompiledExpr(node, text, names)


def _check(node: ast.AST, text: str, names: list[tuple[str, str | None, int]]) -> None:
    off = offset_of(node, text) if hasattr(node, "col_offset") else 0
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float | str | bool) and node.value is not None:
            raise SyntaxProblem(f"constant {node.value!r} is not allowed", off)
        return
    if isinstance(node, ast.Name):
        names.append((node.id, None, off))
        return
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise SyntaxProblem(f"field {node.attr!r} is not allowed", off)
        if not isinstance(node.value, ast.Name):
            raise SyntaxProblem("fields can only be read from a name (X.shape, node.epsilon)", off)
        names.append((node.value.id, node.attr, off))
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise SyntaxProblem(
                "unknown function" + (f" {node.func.id!r}" if isinstance(node.func, ast.Name) else ""),
                off,
                hint="available: " + ", ".join(sorted(FUNCTIONS)),
            )
        for a in node.args:
            _check(a, text, names)
        for kw in node.keywords:
            if kw.arg is None:
                raise SyntaxProblem("'**' is not allowed", off)
            _check(kw.value, text, names)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise SyntaxProblem(f"operator {type(node.op).__name__} is not allowed", off)
        _check(node.left, text, names)
        _check(node.right, text, names)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd | ast.Not):
        _check(node.operand, text, names)
        return
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, text, names)
        return
    if isinstance(node, ast.Compare):
        if any(type(o) not in _CMPOPS for o in node.ops):
            raise SyntaxProblem("comparison operator not allowed", off)
        for n in [node.left, *node.comparators]:
            _check(n, text, names)
        return
    if isinstance(node, ast.List | ast.Tuple):
        for e in node.elts:
            _check(e, text, names)
        return
    if isinstance(node, ast.Subscript):
        _check(node.value, text, names)
        _check(node.slice, text, names)
        return
    if isinstance(node, ast.Slice):
        for part in (node.lower, node.upper, node.step):
            if part is not None:
                _check(part, text, names)
        return
    if isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check(part, text, names)
        return
    raise SyntaxProblem(f"{type(node).__name__} is not allowed in an expression", off)


class Env:
    """What an expression can read: resolves names and fields for one match."""

    def __init__(
        self,
        name_value: Callable[[str], object],
        field_value: Callable[[str, str], object],
    ) -> None:
        self.name_value = name_value
        self.field_value = field_value
        self.float_dtype: np.dtype | None = None

    def note_dtype(self, value: object) -> None:
        if self.float_dtype is None and isinstance(value, np.ndarray) and value.dtype.kind == "f":
            self.float_dtype = value.dtype


def evaluate(expr: CompiledExpr, env: Env) -> object:
    """Evaluate; floating arrays are promoted to float64 and the result cast back (see module doc)."""
    env.float_dtype = None
    result = _eval(expr.node, env)
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if isinstance(result, np.ndarray) and result.dtype == np.float64 and env.float_dtype is not None:
        result = result.astype(env.float_dtype)
    return result


def _promote(value: object, env: Env) -> object:
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        env.note_dtype(value)
        return value.astype(np.float64)
    return value


def _eval(node: ast.AST, env: Env) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _promote(env.name_value(node.id), env)
    if isinstance(node, ast.Attribute):
        assert isinstance(node.value, ast.Name)
        return _promote(env.field_value(node.value.id, node.attr), env)
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        args = [_eval(a, env) for a in node.args]
        kwargs = {kw.arg: _eval(kw.value, env) for kw in node.keywords if kw.arg}
        try:
            return FUNCTIONS[node.func.id].impl(*args, **kwargs)
        except (TypeError, ValueError, IndexError) as e:
            raise ComputeError(f"{node.func.id}(): {e}") from None
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if a is None or b is None:
            raise ComputeError("an absent optional value was used in arithmetic (wrap it in default(X, 0))")
        try:
            with np.errstate(all="raise"):
                return _BINOPS[type(node.op)](a, b)
        except (ValueError, FloatingPointError, ZeroDivisionError, TypeError) as e:
            raise ComputeError(str(e)) from None
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not bool(np.all(v))
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BoolOp):
        values = (bool(np.all(_eval(v, env))) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, env)
            if not bool(np.all(_CMPOPS[type(op)](left, right))):
                return False
            left = right
        return True
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, env)
        idx = _eval(node.slice, env)
        try:
            return base[idx] if not isinstance(idx, list) else base[tuple(idx)]
        except (IndexError, TypeError, KeyError) as e:
            raise ComputeError(f"index: {e}") from None
    if isinstance(node, ast.Slice):
        parts = [None if p is None else int(_eval(p, env)) for p in (node.lower, node.upper, node.step)]
        return slice(*parts)
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if bool(_eval(node.test, env)) else _eval(node.orelse, env)
    raise ComputeError(f"cannot evaluate {type(node).__name__}")  # unreachable after _check
