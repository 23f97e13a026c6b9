"""Region selection: regions cut out of a model run alone and compute what the whole model computes there;
alike regions are one class; decisions are cached, reproducible and bounded by the budget."""

import json
import os
import time

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from conftest import MODELS, fake_clocks, fake_timing, make_model, stepping_clock

from onnxfuse import OptimizeOptions, find_inputs, optimize
from onnxfuse.load.loader import load_model
from onnxfuse.measure import timing as rt
from onnxfuse.measure.stats import Ratio
from onnxfuse.measure.timing import Timings, interleave
from onnxfuse.measure.verdicts import MIN_FLOOR, model_settled, verdict
from onnxfuse.regions.cut import find_regions
from onnxfuse.regions.model import region_model, signature
from onnxfuse.rewrite.engine import EngineOptions, run
from onnxfuse.rewrite.ruleset import load_rules
from onnxfuse.select import region_run as rr
from onnxfuse.select.classes import RegionClass
from onnxfuse.select.decision_cache import DecisionCache
from onnxfuse.tensors import TensorType
from onnxfuse.validate.compare import default_tolerance

TRANSFORMER = os.path.join(MODELS, "transformer_small.onnx")
CNN = os.path.join(MODELS, "cnn_small.onnx")
BERT = os.path.join(MODELS, "transformers", "bert_ts17.onnx")
LLAMA = os.path.join(MODELS, "transformers", "llama_dynamo18.onnx")


def _all_values(path: str, feeds: dict) -> dict[str, np.ndarray]:
    """Every intermediate value of the original model on `feeds`."""
    m = onnx.load(path)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.add().name = o
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return {**feeds, **dict(zip(names, s.run(names, feeds), strict=True))}


def _regions(path: str):
    rules = load_rules([], True, [], [])
    model, _ = load_model(path)
    original, _ = load_model(path)
    eng = run(model, rules, EngineOptions())
    return original, model, find_regions(original, model, eng.applications, {r.id for r in rules})


def _feeds(path: str) -> dict:
    return find_inputs(path).feeds


