"""Helpers for the per-rule-file tests (tests/rules/test_<file>.py mirror patterns/<file>.yaml).

Each rule is run on its own, through the public `optimize` entry point, from a one-rule pattern file cut out
of the built-in file (yaml node marks give the exact text of the rule). Parsing the whole built-in set costs
~0.8 s per optimize() call (pure-Python YAML composition); one rule ~25 ms, so hundreds of focused cases
stay fast. `optimize` runs with measure=False and validate=False: a test sees exactly what the rule wrote
and checks the numbers itself with onnxruntime (ort_run), so a wrong rewrite is not hidden by a rollback.

Only these onnxfuse entry points are used: optimize / OptimizeOptions, the pattern parser, the engine's
near_misses (for the reason a near miss does not fire) and the IR's Model.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable

import numpy as np
import onnx
import yaml

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # tests/conftest.py helpers (make_model, ort_run, ...) import as `conftest`
    sys.path.insert(0, TESTS)

from conftest import make_model, op_types, ort_run, save  # noqa: E402

from onnxfuse.patterns.parser import parse_text  # noqa: E402

ROOT = os.path.dirname(TESTS)
PATTERNS = os.path.join(ROOT, "patterns")

__all__ = ["PATTERNS", "ROOT", "assert_same", "check_fires", "check_misses", "fuse", "make_model", "op_types",
           "ort_run", "rand_feeds", "rule", "rule_ids_by_file", "save", "why_not"]


def api():
    """(optimize, OptimizeOptions) wherever the package currently exports them: the package itself, or the
    module that defines them (looked up by name, so an import rewrite cannot turn the fallback into the first
    try)."""
    import importlib
    import types

    for name in ("onnxfuse", "onnxfuse.optimize", "onnxfuse" + ".api"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        fn, opts = getattr(mod, "optimize", None), getattr(mod, "OptimizeOptions", None)
        if isinstance(fn, types.ModuleType):  # onnxfuse.optimize is the module, not the function
            fn = getattr(fn, "optimize", None)
        if callable(fn) and opts is not None:
            return fn, opts
    raise ImportError("onnxfuse exports no optimize / OptimizeOptions")


# ----- rule files ----------------------------------------------------------------------------------------------
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _subpattern_texts() -> dict[str, str]:
    """built-in file stem -> its `patterns:` entries (named sub-patterns), as YAML lines under `patterns:`."""
    out: dict[str, str] = {}
    for name in sorted(os.listdir(PATTERNS)):
        if name.endswith((".yaml", ".yml")):
            data = yaml.safe_load(open(os.path.join(PATTERNS, name), encoding="utf-8"))
            out[os.path.splitext(name)[0]] = "".join(f"  {k}: {json.dumps(v)}\n"
                                                     for k, v in (data.get("patterns") or {}).items())
    return out


@functools.cache
def _rule_texts() -> dict[str, tuple[str, str]]:
    """rule id -> (built-in file stem, the rule's YAML text as a one-item list)."""
    out: dict[str, tuple[str, str]] = {}
    for name in sorted(os.listdir(PATTERNS)):
        if not name.endswith((".yaml", ".yml")):
            continue
        text = open(os.path.join(PATTERNS, name), encoding="utf-8").read()
        lines = text.splitlines(keepends=True)
        root = yaml.compose(text, Loader=_LOADER)
        items = next(v for k, v in root.value if k.value == "rules").value
        for item in items:
            rid = next(v.value for k, v in item.value if k.value == "id")
            start, end = item.start_mark.line, item.end_mark.line
            body = "".join(lines[start:end + 1] if item.end_mark.column else lines[start:end])
            out[rid] = (os.path.splitext(name)[0], body)
    return out


def rule_ids_by_file() -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for rid, (stem, _) in _rule_texts().items():
        by.setdefault(stem, []).append(rid)
    return by


_TMP = tempfile.mkdtemp(prefix="onnxfuse-rule-tests-")
atexit.register(shutil.rmtree, _TMP, True)


@functools.cache
def rule_file(*ids: str) -> str:
    """A pattern file holding exactly the built-in rules `ids` (in that order)."""
    texts = _rule_texts()
    missing = [i for i in ids if i not in texts]
    assert not missing, f"no built-in rule {missing}"
    text = _with_subpatterns(ids) + "rules:\n" + "\n".join(texts[i][1] for i in ids)
    parsed = parse_text(text, "cut.yaml")
    assert [r.id for r in parsed] == list(ids), "cutting the rules out of their files went wrong"
    path = os.path.join(_TMP, "-".join(ids)[:150] + ".yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@functools.cache
def rule(rule_id: str):
    return parse_text(_with_subpatterns([rule_id]) + "rules:\n" + _rule_texts()[rule_id][1], f"{rule_id}.yaml",
                      builtin=True)[0]


def _with_subpatterns(ids) -> str:
    """The `patterns:` block of the files the rules `ids` come from (the sub-patterns they call), or ''."""
    subs = "".join(dict.fromkeys(_subpattern_texts()[_rule_texts()[i][0]] for i in ids))
    return "patterns:\n" + subs if subs else ""


# ----- running ------------------------------------------------------------------------------------------------
def fuse(model: onnx.ModelProto, *ids: str, target: str = "cpu", fold: bool = True, validate: bool = False):
    """optimize() with only the built-in rules `ids`: (Result, the written model)."""
    optimize, OptimizeOptions = api()
    d = tempfile.mkdtemp(dir=_TMP)
    try:
        src = save(model, os.path.join(d, "in.onnx"))
        out = os.path.join(d, "out.onnx")
        r = optimize(src, out, OptimizeOptions(patterns=[rule_file(*ids)], builtin=False, only=list(ids),
                                               measure=False, validate=validate, target=target, fold=fold))
        return r, onnx.load(out)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def rand_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None, positive: bool = False,
               **given: np.ndarray) -> dict[str, np.ndarray]:
    """Random inputs for every graph input (floats: standard normal, or uniform in [0.5, 2) when `positive`;
    ints: in [0, 4)); symbolic dims from `dims` (default 3); `given` overrides by name."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for i in model.graph.input:
        if i.name in init:
            continue
        if i.name in given:
            feeds[i.name] = np.asarray(given[i.name])
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 3) for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            x = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
            feeds[i.name] = x.astype(dtype)
        else:
            feeds[i.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def assert_same(orig: onnx.ModelProto, got: onnx.ModelProto, feeds: dict, rtol: float = 1e-5,
                atol: float = 1e-5) -> None:
    want = ort_run(orig, feeds)
    have = ort_run(got, feeds)
    assert len(want) == len(have)
    for w, h in zip(want, have, strict=True):
        assert w.shape == h.shape and w.dtype == h.dtype, (w.shape, h.shape, w.dtype, h.dtype)
        np.testing.assert_allclose(h, w, rtol=rtol, atol=atol, equal_nan=True)


def check_fires(model: onnx.ModelProto, ids: str | Iterable[str], ops: list[str], fired: dict | None = None,
                feeds: dict | bool | None = None, rtol: float = 1e-5, atol: float = 1e-5,
                **kw) -> onnx.ModelProto:
    """The rule(s) fire exactly as `fired` says (default: the first rule once), the output's ops are exactly
    `ops` (graph order), and onnxruntime gives the original's outputs on `feeds` (random when None; skipped
    when False)."""
    ids = (ids,) if isinstance(ids, str) else tuple(ids)
    r, got = fuse(model, *ids, **kw)
    assert r.fired == (fired if fired is not None else {ids[0]: 1}), r.fired
    assert op_types(got) == ops, op_types(got)
    onnx.checker.check_model(got)
    if feeds is not False:
        assert_same(model, got, feeds if isinstance(feeds, dict) else rand_feeds(model), rtol, atol)
    return got


def check_misses(model: onnx.ModelProto, rule_id: str, reason: str | None = None, **kw) -> None:
    """The rule does not fire and the graph keeps its ops; `reason` is part of why (engine.near_misses)."""
    r, got = fuse(model, rule_id, **kw)
    assert r.fired == {}, r.fired
    assert op_types(got) == op_types(model), op_types(got)
    if reason is not None:
        why = why_not(model, rule_id, kw.get("target", "cpu"))
        assert reason in why, why


def why_not(model: onnx.ModelProto, rule_id: str, target: str = "cpu") -> str:
    """Why each candidate root of `rule_id` is not matched (the engine's near misses, ' | '-joined)."""
    from onnxfuse.ir import Model
    from onnxfuse.rewrite.engine import near_misses

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    misses = near_misses(Model(inferred, ROOT), [rule(rule_id)], target, min_progress=0)
    return " | ".join(f"{m.at}: {m.reason}" for m in misses if m.rule == rule_id)
