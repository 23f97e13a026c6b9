"""The decision cache never fails a run (docs/measured-selection.md): a file that is valid JSON of the wrong shape,
entries of the wrong types, or any JSON value at all is read as far as it can be used; what is left out is one
warning line, and `onnxfuse cache show` says so (exit 0)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import MODELS
from hypothesis import given
from hypothesis import strategies as st

from onnxfuse.select.cache_entries import entry_problem
from onnxfuse.select.decision_cache import FORMAT, DecisionCache

CNN = os.path.join(MODELS, "cnn_small.onnx")
REGION = {"kind": "region", "ratio": [0.9, 0.8, 1.0], "source": "timed", "label": "FusedConv",
          "rules": ["conv-relu"], "model": "m.onnx", "threads": 1, "floor": 0.01, "when": "2026-01-01T00:00:00"}
GOOD = {"format": FORMAT, "decisions": {"r" * 64: REGION}}

# (case, file content): every one is read without an exception
MALFORMED = [
    ("decisions a list", {"decisions": []}),
    ("decisions a list, right format", {"format": FORMAT, "decisions": []}),
    ("a top-level list", [1, 2, 3]),
    ("a top-level string", "decisions"),
    ("null", None),
    ("entries as strings", {"format": FORMAT, "decisions": {"a": "x", "b": "y"}}),
    ("an entry without a kind", {"format": FORMAT, "decisions": {"a": {"keep": True}}}),
    ("an unknown kind", {"format": FORMAT, "decisions": {"a": {"kind": "other"}}}),
    ("a kind of the wrong type", {"format": FORMAT, "decisions": {"a": {"kind": ["region"], "keep": True}}}),
    ("a region without its interval", {"format": FORMAT, "decisions": {"a": {"kind": "region"}}}),
    ("an interval of strings", {"format": FORMAT, "decisions": {"a": {**REGION, "ratio": ["a", "b", "c"]}}}),
    ("ratio a string", {"format": FORMAT, "decisions": {"a": {**REGION, "ratio": "0.9"}}}),
    ("ratio too short", {"format": FORMAT, "decisions": {"a": {**REGION, "ratio": [0.9]}}}),
    ("budget a string", {"format": FORMAT, "decisions": {"a": {**REGION, "budget": "4"}}}),
    ("rules a string", {"format": FORMAT, "decisions": {"a": {**REGION, "rules": "conv-relu"}}}),
    ("profiles nested wrong", {"format": FORMAT, "decisions": {"a": {"kind": "model", "profiles": [["p", 1, "x"]]}}}),
    ("a selection with a report of the wrong shape", {"format": FORMAT, "decisions": {"a": {
        "kind": "selection", "kept": [["r", "v"]], "dropped": [], "dropped_everything": False, "undecided": 0,
        "budget": 4.0, "report": {"groups": [{"group": 1}]}}}}),
    ("a selection with kept rewrites as strings", {"format": FORMAT, "decisions": {"a": {
        "kind": "selection", "kept": ["r"], "dropped": [], "dropped_everything": False, "undecided": 0,
        "budget": 4.0, "report": {}}}}),
]


def _cache(tmp_path, content) -> DecisionCache:
    (tmp_path / "decisions.json").write_text(content if isinstance(content, str) else json.dumps(content))
    return DecisionCache(directory=str(tmp_path))


@pytest.mark.parametrize("case,content", MALFORMED, ids=[c for c, _ in MALFORMED])
def test_a_malformed_cache_is_read_without_failing(tmp_path, case, content):
    c = _cache(tmp_path, content)
    assert c.get("a") is None
    assert len(c.warnings) == 1, c.warnings
    summary = c.summary()
    assert summary["decisions"] == 0 and len(summary["warnings"]) == 1


def test_good_entries_are_kept_and_bad_ones_skipped_with_one_warning(tmp_path):
    data = {"format": FORMAT, "decisions": {"g" * 64: REGION, "b" * 64: "x", "c" * 64: {**REGION, "ratio": 1}}}
    c = _cache(tmp_path, data)
    assert c.get("g" * 64) == REGION
    assert c.get("b" * 64) is None and c.get("c" * 64) is None
    assert c.warnings == [f"{tmp_path / 'decisions.json'}: 2 malformed decision(s) skipped ("
                          f"{'b' * 12}: a str, not an object; {'c' * 12}: 'ratio' of the wrong type)"]
    # the next save keeps the good one and drops the bad ones
    c.put("n" * 64, REGION)
    c.save()
    assert set(json.loads((tmp_path / "decisions.json").read_text())["decisions"]) == {"g" * 64, "n" * 64}


def test_a_decision_is_read_only_by_the_kind_it_is():
    assert entry_problem(REGION) is None
    assert entry_problem({**REGION, "kind": "model"}) is None


def test_a_region_key_holding_another_kind_is_a_miss(tmp_path):
    c = _cache(tmp_path, {"format": FORMAT, "decisions": {"k": {"kind": "model", "ratio": [1.0, 0.9, 1.1]}}})
    assert c.get("k", ("region",)) is None and c.get("k", ("model",)) is not None


def test_deeply_nested_json_is_ignored(tmp_path):
    c = _cache(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert c.get("a") is None and len(c.warnings) == 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20)
KINDS = st.sampled_from(["region", "model", "on model", "selection", "other"])


@given(st.one_of(JSON, st.dictionaries(st.text(max_size=8), JSON, max_size=3).map(
    lambda d: {"format": FORMAT, "decisions": d}), st.dictionaries(
    st.text(max_size=8), st.fixed_dictionaries({"kind": KINDS}, optional={
        k: JSON for k in ("keep", "ratio", "budget", "rules", "profiles", "kept", "dropped", "report", "floor",
                          "undecided", "dropped_everything", "threads", "why", "source")}), max_size=3).map(
    lambda d: {"format": FORMAT, "decisions": d})))
def test_any_json_value_is_handled(tmp_path_factory, value):
    """Whatever JSON the file holds, reading it never raises, and every entry it keeps is one its readers can
    use (entry_problem), and `cache show`'s line for it is printed without an error."""
    from onnxfuse.cli.cache import _cache_line

    tmp = tmp_path_factory.mktemp("cache")
    c = _cache(tmp, value)
    summary = c.summary()
    for key, entry in summary["entries"].items():
        assert entry_problem(entry) is None
        assert c.get(key) == entry
        _cache_line(key, entry)