@pytest.mark.parametrize("path", [TRANSFORMER, CNN, BERT, LLAMA])
def test_each_region_alone_computes_what_the_model_computes_there(path):
    original, final, regions = _regions(path)
    values = _all_values(path, _feeds(path))
    timeable = [r for r in regions if not r.untimeable]
    assert timeable, [r.untimeable for r in regions]
    opsets = dict(final.opsets)
    for r in timeable:
        feeds = {v: values[v] for v in r.inputs}
        outs = {}
        for fused in (False, True):
            sess = ort.InferenceSession(region_model(r, fused, opsets, final.proto.ir_version, feeds),
                                        providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            assert names == r.outputs
            outs[fused] = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        for name, a, b, whole in zip(r.outputs, outs[False], outs[True], (values[o] for o in r.outputs),
                                     strict=True):
            tol = default_tolerance(onnx.helper.np_dtype_to_tensor_dtype(a.dtype))
            np.testing.assert_allclose(a, whole, rtol=tol.rtol, atol=tol.atol, err_msg=f"{r.label}: {name}")
            np.testing.assert_allclose(b, whole, rtol=tol.rtol, atol=tol.atol, err_msg=f"{r.label}: {name}")
        assert {n.op_type for n in r.fused} & {o.rpartition(".")[2] for o in r.ops}


def _gelu_chain(path, blocks=5, width=16, seed=0):
    """x -> [MatMul -> erf-Gelu written out] x blocks: alike blocks, the last one wider."""
    nodes, inits = [], {}
    rng = np.random.default_rng(seed)
    x = "x"
    for i in range(blocks):
        out_w = width * 2 if i == blocks - 1 else width
        inits[f"w{i}"] = rng.standard_normal((width, out_w)).astype(np.float32) * 0.1
        nodes += [oh.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  oh.make_node("Div", [f"m{i}", "sqrt2"], [f"d{i}"]),
                  oh.make_node("Erf", [f"d{i}"], [f"e{i}"]),
                  oh.make_node("Add", [f"e{i}", "one"], [f"a{i}"]),
                  oh.make_node("Mul", [f"m{i}", f"a{i}"], [f"p{i}"]),
                  oh.make_node("Mul", [f"p{i}", "half"], [f"g{i}"])]
        x = f"g{i}"
    inits.update(sqrt2=np.array(1.4142135, np.float32), one=np.array(1.0, np.float32),
                 half=np.array(0.5, np.float32))
    onnx.save(make_model(nodes, [("x", ["batch", width])], [(x, ["batch", width * 2])], inits), path)
    return path


def test_alike_regions_share_a_signature_and_others_do_not(tmp_path):
    path = _gelu_chain(str(tmp_path / "chain.onnx"))
    _, _, regions = _regions(path)
    values = _all_values(path, {"x": np.ones((4, 16), np.float32)})
    sigs: dict[str, list[int]] = {}
    for k, r in enumerate(regions):
        assert not r.untimeable, r.untimeable
        shapes = [[(str(values[v].dtype), values[v].shape) for v in r.inputs]]
        sigs.setdefault(signature(r, shapes), []).append(k)
    # a region's class includes its context (the MatMuls around it): the first three blocks are alike; the one
    # before the wider last block, and the last block, are classes of their own
    assert sorted(len(v) for v in sigs.values()) == [1, 1, 3]
    r = regions[0]
    shapes = [[(str(values[v].dtype), values[v].shape) for v in r.inputs]]
    bigger = [[(d, (s[0] * 2, *s[1:])) for d, s in shapes[0]]]
    assert signature(r, shapes) != signature(r, bigger)  # the shapes a region ran at are part of its class


def _fake_interleaved(ratio_of):
    """Times where a region's fused version takes ratio_of(label) of its original version's time."""
    def fake(sessions, profiles, *, estimator, **_kw):
        rng = np.random.default_rng(0)
        n = 30
        base = 1e-3 * (1 + 0.001 * rng.standard_normal(n))
        out = {"a": list(base), "b": list(base * (1 + 0.0005 * rng.standard_normal(n)))}
        if "f" in sessions:
            out["f"] = list(base * fake.ratio)
            return Timings.of(out, estimator, len(profiles))
        # whole-model confirmation (default 0.95: a little faster); per profile, fake.per_profile[p] (default: fake.whole, or the next of
        # fake.wholes, one per comparison)
        if fake.wholes:
            fake.whole = fake.wholes.pop(0)
        out = {"o": list(base), "o2": list(base), "c": list(base * fake.whole), "c2": list(base * fake.whole)}
        t = Timings.of(out, estimator, len(profiles))
        for p in range(len(profiles)):
            r = fake.per_profile[p] if p < len(fake.per_profile) else fake.whole
            for clock in ("wall", "cpu"):
                for k, f in (("o", 1.0), ("o2", 1.0), ("c", r), ("c2", r)):
                    t.raw[clock, k, p] = list(base * f)
        return t
    fake.ratio, fake.whole, fake.per_profile, fake.wholes = ratio_of, 0.95, [], []
    return fake


def _optimize(tmp_path, name, **kw):
    out = tmp_path / name
    r = optimize(CNN, str(out), OptimizeOptions(**kw))
    return r, out


@pytest.mark.parametrize("ratio,kept", [(0.8, True), (1.0, False), (1.2, False)])
def test_a_region_class_is_kept_only_when_faster_beyond_noise(tmp_path, monkeypatch, ratio, kept):
    """Faster beyond the floor: kept; slower: left out; no change either way: its prior decides, here the op-cost
    prior for conv-add-fold (an Add folded into a Conv's bias: one call and its bytes fewer, a standard op) and
    nothing for the FusedConv rules (a contrib kernel, whose rules declare nothing)."""
    fake_timing(monkeypatch, _fake_interleaved(ratio))
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    r, _ = _optimize(tmp_path, "o.onnx", cache=False)
    timed = [g for g in r.measure.groups if g.source == "timed"]
    prior = [g for g in timed if g.rules == ["conv-add-fold"]] if ratio == 1.0 else []
    assert timed and all(g.kept is kept for g in timed if g not in prior)
    assert prior and all(g.kept and g.why.startswith("no significant change; kept: op cost: 1 kernel call fewer")
                         for g in prior) or ratio != 1.0
    assert r.measure.strategy == "regions"
    # only exact rewrites kept: timed too where the budget has the time (it has: the clock steps 0.1 ms a call)
    assert r.measure.confirmed in (("timed",) if kept or prior else ("timed", "not needed: no rewrite kept"))
    fused = sum(v for k, v in r.ops_after.items() if k.startswith("com.microsoft"))
    assert (fused > 0) is kept


def test_an_undecided_class_is_said_so_and_decided_afresh_only_where_a_run_can_do_better(tmp_path, monkeypatch):
    """A fused version whose interval crosses the line (0.99 of the original, 1% noise per run; the line is
    1 - 0.5% - the floor, at least MIN_FLOOR): "undecided",
    left as the original where nothing decided follows. A second run on the same machine reuses that (it times
    nothing and writes the same bytes); a run on a quieter machine, or with a larger --measure-budget, times it
    again (an undecided result is weak evidence, not a decision)."""
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))

    def fake(sessions, profiles, *, estimator, **_kw):
        if "f" in sessions:
            fake.regions += 1
        rng = np.random.default_rng(fake.regions)
        base = 1e-3 * np.ones(40)
        if "f" in sessions:
            out = {"a": list(base), "b": list(base), "f": list(base * (0.99 + 0.01 * rng.standard_normal(40)))}
        else:
            out = {"o": list(base), "o2": list(base), "c": list(base), "c2": list(base)}
        return Timings.of(out, estimator, len(profiles))
    fake.regions = 0
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))
    monkeypatch.setattr(rr, "_load_per_core", lambda: 2.0)  # a loaded machine
    r, a = _optimize(tmp_path, "a.onnx", measure_budget_s=6.0)
    undecided = [g for g in r.measure.groups if g.source == "undecided"]
    assert undecided and all(not g.kept for g in undecided if g.why == "nothing decided to follow")
    assert r.measure.estimator == "cpu"
    first = fake.regions
    r2, b = _optimize(tmp_path, "b.onnx", measure_budget_s=6.0)  # the same machine, as loaded
    assert fake.regions == first and a.read_bytes() == b.read_bytes()
    assert [g.source for g in r2.measure.groups if g.group == undecided[0].group].count("undecided") >= 1
    monkeypatch.setattr(rr, "_load_per_core", lambda: 0.1)  # quieter: worth timing again
    _optimize(tmp_path, "c.onnx", measure_budget_s=6.0)
    assert fake.regions > first
    second = fake.regions
    monkeypatch.setattr(rr, "_load_per_core", lambda: 0.1)
    _optimize(tmp_path, "d.onnx", measure_budget_s=12.0)  # a larger budget: timed again too
    assert fake.regions > second


