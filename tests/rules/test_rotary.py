"""patterns/rotary.yaml: Llama-style rotate-half rotary embeddings -> com.microsoft.RotaryEmbedding, the cache
being the model's own cos / sin rows (shared by q and k, kept)."""

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from .conftest import assert_same, check_fires, check_misses, fuse, make_model, rand_feeds

B, N, S, D = 2, 4, 8, 16
INT64_MAX = np.iinfo(np.int64).max


def _rotary(heads=("q", "k"), scale=None, axis=3, end=INT64_MAX, steps=True, swap=False, f_batch=1, other_half=False,
            wrong_sign=False, half=D // 2, dtype=TensorProto.FLOAT):
    """cos / sin of Concat(f, f) unsqueezed to [1, 1, s, D], applied to each of `heads` ([b, N, s, D])."""
    nodes = [oh.make_node("Concat", ["f", "g" if other_half else "f"], ["emb"], axis=-1, name="emb")]
    for fn in ("Cos", "Sin"):
        lo = fn.lower()
        src = lo
        nodes.append(oh.make_node(fn, ["emb"], [lo], name=lo))
        if scale is not None:
            nodes.append(oh.make_node("Mul", [lo, "scale"], [f"{lo}_s"], name=f"{lo}_scale"))
            src = f"{lo}_s"
        nodes.append(oh.make_node("Unsqueeze", [src, "ax1"], [f"{lo}_u"], name=f"{lo}_u"))
    for h in heads:
        st = ["st"] if steps else []
        nodes += [oh.make_node("Slice", [h, "half", "end", "axis"] + st, [f"{h}_x2"], name=f"{h}_x2"),
                  oh.make_node("Neg", [f"{h}_x2"], [f"{h}_nx2"], name=f"{h}_neg"),
                  oh.make_node("Slice", [h, "zero", "half", "axis"] + st, [f"{h}_x1"], name=f"{h}_x1")]
        cat = [f"{h}_x1", f"{h}_nx2"] if wrong_sign else [f"{h}_nx2", f"{h}_x1"]  # [x1, -x2]: the other way
        nodes += [oh.make_node("Concat", cat, [f"{h}_rot"], axis=-1, name=f"{h}_rot"),
                  oh.make_node("Mul", ["cos_u", h] if swap else [h, "cos_u"], [f"{h}_c"], name=f"{h}_cos"),
                  oh.make_node("Mul", ["sin_u", f"{h}_rot"] if swap else [f"{h}_rot", "sin_u"], [f"{h}_s"],
                               name=f"{h}_sin"),
                  oh.make_node("Add", [f"{h}_c", f"{h}_s"], [f"{h}_out"], name=f"{h}_out")]
    inits = {"ax1": np.array([1], np.int64), "half": np.array([half], np.int64), "end": np.array([end], np.int64),
             "zero": np.array([0], np.int64), "axis": np.array([axis], np.int64), "st": np.array([1], np.int64)}
    if scale is not None:
        inits["scale"] = np.float32(scale)
    inputs = [(h, [B, N, S, D], dtype) for h in heads] + [("f", [f_batch, S, D // 2], dtype)]
    if other_half:
        inputs.append(("g", [f_batch, S, D // 2], dtype))
    outputs = [(f"{h}_out", [B, N, S, D], dtype) for h in heads]
    return make_model(nodes, inputs, outputs, {k: v for k, v in inits.items() if any(k in n.input for n in nodes)})


def _feeds(m):
    feeds = rand_feeds(m)
    pos = np.arange(S, dtype=np.float32)[:, None] * (10000 ** (-np.arange(D // 2) / (D // 2)))[None, :]
    feeds["f"] = np.broadcast_to(pos, feeds["f"].shape).astype(feeds["f"].dtype)
    return feeds


# cos / sin (and their Unsqueeze, shared by both heads) stay; each head gets its own Reshape + Slice of each
# cache (the Reshape targets are separate initializers, so folding does not merge them) and RotaryEmbedding
CACHE = ["Reshape", "Slice", "Reshape", "Slice"]


@pytest.mark.parametrize("kw", [{}, {"axis": -1}, {"end": D}, {"steps": False}, {"swap": True}, {"scale": 0.5}],
                         ids=["torchscript", "axis-1", "end-D", "no-steps", "swapped", "scaled"])
def test_rotary_embedding_fires(kw):
    m = _rotary(**kw)
    head = ["Concat", "Cos"] + (["Mul"] if "scale" in kw else []) + ["Unsqueeze", "Sin"] + (
        ["Mul"] if "scale" in kw else []) + ["Unsqueeze"]
    got = check_fires(m, "rotary-embedding", head + (CACHE + ["com.microsoft.RotaryEmbedding"]) * 2,
                      fired={"rotary-embedding": 2}, feeds=_feeds(m), rtol=1e-5, atol=1e-5)
    rope = [n for n in got.graph.node if n.op_type == "RotaryEmbedding"]
    assert [n.input[0] for n in rope] == ["q", "k"]
    producer = {o: n for n in got.graph.node for o in n.output}
    for n in rope:  # the caches are Slices of Reshapes of the model's own (shared) cos / sin
        assert [producer[producer[c].input[0]].input[0] for c in n.input[2:4]] == ["cos_u", "sin_u"]
    assert {a.name: oh.get_attribute_value(a) for a in rope[0].attribute} == {"interleaved": 0}


def test_rotary_embedding_one_head():
    m = _rotary(heads=("q",))
    check_fires(m, "rotary-embedding", ["Concat", "Cos", "Unsqueeze", "Sin", "Unsqueeze"] + CACHE
                + ["com.microsoft.RotaryEmbedding"], feeds=_feeds(m))


@pytest.mark.parametrize(("kw", "reason"), [
    ({"other_half": True}, "F must be the same value in both places"),  # halves differ: not a half-width cache
    ({"f_batch": 2}, None),  # per-batch positions: the cache would be batch 0's
    ({"wrong_sign": True}, None),  # rotates the other way
    ({"half": D // 2 - 1}, "require failed: int(H1) == X.dims[3] // 2"),
    ({"axis": 2}, "require failed: (int(A1) == 3 or int(A1) == -1)"),
    ({"dtype": TensorProto.DOUBLE}, None),
])
def test_rotary_embedding_near_misses(kw, reason):
    check_misses(_rotary(**kw), "rotary-embedding", reason)


def _batch_feeds(m):
    """cos / sin rows of other positions in each batch row (position_ids [b, s] with a past of 3 * b)."""
    feeds = rand_feeds(m)
    inv = (10000 ** (-np.arange(D // 2) / (D // 2)))[None, :]
    feeds["f"] = np.stack([(np.arange(S, dtype=np.float64)[:, None] + 3 * b) * inv
                           for b in range(feeds["f"].shape[0])]).astype(feeds["f"].dtype)
    return feeds


# per head: the two caches, then the position ids Range(b * s) reshaped to [b, s], then RotaryEmbedding
BATCH_CACHE = CACHE + ["Shape", "Gather", "Range", "Shape", "Gather", "Concat", "Reshape"]


@pytest.mark.parametrize("kw", [{}, {"swap": True, "scale": 0.5}, {"dtype": TensorProto.FLOAT16}],
                         ids=["torchscript", "swapped-scaled", "float16"])
def test_rotary_embedding_batch_fires(kw):
    """cos / sin [b, 1, s, D] (position_ids [b, s]: each batch row at its own positions, as KV-cache decoders
    export them): the cache holds every (batch, position) row and the position ids pick each row's own."""
    m = _rotary(f_batch=B, **kw)
    head = ["Concat", "Cos"] + (["Mul"] if "scale" in kw else []) + ["Unsqueeze", "Sin"] + (
        ["Mul"] if "scale" in kw else []) + ["Unsqueeze"]
    tol = 1e-2 if kw.get("dtype") == TensorProto.FLOAT16 else 1e-5
    got = check_fires(m, "rotary-embedding-batch", head + (BATCH_CACHE + ["com.microsoft.RotaryEmbedding"]) * 2,
                      fired={"rotary-embedding-batch": 2}, feeds=_batch_feeds(m), rtol=tol, atol=tol, fold=False)
    rope = [n for n in got.graph.node if n.op_type == "RotaryEmbedding"]
    assert [n.input[0] for n in rope] == ["q", "k"]


def test_rotary_embedding_batch_prefers_the_plain_rule_for_one_row():
    """cos / sin without a batch dim: the plain rule (one offset, no run-time position ids) fires first."""
    m = _rotary()
    r, _ = fuse(m, "rotary-embedding", "rotary-embedding-batch")
    assert r.fired == {"rotary-embedding": 2}


@pytest.mark.parametrize(("kw", "reason"), [
    ({"other_half": True}, "F must be the same value in both places"),
    ({"wrong_sign": True}, None),
    ({"half": D // 2 - 1}, "require failed: int(H1) == X.dims[3] // 2"),
])
def test_rotary_embedding_batch_near_misses(kw, reason):
    check_misses(_rotary(f_batch=B, **kw), "rotary-embedding-batch", reason)


def _rotary_const(equal_halves=True, batch_rows=1):
    """cos / sin as constants [1, 1, s, D] (a static-shape export folds the positions away)."""
    inv = (10000 ** (-np.arange(D // 2) / (D // 2)))[None, :]
    ang = np.arange(S, dtype=np.float64)[:, None] * inv
    emb = np.concatenate([ang, ang if equal_halves else ang * 1.5], axis=-1)
    cos = np.broadcast_to(np.cos(emb), (batch_rows, 1, S, D)).astype(np.float32)
    sin = np.broadcast_to(np.sin(emb), (batch_rows, 1, S, D)).astype(np.float32)
    nodes = [oh.make_node("Slice", ["q", "half", "end", "axis"], ["x2"], name="x2"),
             oh.make_node("Neg", ["x2"], ["nx2"], name="neg"),
             oh.make_node("Slice", ["q", "zero", "half", "axis"], ["x1"], name="x1"),
             oh.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1, name="rot"),
             oh.make_node("Mul", ["q", "cos"], ["qc"], name="q_cos"),
             oh.make_node("Mul", ["rot", "sin"], ["qs"], name="q_sin"),
             oh.make_node("Add", ["qc", "qs"], ["y"], name="out")]
    inits = {"half": np.array([D // 2], np.int64), "end": np.array([INT64_MAX], np.int64),
             "zero": np.array([0], np.int64), "axis": np.array([3], np.int64), "cos": cos, "sin": sin}
    return make_model(nodes, [("q", [B, N, S, D])], [("y", [B, N, S, D])], inits)


def test_rotary_embedding_const_fires():
    m = _rotary_const()
    got = check_fires(m, "rotary-embedding-const", ["com.microsoft.RotaryEmbedding"], rtol=1e-5, atol=1e-5)
    cache = {t.name: t for t in got.graph.initializer}
    assert list(cache[got.graph.node[0].input[2]].dims) == [S, D // 2]  # the first half of every row


@pytest.mark.parametrize(("kw", "reason"), [
    ({"equal_halves": False}, "require failed: all(COS[:, :, :, :X.dims[3] // 2] == COS[:, :, :, X.dims[3] // 2:])"),
    ({"batch_rows": 2}, None),  # a constant per batch row: not one cache for every row
])
def test_rotary_embedding_const_near_misses(kw, reason):
    check_misses(_rotary_const(**kw), "rotary-embedding-const", reason)


def test_rotary_embedding_is_exact_for_any_cos_sin_the_model_computes_at_run_time():
    """The cache is the model's own cos / sin rows for this call, whatever computes them: frequencies that arrive
    at run time (an inv_freq input, a scaled or learned one) and any sequence length give the original's numbers.
    Checked at 1, 5 and 11 positions, with frequencies that are no rotary schedule at all."""
    m = _rotary()
    for vi in list(m.graph.input) + list(m.graph.output):  # the sequence length left to run time
        dims = vi.type.tensor_type.shape.dim
        dims[-2].Clear()
        dims[-2].dim_param = "s"
    r, got = fuse(m, "rotary-embedding")
    assert r.fired == {"rotary-embedding": 2}
    rng = np.random.default_rng(11)
    for s in (1, 5, 11):
        feeds = {"q": rng.standard_normal((B, N, s, D)).astype(np.float32),
                 "k": rng.standard_normal((B, N, s, D)).astype(np.float32),
                 "f": (rng.standard_normal((1, s, D // 2)) * 7).astype(np.float32)}  # any run-time angles
        assert_same(m, got, feeds, rtol=1e-5, atol=1e-5)
