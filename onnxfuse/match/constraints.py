"""The `where` constraints of a rule checked on a value while matching: constant or not, a constant's value
within tolerance (compared in chunks: a big weight is never copied whole), dtype, rank, and shape patterns whose
dim names unify with the dims other lines bound."""

from __future__ import annotations

import numpy as np

from ..concepts.interpreter import Interpreter, Sizes, static_dims
from ..concepts.language import short
from ..concepts.shape_ops import Unprovable
from ..ir import Node
from ..patterns.rules import Constraint
from ..tensors import dtype_name

__all__ = ["check_value", "const_ok", "dim_conflict", "unify"]

CONST_CHUNK = 1 << 20  # elements of a constant compared at a time (const_ok)


def check_value(m, name: str, value: str, con: Constraint, b, consumer: Node | None):
    """`b` where `value` meets the constraint `con` of `name` (its dims unified into b.dims), None where it does
    not (the matcher `m` told why)."""
    g = m.graph
    if con.constant is not None and g.is_constant(value) != con.constant:
        m.fail(b, value, f"{name} ({value!r}) is {'not ' if con.constant else ''}a constant")
        return None
    if con.const is not None:
        t = g.type_of(value)
        size = None if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape) else \
            int(np.prod(t.shape, dtype=np.int64))
        if size is not None and size > CONST_CHUNK and con.const.size > 1 and size != con.const.size:
            m.fail(b, value, f"{name}: const of {size} elements not within tolerance of {short(con.const)}")
            return None
        v = g.const_value(value, keep=size is None or size <= CONST_CHUNK)  # a big weight is not held
        if v is None:
            m.fail(b, value, f"{name} ({value!r}) is not a constant, rule needs {short(con.const)}")
            return None
        if not const_ok(v, con):
            m.fail(b, value, f"{name}: const {short(v)} not within tolerance of {short(con.const)} "
                   f"(rtol {con.rtol:g}, atol {con.atol:g})")
            return None
        if consumer is not None and v.ndim > 0:
            out_t = g.type_of(consumer.outputs[0])
            out_rank = out_t.rank if out_t is not None else None
            if out_rank is None or v.ndim > out_rank:
                m.fail(b, value, f"{name}: constant of shape {list(v.shape)} could change the "
                       f"output's rank ({out_rank if out_rank is not None else 'unknown'})")
                return None
    if con.dtype is None and con.rank is None and con.shape is None:
        return b
    t = g.type_of(value)
    if con.dtype is not None:
        if t is None or t.elem_type not in con.dtype:
            have = t.dtype_name if t is not None else "unknown"
            m.fail(b, value, f"{name} has dtype {have}, rule allows "
                   f"{', '.join(dtype_name(d) for d in con.dtype)}")
            return None
    if con.rank is not None and (t is None or t.rank not in con.rank):
        m.fail(b, value, f"{name} has rank {t.rank if t else 'unknown'}, rule allows "
               f"{', '.join(map(str, con.rank))}")
        return None
    if con.shape is not None:
        shape = t.shape if t is not None else None
        declared = m.graph.model.input_dim_names
        for alt in con.shape:
            dims = unify(alt, shape, b.dims, declared, m.rule.atoms)
            if dims is not None:
                return b.with_dims(dims)
        fixed = _fixed_symbols(m, b, value, shape)  # made-up dims the producers fix: retried as their numbers
        if fixed and shape is not None:
            bound = {k: fixed.get(v, v) if isinstance(v, str) else v for k, v in b.dims.items()}
            for alt in con.shape:
                dims = unify(alt, tuple(fixed.get(d, d) if isinstance(d, str) else d for d in shape), bound,
                             declared, m.rule.atoms)
                if dims is not None:
                    return b.with_dims(dims)
        why = dim_conflict(con.shape[0], shape, b.dims) if len(con.shape) == 1 else None
        m.fail(b, value, f"{name} has shape {list(shape) if shape is not None else 'unknown'}, rule needs "
               + " or ".join(str(list(a)) for a in con.shape) + (f": {why}" if why else ""))
        return None
    return b