@pytest.mark.parametrize("whole", [1.2, 1.0])
def test_a_slower_whole_model_confirmation_writes_the_original(tmp_path, monkeypatch, whole):
    """Slower as a whole, or no faster (1.0): every timed rewrite is undone where no group is faster alone."""
    fake = _fake_interleaved(0.8)
    fake.whole = whole
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    r, out = _optimize(tmp_path, "o.onnx", cache=False)
    assert r.measure.dropped_everything and r.measure.final.median == pytest.approx(whole)
    assert r.measure.final.verdict == ("slower" if whole > 1 else "no significant change")
    assert r.measure.note.startswith(f"the kept selection measured {whole:.3f} as a whole (") and \
        r.measure.note.endswith(": every timed rewrite is undone")
    assert not any(k.startswith("com.microsoft") for k in r.ops_after)
    onnx.checker.check_model(onnx.load(str(out)))


def test_a_selection_a_little_faster_as_a_whole_within_the_noise_floor_is_kept(tmp_path, monkeypatch):
    """0.997 is within the floor, but not 'no faster': the best group alone is tried too (0.997 again, no better),
    and what its regions measured alone stands."""
    fake = _fake_interleaved(0.8)
    fake.whole = 0.997
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))
    r, out = _optimize(tmp_path, "o.onnx", cache=False)
    m = r.measure
    assert not m.dropped_everything and m.note.startswith("the kept selection measured 0.997 as a whole (within "
                                                          "the noise floor); ") and m.note.endswith(": kept as it is")
    assert "the group that saved the most alone, measured 0.997 alone" in m.note
    assert any(k.startswith("com.microsoft") for k in r.ops_after)


@pytest.mark.parametrize("whole,how", [(1.2, "slower"), (1.003, "no faster than the original"),
                                       (0.996, "within the noise floor")])
def test_a_selection_slower_as_a_whole_keeps_the_group_that_is_faster_alone(tmp_path, monkeypatch, whole, how):
    """Regions timed alone need not compose: the whole selection measures slower, or no faster at all (1.003,
    within the noise floor: transformer_small's Attention + EmbedLayerNormalization + BiasGelu at 1.008 with a 1%
    floor, where its Attention alone measured 0.893), the group that saved the most alone is confirmed alone
    (faster) and kept, the other groups dropped; the report says why. So is one a hair faster, within the floor
    (0.996): the same regions' selection measured 0.992 quiet and 1.004 loaded on transformer_small, and which side
    of 1 its median fell chose between two outputs 8% apart."""
    fake = _fake_interleaved(0.8)
    fake.wholes = [whole, 0.85]  # the whole selection, then the best group alone
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))
    r, out = _optimize(tmp_path, "o.onnx", cache=False)
    m = r.measure
    assert not m.dropped_everything and m.final.median == pytest.approx(0.85, abs=0.01)
    assert f"measured {whole:.3f} as a whole ({how})" in m.note and "kept alone" in m.note
    kept = {g.group for g in m.groups if g.kept and g.source == "timed"}
    assert len(kept) == 1, kept
    dropped = [g for g in m.groups if g.source == "timed" and not g.kept]
    assert dropped and all(f"measured {how} as a whole" in g.why for g in dropped)
    assert r.validation == "passed"
    onnx.checker.check_model(onnx.load(str(out)))


def _with_exact_rewrite(path):
    """Conv -> Relu (conv-relu: a region that is timed) -> + 0 (add-zero: removes a node, exact) -> Sigmoid."""
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c"], ["r"]),
             oh.make_node("Add", ["r", "zero"], ["z"]), oh.make_node("Sigmoid", ["z"], ["y"])]
    inits = {"w": rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32),
             "zero": np.zeros(1, np.float32)}
    onnx.save(make_model(nodes, [("x", [1, 8, 16, 16])], [("y", [1, 8, 16, 16])], inits), path)
    return path


