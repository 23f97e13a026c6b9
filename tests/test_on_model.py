"""Rules that declare `measure: model` (a benefit that is non-local, such as se-gate-broadcast keeping the
convolutions around it in NCHWc) are decided on the whole model by region selection, not as regions: one row
per group (how: whole model), cached like the other decisions, within the budget. The mechanism is checked with
fake timings (a verdict on a loaded 2-core machine is no test) and once with real ones (a ratio, not a verdict)."""

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import fake_clocks, fake_timing, make_model, op_types, stepping_clock

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.measure.timing import Timings

RNG = np.random.default_rng(0)
C = 32


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


@pytest.fixture(scope="module")
def se_model(tmp_path_factory):
    """Conv -> Relu = c; its squeeze-excitation gate g (GlobalAveragePool, Conv, Relu, Conv, Sigmoid); y = Conv(c * g):
    conv-relu makes regions timed alone, se-gate-broadcast (measure: model) one decided on the whole model."""
    nodes = [oh.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c0"], ["c"]),
             oh.make_node("GlobalAveragePool", ["c"], ["p"]), oh.make_node("Conv", ["p", "w1", "b1"], ["r"]),
             oh.make_node("Relu", ["r"], ["rr"]), oh.make_node("Conv", ["rr", "w2", "b2"], ["e"]),
             oh.make_node("Sigmoid", ["e"], ["g"]), oh.make_node("Mul", ["c", "g"], ["m"]),
             oh.make_node("Conv", ["m", "w0", "b0"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w0": _w(C, C, 3, 3), "b0": _w(C), "w1": _w(8, C, 1, 1), "b1": _w(8), "w2": _w(C, 8, 1, 1), "b2": _w(C)}
    path = tmp_path_factory.mktemp("se") / "se.onnx"
    onnx.save(make_model(nodes, [("x", [1, C, 16, 16])], [("y", [1, C, 16, 16])], inits), str(path))
    return str(path)


def _fake(region_ratio, whole_ratio):
    """Regions' fused versions take region_ratio of their original's time; in a whole-model comparison (an
    on-model decision, the confirmation) the candidate takes whole_ratio of its base's."""
    def fake(sessions, profiles, *, estimator, **_kw):
        fake.calls.append(sorted(sessions))
        rng = np.random.default_rng(0)
        base = 1e-3 * (1 + 0.001 * rng.standard_normal(30))
        ratio = region_ratio if "f" in sessions else whole_ratio
        out = {k: list(base * (ratio if k in ("f", "c", "c2") else 1.0)) for k in sessions}
        return Timings.of(out, estimator, len(profiles))
    fake.calls = []
    return fake


def _rows(r, rule="se-gate-broadcast"):
    return [g for g in r.measure.groups if rule in g.rules]


@pytest.mark.parametrize("whole,kept", [(0.9, True), (1.1, False), (1.0, False)])
def test_a_rule_measured_on_the_model_is_decided_there_not_as_a_region(se_model, tmp_path, monkeypatch, whole, kept):
    """Its region alone is slower (as se-gate-broadcast's is); it is not timed as a region, and the whole-model
    comparison, with it against without it, decides."""
    fake = _fake(1.2, whole)
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    out = tmp_path / "o.onnx"
    r = optimize(se_model, str(out), OptimizeOptions(cache=False))
    (row,) = _rows(r)
    assert row.source == "model" and row.effect is not None and row.kept is kept
    assert abs(row.effect.median - whole) < 1e-6 and row.rewrites == 1
    # no change beyond the floor: its prior decides; a broadcast gate adds a call (a Resize), and nothing was
    # measured of its rule alone, so it stays out, and the row says why
    assert (row.why == "no significant change; nothing decided to follow") is (whole == 1.0)
    assert "on model" in r.measure.phases
    assert ("Resize" in op_types(out)) is kept
    assert not any(g.kept for g in r.measure.groups if g.source == "timed")  # the region classes: 1.2
    onnx.checker.check_model(onnx.load(str(out)))


def test_the_decision_on_the_model_is_cached_and_a_rerun_writes_the_same_bytes(se_model, tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fake_timing(monkeypatch, _fake(0.8, 0.9))
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    r1 = optimize(se_model, str(tmp_path / "a.onnx"), OptimizeOptions())
    assert [g.kept for g in _rows(r1)] == [True]

    def no_timing(*a, **k):
        raise AssertionError("a cached decision was timed again")

    fake_timing(monkeypatch, no_timing)
    r2 = optimize(se_model, str(tmp_path / "b.onnx"), OptimizeOptions())
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    (row,) = _rows(r2)
    assert row.source == "model" and row.why == "cached" and row.kept


def test_a_budget_that_does_not_reach_it_leaves_it_out_and_says_so(se_model, tmp_path, monkeypatch):
    fake_timing(monkeypatch, _fake(0.8, 0.9))
    fake_clocks(monkeypatch, stepping_clock())
    out = tmp_path / "o.onnx"
    r = optimize(se_model, str(out), OptimizeOptions(cache=False, measure_budget_s=4.0))
    (row,) = _rows(r)
    assert row.source == "budget" and not row.kept and row.why.startswith("whole model")
    assert r.measure.undecided == sum(g.source == "budget" for g in r.measure.groups)
    assert "Resize" not in op_types(out)


def test_without_such_rules_nothing_is_timed_on_the_model(se_model, tmp_path, monkeypatch):
    fake = _fake(0.8, 0.9)
    fake_timing(monkeypatch, fake)
    fake_clocks(monkeypatch, stepping_clock(1e-4))  # budgets and deadlines: not the load
    r = optimize(se_model, str(tmp_path / "o.onnx"), OptimizeOptions(cache=False, skip=["se-gate-broadcast"]))
    assert "on model" not in r.measure.phases and not _rows(r)
    assert sum("f" not in s for s in fake.calls) == 1  # the confirmation only


def test_real_timing_gives_the_row_a_ratio_and_the_output_validates(se_model, tmp_path):
    """Real sessions (no verdict asserted: CI machines are shared and have 2 cores)."""
    out = tmp_path / "o.onnx"
    r = optimize(se_model, str(out), OptimizeOptions(cache=False, measure_budget_s=60.0))
    (row,) = _rows(r)
    assert row.source == "model" and row.effect is not None and row.effect.low <= row.effect.median <= row.effect.high
    onnx.checker.check_model(onnx.load(str(out)))


def test_regions_that_cannot_be_timed_alone_are_decided_on_the_model_in_one_group():
    """A chain of rewrites reading each other's values (Transposes moved below a run of ops) cannot be timed region
    by region; such regions go to the whole-model decision together, the others stay with region timing."""
    from onnxfuse.select import on_model as om
    from onnxfuse.select.units import Untimeable

    def region(label, rules, why=None):
        r = type("R", (), {})()
        r.label, r.rules, r.untimeable = label, rules, why
        return r
    a = region("Transpose+Add", ["transpose-below-add-const"], Untimeable.READS_RENAMED)
    b = region("Transpose+Mul", ["transpose-below-mul-const"], Untimeable.REWRITTEN_AGAIN)
    c = region("FusedConv", ["conv-relu"])
    d = region("Resize+Mul", ["se-gate-broadcast"])
    e = region("", ["add-zero"], Untimeable.REMOVES_ONLY)
    alone, whole = om.split_on_model([a, b, c, d, e], {"se-gate-broadcast"})
    assert alone == [c, e] and whole == [a, b, d]
    groups = om.groups_on_model(whole)
    assert groups == {("Resize+Mul", ("se-gate-broadcast",)): [d],
                      (om.NOT_ALONE_LABEL, ("transpose-below-add-const", "transpose-below-mul-const")): [a, b]}