def _fixed_symbols(m, b, value: str, shape: tuple | None) -> dict[str, int]:
    """The dims shape inference made up (symbols the model does not declare) on `value` and on the values the
    match has bound, which their producers fix to one number: worked out by the shape interpreter at two sets of
    sizes for the model's symbolic dims, the same number at both and no guess on the way (ViT's 1 + 14 x 14
    tokens after a Reshape whose target is read from Shape at run time). Asked only where a shape constraint
    failed; memoized on the graph as it is (every rule shares them)."""
    declared = m.graph.model.input_dim_names
    wanted = {d for d in (shape or ()) if isinstance(d, str) and d not in declared}
    wanted |= {d for d in b.dims.values() if isinstance(d, str) and d not in declared}
    if not wanted:
        return {}
    cache = m.graph.derived("made-up dims fixed")
    out: dict[str, int] = {}
    for v in dict.fromkeys([value, *b.values.values()]):
        t = m.graph.type_of(v) if v else None
        if t is None or t.shape is None or not wanted.intersection(d for d in t.shape if isinstance(d, str)):
            continue
        if v not in cache:
            cache[v] = _worked_out(m.graph, v, t.shape, declared)
        out.update({k: n for k, n in cache[v].items() if k in wanted})
    return out


def _worked_out(graph, value: str, shape: tuple, declared: frozenset[str]) -> dict[str, int]:
    """symbol -> number for each made-up dim of `value` its producers fix (see _fixed_symbols)."""
    found = []
    for variant in (0, 1):
        interp = Interpreter(graph, Sizes(static_dims(graph), variant))
        try:
            got = interp.shape_of(value)
        except Unprovable:
            return {}
        if got is None or value in interp.guessed or len(got) != len(shape):
            return {}
        found.append(got)
    return {d: a for d, a, c in zip(shape, *found, strict=True)
            if isinstance(d, str) and d not in declared and a == c}


def const_ok(v: np.ndarray, con: Constraint) -> bool:
    assert con.const is not None
    v = np.asarray(v)
    wanted = np.asarray(con.const, dtype=np.float64).reshape(-1)
    if v.size == 0 or (wanted.size != 1 and v.size != wanted.size):
        return False
    flat = v.reshape(-1)
    # the first element alone first, then in chunks: a big weight is never copied whole as float64 (a 128 MB
    # constant compared with a scalar took 2.8 s and 1 GB of temporaries)
    for lo, hi in [(0, 1)] + [(k, min(k + CONST_CHUNK, flat.size)) for k in range(1, flat.size, CONST_CHUNK)]:
        try:
            actual = flat[lo:hi].astype(np.float64)
        except (TypeError, ValueError):
            return False
        want = wanted if wanted.size == 1 else wanted[lo:hi]
        if not bool(np.all(np.abs(actual - want) <= con.atol + con.rtol * np.abs(want))):
            return False
    return True

def unify(pattern: tuple[int | str, ...], shape: tuple[int | str | None, ...] | None,
           dims: dict[str, int | str], declared: frozenset[str] = frozenset(),
           proven: frozenset[str] = frozenset()) -> dict[str, int | str] | None:
    """Bind the pattern's dim names to the value's dims. Two different symbols are taken as equal (shape
    inference often names one run-time dim twice), except two the model declares on its inputs: those are
    the user's own names for dims that may differ ([batch, seq, k] + [batch, one, k] broadcasts). A layout
    axis (`proven`) whose number a layout proof found also equals a dim shape inference made up."""
    if shape is None or len(shape) != len(pattern):
        return None
    out = dict(dims)
    for p, d in zip(pattern, shape, strict=True):
        if p == "_":
            continue
        if isinstance(p, int):
            if d != p:
                return None
        elif d is None:
            return None
        elif p in out:
            if out[p] != d and not (isinstance(out[p], str) and isinstance(d, str)
                                    and not (out[p] in declared and d in declared)) \
                    and not (p in proven and isinstance(out[p], int) and isinstance(d, str) and d not in declared):
                return None  # literal dims must agree, a symbol never equals a literal
        else:
            out[p] = d
    return out


def dim_conflict(pattern: tuple[int | str, ...], shape: tuple[int | str | None, ...] | None,
                  dims: dict[str, int | str]) -> str | None:
    """Which dim of `shape` the pattern's names do not take, in words (the concept of the failed constraint: the
    sequence length of one value against another's), or None where the rank or an unknown dim is the reason."""
    if shape is None or len(shape) != len(pattern):
        return None
    for p, d in zip(pattern, shape, strict=True):
        if isinstance(p, str) and p != "_" and p in dims and dims[p] != d and d is not None:
            old = dims[p]
            if isinstance(old, int) != isinstance(d, int):
                return (f"{p} is {d!r} here, {old!r} where it was bound first (a dim shape inference named is not "
                        "proved equal to a number)")
            return f"{p} is {d!r} here, {old!r} where it was bound first"
    return None