def test_a_selection_dropped_as_slower_keeps_the_exact_rewrites(tmp_path, monkeypatch, fake_timer):
    """The confirmation measures the kept selection slower: the timed rewrites are dropped, and the exact ones
    (a node removed), which were not timed and cannot have made it slower, stay, as where nothing is measured;
    the rerun that reuses the selection writes the same bytes."""
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    src = _with_exact_rewrite(str(tmp_path / "m.onnx"))
    fake_timer(0.8, 1.2)
    r = optimize(src, str(tmp_path / "o.onnx"), OptimizeOptions())
    assert r.measure.dropped_everything and r.measure.final.verdict == "slower"
    assert r.fired == {"add-zero": 1}
    assert [x.op_type for x in onnx.load(str(tmp_path / "o.onnx")).graph.node] == ["Conv", "Relu", "Sigmoid"]
    assert {g.source: g.kept for g in r.measure.groups} == {"timed": False, "exact": True}
    r2 = optimize(src, str(tmp_path / "o2.onnx"), OptimizeOptions())
    assert "earlier run" in r2.measure.note and r2.fired == {"add-zero": 1}
    assert (tmp_path / "o.onnx").read_bytes() == (tmp_path / "o2.onnx").read_bytes()


def test_the_confirmation_reports_each_profile(tmp_path, monkeypatch, cli):
    """With shape profiles (a KV-cache decoder's prefill and decode), the whole-model confirmation gives each
    profile's ratio besides their weighted total, in the report, its JSON and the decision cache."""
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fake = _fake_interleaved(0.8)
    fake.whole, fake.per_profile = 0.9, [0.85, 0.97]
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    profiles = ["small:batch=1", "large:batch=3@2"]
    r, _ = _optimize(tmp_path, "o.onnx", profiles=profiles)
    assert r.measure.confirmed == "timed"
    got = [(n, w, round(x.median, 3)) for n, w, x in r.measure.profiles]
    assert got == [("small", 1.0, 0.85), ("large", 2.0, 0.97)]
    assert [p["name"] for p in r.measure.to_json()["profiles"]] == ["small", "large"]
    r2, _ = _optimize(tmp_path, "o2.onnx", profiles=profiles)  # from the cache: reported the same
    assert [(n, w, round(x.median, 3)) for n, w, x in r2.measure.profiles] == got
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o3.onnx", "--profile", profiles[0], "--profile",
                               profiles[1], measure=True)
    assert code == 0, stderr
    text = " ".join(stdout.split())
    assert "each profile alone (its own shapes), candidate / original: small (weight 1) 0.850" in text
    assert "candidate / original latency at 1 thread(s), weighted total over the shape profiles" in text


def test_decisions_are_cached_and_a_second_run_writes_the_same_bytes(tmp_path, monkeypatch, fake_timer):
    """On fake timings (what real ones decide on a busy machine is no test: a first run that kept nothing
    confirmed nothing, and the second had no confirmation to reuse): regions faster, the selection faster."""
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fake_timer(0.8, 0.9)
    r1, out1 = _optimize(tmp_path, "a.onnx")
    assert {g.source for g in r1.measure.groups} >= {"timed"}, [(g.group, g.source) for g in r1.measure.groups]
    assert r1.measure.confirmed == "timed" and any(g.kept for g in r1.measure.groups)
    assert os.path.exists(tmp_path / "cache" / "decisions.json")

    def no_timing(*a, **k):
        raise AssertionError("a cached decision was timed again")

    fake_timing(monkeypatch, no_timing)
    r2, out2 = _optimize(tmp_path, "b.onnx")
    assert "timed" not in {g.source for g in r2.measure.groups}
    assert {g.source for g in r2.measure.groups} >= {"cached"} and r2.measure.confirmed == "cached"
    assert out1.read_bytes() == out2.read_bytes()
    # the same file again: the whole selection is reused, nothing is captured or timed
    assert "capture" not in r2.measure.phases and "earlier run" in r2.measure.note
    assert [(g.group, g.kept) for g in r2.measure.groups] == [(g.group, g.kept) for g in r1.measure.groups]
    again = fake_timer(0.8, 0.9)
    r3, _ = _optimize(tmp_path, "c.onnx", cache=False)  # --no-cache times again
    assert "cached" not in {g.source for g in r3.measure.groups} and "timed" in {g.source for g in r3.measure.groups}
    assert again.calls


