"""Output on an 80-column terminal and into a pipe: at COLUMNS=80 no line is longer and no table cell is cut with
an ellipsis (cells fold); piped output is not wrapped at all (a line stays one line, for grep); the measure
table has one row per kind of alike classes, with their count."""

from __future__ import annotations

import json
import os

import pytest
from conftest import MODELS
from rich.console import Console

from onnxfuse.inspect.report import print_measure
from onnxfuse.measure.stats import Ratio
from onnxfuse.select.report import GroupEffect, MeasureReport

CNN = os.path.join(MODELS, "cnn_small.onnx")


@pytest.mark.parametrize("args", [("optimize", CNN, "{tmp}/o.onnx"), ("explain", CNN), ("explain", CNN, "--all"),
                                  ("patterns", "list"), ("patterns", "list", "--target", "cpu")])
def test_eighty_columns_fit_and_nothing_is_cut(cli, tmp_path, monkeypatch, args):
    monkeypatch.setenv("COLUMNS", "80")
    code, stdout, stderr = cli(*(a.format(tmp=tmp_path) for a in args))
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) > 5
    too_long = [ln for ln in lines if len(ln) > 80]
    assert not too_long, too_long
    assert "…" not in stdout


def test_piped_output_is_not_wrapped(cli, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    fired = json.loads(cli("explain", CNN, "--json")[1])["fired"]
    code, stdout, _ = cli("explain", CNN)
    assert code == 0
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("would fire")]
    assert line.endswith(", ".join(f"{k} x{v}" for k, v in sorted(fired.items())))
    assert len(line) > 160  # it was cut into lines of 160 before
    # every table row is one line: a cell's text is never continued on the next line
    rows = [ln for ln in stdout.splitlines() if ln.startswith("│ ")]
    assert rows and all(ln.split("│")[1].strip() for ln in rows)
    assert "…" not in stdout


def _group(rules, kept, median, source="timed"):
    return GroupEffect("com.microsoft.FusedConv", rules, 1, kept, Ratio(median, median - 0.01, median + 0.01)
                       if median else None, source=source, instances=1)


def test_measure_table_has_one_row_per_kind_of_alike_classes():
    m = MeasureReport("cpu", 1, 3, strategy="regions")
    m.groups = [_group(["conv-hardswish"], True, 0.5 + i / 100) for i in range(24)]
    m.groups += [_group(["conv-relu"], False, 1.01), _group(["conv-relu"], False, 0.99)]
    m.groups += [_group(["conv-relu"], True, 0.8)]
    console = Console(width=200, record=True, highlight=False)
    print_measure(m, console)
    rows = [ln for ln in console.export_text().splitlines() if ln.startswith("│ ")]
    assert len(rows) == 3, rows
    hardswish = next(r for r in rows if "conv-hardswish" in r)
    assert "timed (24 classes)" in hardswish and "0.500..0.730" in hardswish and "│       24 │" in hardswish
    assert "+27.0..+50.0%" in hardswish
    assert sum("timed (2 classes)" in r for r in rows) == 1
    assert any("0.800 [0.790, 0.810]" in r and "kept" in r for r in rows)