def test_cache_show_names_what_it_skipped(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path))
    (tmp_path / "decisions.json").write_text(json.dumps(
        {"format": FORMAT, "decisions": {"g" * 64: REGION, "b" * 64: ["x"]}}))
    code, stdout, stderr = cli("cache", "show")
    assert code == 0
    assert stderr.strip() == (f"onnxfuse: warning: {tmp_path / 'decisions.json'}: 1 malformed decision(s) skipped "
                              f"({'b' * 12}: a list, not an object)")
    assert "1 decision(s) (1 region), 1 malformed skipped" in stdout
    code, stdout, _ = cli("cache", "show", "--json")
    assert code == 0 and json.loads(stdout)["skipped"] == 1
    (tmp_path / "decisions.json").write_text('{"decisions": []}')
    code, stdout, stderr = cli("cache", "show")
    assert code == 0 and "not a decision cache" in stderr and "0 decision(s)" in stdout


def test_optimize_goes_on_with_a_cache_of_the_wrong_shape(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    path = tmp_path / "cache" / "decisions.json"
    path.write_text(json.dumps({"format": FORMAT, "decisions": {"a" * 64: "x", "b" * 64: {"kind": "selection"}}}))
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--measure-budget", "2", "--json",
                               measure=True)
    assert code == 0, stderr
    warning = f"{path}: 2 malformed decision(s) skipped ({'a' * 12}: a str, not an object; {'b' * 12}: no 'budget')"
    assert stderr.strip().splitlines() == [f"onnxfuse: warning: {warning}"]
    result = json.loads(stdout)
    assert result["warnings"] == [warning] and result["measure"]["warnings"] == [warning]
    assert (tmp_path / "o.onnx").exists()
    assert set(json.loads(path.read_text())["decisions"]).isdisjoint({"a" * 64, "b" * 64})  # dropped on save


def test_a_cached_selection_report_round_trips_in_its_own_format():
    """The cache keeps a selection's report in cached_report.py's format, not the public --json schema: what
    to_cache writes passes the shape check and from_cache gives the same rows back (timed rows as cached)."""
    from onnxfuse.measure.stats import Ratio
    from onnxfuse.select.cache_entries import entry_problem
    from onnxfuse.select.cached_report import from_cache, to_cache
    from onnxfuse.select.report import GroupEffect, MeasureReport

    rep = MeasureReport("cpu", 1, 3, estimator="cpu", final=Ratio(0.9, 0.85, 0.95), floor=0.01,
                        confirmed="timed", profiles=[("prefill", 1.0, Ratio(0.9, 0.8, 1.0))])
    rep.groups = [GroupEffect("Gelu", ["erf-gelu"], 4, True, Ratio(0.8, 0.7, 0.9), source="timed", instances=2,
                              floor=0.02, seconds_each=1e-3),
                  GroupEffect("FusedConv", ["conv-relu"], 1, False, None, source="undecided", why="x")]
    data = to_cache(rep)
    assert "with_over_without" not in str(data)  # not --json's keys
    entry = {"kind": "selection", "kept": [["erf-gelu", "v"]], "dropped": [], "dropped_everything": False,
             "undecided": 0, "budget": 4.0, "report": data}
    assert entry_problem(entry) is None
    back = MeasureReport("cpu", 1, 0)
    from_cache(data, back)
    assert [(g.group, g.kept, g.effect, g.source, g.instances, g.floor) for g in back.groups] == [
        ("Gelu", True, Ratio(0.8, 0.7, 0.9), "cached", 2, 0.02), ("FusedConv", False, None, "undecided", 1, 0.0)]
    assert back.final == rep.final and back.confirmed == "cached" and back.profiles == rep.profiles
    data["groups"][0]["effect"] = "0.8"
    assert entry_problem(entry) is not None  # a damaged entry is a miss, never a failed run