def test_a_budget_too_small_leaves_the_unreached_regions_as_the_original(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fake_timing(monkeypatch, _fake_interleaved(0.5))
    fake_clocks(monkeypatch, stepping_clock())
    r, out = _optimize(tmp_path, "o.onnx", measure_budget_s=4.0)
    sources = [g.source for g in r.measure.groups]
    assert "budget" in sources and r.measure.undecided == sources.count("budget")
    # what was not reached stays as the original unless a prior keeps it, and its row says which
    assert all(("kept: " in g.why or "measured faster" in g.why) is g.kept
               for g in r.measure.groups if g.source == "budget")
    onnx.checker.check_model(onnx.load(str(out)))
    # the same budget again: the same choices (what was not reached is not reached again), the same bytes
    r2, out2 = _optimize(tmp_path, "o2.onnx", measure_budget_s=4.0)
    assert [g.source for g in r2.measure.groups].count("budget") == r.measure.undecided
    assert out.read_bytes() == out2.read_bytes()
    # a larger budget times what the smaller one did not reach
    fake_clocks(monkeypatch, stepping_clock(step=1e-4))
    r3, _ = _optimize(tmp_path, "o3.onnx", measure_budget_s=100.0)
    assert "budget" not in [g.source for g in r3.measure.groups]


def test_cache_survives_a_broken_file_and_is_cleared(tmp_path):
    c = DecisionCache(directory=str(tmp_path))
    (tmp_path / "decisions.json").write_text("{not json")
    assert c.get("k") is None
    c.put("k", {"kind": "region", "keep": True, "ratio": [0.9, 0.8, 1.0]})
    c.save()
    data = json.loads((tmp_path / "decisions.json").read_text())
    assert data["decisions"]["k"]["keep"] is True
    assert DecisionCache(directory=str(tmp_path)).get("k")["ratio"] == [0.9, 0.8, 1.0]
    assert DecisionCache(directory=str(tmp_path)).clear() == 1
    assert not (tmp_path / "decisions.json").exists()
    off = DecisionCache(enabled=False, directory=str(tmp_path))
    off.put("k", {"keep": True})
    off.save()
    assert not (tmp_path / "decisions.json").exists()


def test_verdict_uses_the_two_original_sessions_as_noise_floor():
    a = [1.0] * 20
    b = [1.03] * 20  # two sessions of one model differ by 3%
    f = [0.99] * 20
    v = verdict({"a": a, "b": b, "f": f}, "f", ("a", "b"))
    ratio, floor = v.ratio, v.floor
    assert abs(floor - 0.03) < 1e-9 and ratio.median < 1
    # the CI is below 1 but not beyond the noise floor: said so, not "no significant change"
    assert ratio.verdict_beyond(floor) == "within the noise floor (±3.5%): not counted as faster"
    assert Ratio(0.9, 0.88, 0.92).verdict_beyond(floor) == "faster"


def test_verdict_wording_agrees_with_the_ci():
    """The issue's `0.949 [0.901, 0.985] -> no significant change`: a CI entirely below 1 that does not clear
    the noise floor is reported as within it; "no significant change" only for a CI that contains 1."""
    assert Ratio(0.949, 0.901, 0.985).verdict_beyond(0.1) == "within the noise floor (±10.5%): not counted as faster"
    assert Ratio(1.05, 1.01, 1.09).verdict_beyond(0.1) == "within the noise floor (±10.5%): not counted as slower"
    assert Ratio(0.99, 0.95, 1.02).verdict_beyond(0.0) == "no significant change"
    assert Ratio(0.949, 0.901, 0.985).verdict_beyond(0.0) == "faster"


def test_rules_shadowed_by_a_dropped_region_are_timed_in_a_second_pass(tmp_path, monkeypatch):
    """self-attention consumes the Q.K scale that matmul-scale would fuse. With Attention regions slower and
    FusedMatMul regions faster, the first pass drops Attention; the second lets matmul-scale fire, times it
    and keeps it. Nothing enters the output untimed."""
    from onnxfuse.select.decide import Evidence

    def fake_time_class(self, c, deadline):
        ratio = 1.2 if any("Attention" in o for o in c.regions[0].ops) else 0.8
        return Evidence(Ratio(ratio, ratio - 0.01, ratio + 0.01), 0.005, 0.05)

    monkeypatch.setattr(rr.RegionRun, "time_class", fake_time_class)
    fake_timing(monkeypatch, _fake_interleaved(1.0))  # the confirmation: no change
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # the second pass fits whatever the load
    r = optimize(BERT, str(tmp_path / "out.onnx"), OptimizeOptions(cache=False))
    assert "self-attention" not in r.fired and r.fired.get("matmul-scale", 0) >= 2, r.fired
    rows = {g.group: g for g in r.measure.groups if g.source == "timed"}
    assert rows["com.microsoft.FusedMatMul"].kept
    assert any(not g.kept for name, g in rows.items() if "Attention" in name)
    # an op measured slower is not timed again on the same nodes under another rule's name, in any later pass:
    # Attention once (self-attention), MultiHeadAttention once (cross-attention, not also the heads rules)
    assert {tuple(g.rules) for g in r.measure.groups if "Attention" in g.group} == {("self-attention",),
                                                                                     ("cross-attention",)}
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node]
    assert ops.count("FusedMatMul") == r.fired["matmul-scale"] and "Attention" not in ops


def test_a_budget_too_small_to_time_anything_decides_every_unit_by_its_prior(tmp_path, monkeypatch):
    """A budget limits what is timed, never what is kept: with no time for a single class, every unit follows its
    prior (the rules' expect:, the op cost), none is "not measured", and the output still validates."""
    fake_clocks(monkeypatch, stepping_clock())  # every session and run seems to take 0.4 s
    r, out = _optimize(tmp_path, "o.onnx", cache=False, measure_budget_s=0.5)
    m = r.measure
    assert not m.note.startswith("not measured") and m.undecided == len(m.groups) - sum(
        g.source in ("exact", "untimed", "model") for g in m.groups)
    assert all(g.source == "budget" and g.effect is None and "not timed within the budget; " in g.why
               for g in m.groups if g.source not in ("exact", "untimed"))
    conv_add = [g for g in m.groups if g.rules == ["conv-add-fold"]]
    assert conv_add and all(g.kept and "op cost" in g.why for g in conv_add)  # removes work into a standard op
    assert r.validation == "passed"
    onnx.checker.check_model(onnx.load(str(out)))


def test_a_model_of_the_same_architecture_reuses_the_decisions(tmp_path, monkeypatch, fake_timer):
    """Other weights, same graph and shapes: every class is decided from the cache, nothing is timed."""
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fake_timer()  # a busy machine could leave every class undecided in the first run
    first = _gelu_chain(str(tmp_path / "a.onnx"), seed=0)
    second = _gelu_chain(str(tmp_path / "b.onnx"), seed=1)
    r1 = optimize(first, str(tmp_path / "a.opt.onnx"), OptimizeOptions())
    assert "timed" in {g.source for g in r1.measure.groups}
    fake_timing(monkeypatch, lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed")))
    r2 = optimize(second, str(tmp_path / "b.opt.onnx"), OptimizeOptions())
    sources = {g.source for g in r2.measure.groups}
    assert "timed" not in sources and "cached" in sources
    assert [g.kept for g in r1.measure.groups] == [g.kept for g in r2.measure.groups]


def test_profiles_count_by_weight_not_by_duration(monkeypatch):
    """A fused version 5% faster at prefill (10 s) but 20% slower at decode (1 s) is slower at equal weights:
    each profile counts relative to the original's time there (as seconds, the prefill would hide the decode)."""
    clock = [0.0]
    fake_clocks(monkeypatch, lambda: clock[0])

    class Fake:
        def __init__(self, costs):
            self.costs = costs

        def run(self, _outputs, feeds):
            clock[0] += self.costs[feeds["p"]]

    sessions = {"a": Fake([10.0, 1.0]), "b": Fake([10.0, 1.0]), "f": Fake([9.5, 1.2])}
    times = interleave(sessions, [(1.0, {"p": 0}), (1.0, {"p": 1})], estimator="wall", min_runs=10, deadline=1e9)
    v = verdict(times, "f", ("a", "b"))
    assert v.ratio.median == pytest.approx((0.95 + 1.2) / 2) and v.floor == MIN_FLOOR and v.ratio.verdict == "slower"
    assert times.profile("f", 0)[0] == pytest.approx(9.5) and times.profile("a", 1)[0] == pytest.approx(1.0)  # seconds per profile, as run
    times = interleave(sessions, [(3.0, {"p": 0}), (1.0, {"p": 1})], estimator="wall", min_runs=10,
                       deadline=1e9)  # prefill counts 3x
    assert verdict(times, "f", ("a", "b")).ratio.median == pytest.approx((3 * 0.95 + 1.2) / 4)
    single = interleave(sessions, [(1.0, {"p": 0})], estimator="wall", min_runs=10, deadline=1e9)
    assert single["f"][0] == 9.5  # one profile: plain seconds


def test_the_automatic_budget_follows_the_models_run_time_not_the_load():
    """12 s and 225 runs of the model (the confirmation's and a group's rounds fit), 12-90 s, more past 1 GiB; it is
    counted on the budget clock, so a loaded machine buys the same runs."""
    assert rr.automatic_budget(0.0, 10**6) == rr.AUTO_MIN_S
    assert rr.automatic_budget(0.1, 10**6) == pytest.approx(rr.AUTO_BASE_S + 0.1 * rr.AUTO_RUNS)
    assert rr.automatic_budget(5.0, 10**6) == rr.AUTO_MAX_S
    assert rr.automatic_budget(0.1, 2 * 2**30) == pytest.approx(2 * (rr.AUTO_BASE_S + 0.1 * rr.AUTO_RUNS))


def test_the_budget_clock_is_thread_cpu_time_until_the_wall_runs_past_its_cap(monkeypatch):
    from onnxfuse.measure.budget import WALL_CAP, budget_clock

    wall, cpu = [100.0], [5.0]
    monkeypatch.setattr(time, "perf_counter", lambda: wall[0])
    monkeypatch.setattr(time, "thread_time", lambda: cpu[0])
    clock = budget_clock("cpu")
    wall[0], cpu[0] = 102.0, 6.0  # loaded: 2 s of wall for 1 s of CPU
    assert clock() == 1.0
    wall[0] = 100.0 + 10 * WALL_CAP  # past the cap: the wall counts
    assert clock() == pytest.approx(10.0)
    wall_clock = budget_clock("wall")
    wall[0] += 3.0
    assert wall_clock() == pytest.approx(3.0)


def test_a_region_input_without_a_known_shape_is_static_only_where_every_profile_agrees():
    """Prefill (seq 32) and decode (seq 1) feed the same region model: a value the original gives no shape is
    typed from the captured values, and a dim that differs between them must not be declared static (onnxruntime
    refused the decode run: 'Got invalid dimensions ... Got: 1 Expected: 32', an internal error)."""
    region = type("R", (), {})()
    region.original = region.fused = [oh.make_node("Relu", ["v"], ["y"])]
    region.orig_consts = region.fused_consts = {}
    region.inputs, region.outputs = ["v"], ["y"]
    region.types = {"v": TensorType(1, None)}
    profiles = [{"v": np.ones((1, 32, 64), np.float32)}, {"v": np.ones((1, 1, 64), np.float32)}]
    m = onnx.load_from_string(region_model(region, False, {"": 17}, 8, profiles))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 0, 64] and dims[1].dim_param
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in profiles:
        assert sess.run(None, feeds)[0].shape == feeds["v"].shape


def test_a_region_reading_a_few_integers_is_shape_arithmetic_only_if_it_writes_integers():
    """An embedding lookup at a short sequence reads 64 token ids, as shape arithmetic reads a few integers; it
    writes floats, so it is timed (it was kept untimed as 'acts on shape values only')."""
    def cls(out_type):
        region = type("R", (), {})()
        region.outputs, region.types = ["y"], {"y": TensorType(out_type, (1, 64, 32))}
        return RegionClass("sig", [region], [{"ids": np.zeros((1, 64), np.int64)}])
    assert not cls(onnx.TensorProto.FLOAT).shape_only
    assert cls(onnx.TensorProto.INT64).shape_only


def test_a_whole_model_comparison_runs_on_to_its_minimum_time(monkeypatch):
    """20 runs of a 0.1 ms model are 2 ms of timing, too few for a verdict: runs continue to min_seconds (and
    stop at min_runs without it, or at MAX_RUNS). A fake clock: a run takes 0.1 ms of it (a real sleep of 0.1 ms
    takes a millisecond or more on a busy machine, and 20 rounds then passed min_seconds)."""
    clock = [0.0]
    monkeypatch.setattr(rt.time, "perf_counter", lambda: clock[0])

    class S:
        def run(self, _out, _feeds):
            clock[0] += 0.0001
    sessions = {"a": S(), "b": S()}
    far = 60.0
    short = interleave(sessions, [(1.0, {})], estimator="wall", min_runs=20, deadline=far, hard_deadline=far, repeat=1)
    long = interleave(sessions, [(1.0, {})], estimator="wall", min_runs=20, deadline=far, hard_deadline=far,
                      min_seconds=0.05, repeat=1)
    assert len(short["a"]) == 20 and 20 < len(long["a"]) <= rt.MAX_RUNS
    assert len(long["a"]) == pytest.approx(0.05 / 0.0002, abs=1)  # two sessions a round, until 50 ms
    capped = interleave(sessions, [(1.0, {})], estimator="wall", min_runs=20, deadline=far, hard_deadline=far,
                        min_seconds=10.0, repeat=1)
    assert len(capped["a"]) == rt.MAX_RUNS

    # by default a round of this 0.1 ms model is ROUND_S of runs of each session (after one warm-up run each)
    before = clock[0]
    auto = interleave(sessions, [(1.0, {})], estimator="wall", min_runs=20, deadline=far, hard_deadline=far,
                      keep_runs=True)
    reps = len(auto.single_runs("a")) / 20
    assert len(auto["a"]) == 20 and reps == pytest.approx(rt.ROUND_S / 0.0001, abs=1)
    assert clock[0] - before == pytest.approx((2 + 20 * reps * 2) * 0.0001)


def test_regions_carry_the_op_cost_their_rewrite_makes():
    """The op-cost prior's count, on the bundled models' regions: an Add folded into a Conv's bias removes one call
    and the bytes the Add moved, into a standard op (removes work); a FusedConv removes a call and bytes but is a
    contrib kernel (not a prior); every count is at both sizes of a symbolic dim."""
    _, _, regions = _regions(CNN)
    by_rule = {tuple(r.rules): r.cost for r in regions if r.cost is not None}
    fold = by_rule[("conv-add-fold",)]
    assert fold.calls == (2, 1) and fold.removes_work and all(f < o for o, f in fold.bytes)
    assert fold.flops[0][1] <= fold.flops[0][0]
    relu = by_rule[("conv-relu",)]
    assert relu.calls == (2, 1) and not relu.standard and not relu.removes_work
    _, _, llama = _regions(LLAMA)
    costs = [r.cost for r in llama if r.cost is not None]
    assert costs and all(len(c.bytes) == 2 for c in costs)
    assert any(c.bytes[0] != c.bytes[1] for c in costs)  # the symbolic dims count at each size


def _exact_and_timed(path: str) -> str:
    """x * 1 (mul-one: exact, removes a node) before a Conv + Relu (timed)."""
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Mul", ["x", "one"], ["m"]), oh.make_node("Conv", ["m", "w", "b"], ["c"], pads=[1] * 4),
             oh.make_node("Relu", ["c"], ["y"])]
    inits = {"one": np.array(1.0, np.float32), "w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(8).astype(np.float32)}
    onnx.save(make_model(nodes, [("x", [1, 4, 16, 16])], [("y", [1, 8, 16, 16])], inits), path)
    return path


@pytest.mark.parametrize("whole", [0.9, 1.2])
def test_only_exact_rewrites_kept_are_timed_where_the_budget_has_the_time(tmp_path, monkeypatch, whole):
    """The timed class measures slower and is left out; the exact rewrite (x * 1 removed) is timed on the whole
    model all the same: faster, it stays and the effect said is the measured one; slower, none is made."""
    model = _exact_and_timed(str(tmp_path / "m.onnx"))
    fake = _fake_interleaved(1.2)
    fake.whole = whole
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))
    r = optimize(model, str(tmp_path / "o.onnx"), OptimizeOptions(cache=False))
    m = r.measure
    assert [g.kept for g in m.groups if g.source == "timed"] == [False]
    assert m.confirmed == "timed" and m.final is not None and m.final.median == pytest.approx(whole, abs=0.01)
    if whole < 1:
        assert m.final.verdict_beyond(m.floor) == "faster" and not m.dropped_everything
        assert r.ops_after.get("Mul", 0) == 0 and r.fired == {"mul-one": 1}
    else:
        assert m.dropped_everything and m.note.startswith("only exact rewrites were kept, and they measured 1.2")
        assert r.ops_after.get("Mul") == 1 and r.fired == {}
        assert [g.kept for g in m.groups] == [False] * len(m.groups)


def test_runs_each_asks_for_single_runs_and_not_rounds():
    """bench's --runs counts runs of each model; a round holds `repeat` runs of each session."""
    calls = {"a": 0, "b": 0}

    class S:
        def __init__(self, k):
            self.k = k

        def run(self, *_):
            calls[self.k] += 1

    t = interleave({"a": S("a"), "b": S("b")}, [(1.0, {})], estimator="wall", min_runs=rt.MIN_RUNS_FLOOR,
                   repeat=5, runs_each=100, keep_runs=True)
    assert len(t["a"]) == 20 and len(t.single_runs("a")) == 100
    assert calls == {"a": 101, "b": 101}  # and one warm-up run each
    t = interleave({"a": S("a")}, [(1.0, {})], estimator="wall", min_runs=rt.MIN_RUNS_FLOOR, repeat=50,
                   runs_each=100)
    assert len(t["a"]) == rt.MIN_RUNS_FLOOR  # two rounds would hold them: the floor of rounds stays


def test_the_floor_of_rounds_is_planned_on_what_a_round_holds():
    """A round of a short model holds several runs of each session (round_s of them): whether the floor of
    rounds fits before the hard deadline counts them all, not the warm-up's one run each."""
    import time as _time

    class Sleeper:
        def run(self, *_):
            _time.sleep(1e-3)

    sessions = {"a": Sleeper(), "b": Sleeper()}
    # 8 rounds of two sessions x 10 ms of runs: about 0.16 s; the warm-up's single runs would say 16 ms
    with pytest.raises(rt.OutOfBudget):
        interleave(sessions, [(1.0, {})], estimator="wall", min_runs=8, round_s=0.01,
                   hard_deadline=_time.perf_counter() + 0.1)
    t = interleave(sessions, [(1.0, {})], estimator="wall", min_runs=8, round_s=0.01,
                   hard_deadline=_time.perf_counter() + 5.0)
    assert len(t["a"]) == 8


def test_the_confirmation_runs_on_while_its_verdict_is_undecided(tmp_path, monkeypatch):
    """The whole-model confirmation asks, as a region class does, whether its verdict is clear of the faster line
    (margin: SIGNIFICANT plus the floor of its two twins), and runs on while it is not; a selection 2% faster with
    a 1% margin was kept whole in one run and cut to its best group in the next, by which side of the line its
    interval fell."""
    fake = _fake_interleaved(0.8)
    asked = []

    def recording(sessions, profiles, **kw):
        if "f" not in sessions:
            asked.append(kw.get("settled"))
        return fake(sessions, profiles, **kw)
    fake_timing(monkeypatch, recording)
    fake_clocks(monkeypatch, stepping_clock(1e-4))
    r, _ = _optimize(tmp_path, "o.onnx", cache=False)
    assert r.measure.confirmed == "timed" and asked and asked[-1] is model_settled

    rng = np.random.default_rng(0)
    base = 1e-3 * (1 + 0.01 * rng.standard_normal(12))

    def timings(ratio, spread):
        noise = 1 + spread * rng.standard_normal(12)
        return Timings.of({"o": list(base), "o2": list(base), "c": list(base * ratio * noise),
                           "c2": list(base * ratio * noise)}, "cpu", 1)
    assert model_settled(timings(0.90, 0.002))  # clear of 0.99: faster
    assert model_settled(timings(1.00, 0.002))  # clear of it the other way: not faster, whatever more show
    assert not model_settled(timings(0.99, 0.02))  # across it: measured longer


