"""What optimize writes and says: an existing folder as the output of one model, batch lines that call only
contrib ops fused, and `cache show` entries that name the model, rules, threads and date, and agree with the
report on the whole-model confirmation."""

from __future__ import annotations

import json
import os

from conftest import MODELS

from onnxfuse.cli.optimize import _batch_line

CNN = os.path.join(MODELS, "cnn_small.onnx")


def test_an_existing_folder_as_the_output_of_one_model(cli, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, stdout, stderr = cli("optimize", CNN, out_dir, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["output"] == str(out_dir / "cnn_small.onnx")
    assert os.listdir(out_dir) == ["cnn_small.onnx"]
    import onnxfuse  # the API does the same

    r = onnxfuse.optimize(CNN, tmp_path, onnxfuse.OptimizeOptions(measure=False))
    assert r.output == str(tmp_path / "cnn_small.onnx") and os.path.isfile(r.output)


def test_batch_line_lists_contrib_ops_as_fused_and_other_new_ops_as_added():
    d = {"input": "a.onnx", "output": "o/a.onnx", "nodes_before": 30, "nodes_after": 20, "seconds": 1.0,
         "ops_before": {"MatMul": 4, "Add": 6}, "ops_after": {"com.microsoft.Attention": 1, "Concat": 1, "Add": 2},
         "validation": {"status": "passed"}, "measure": None, "timings_s": {}}
    line = _batch_line(d)
    assert "fused ops Attention x1" in line and "ops added Concat x1" in line
    assert "Concat" not in line.split("ops added")[0]


def test_cache_show_names_model_rules_threads_and_agrees_with_the_report(cli, tmp_path, fake_timer):
    fake_timer()  # on a busy machine the plan could measure nothing, and the cache would hold no selection
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--json", "--measure-budget", "3",
                               measure=True)
    assert code == 0, stderr
    confirmed = json.loads(stdout)["measure"]["confirmed"]
    code, stdout, _ = cli("cache", "show")
    assert code == 0
    lines = [line.strip() for line in stdout.splitlines()[1:]]
    assert lines and all("cnn_small.onnx  1 thread(s)  rules " in line for line in lines), lines
    assert all(line[:4].isdigit() and line[10] == "T" for line in lines)  # the date first
    selection = [line for line in lines if " selection: " in line]
    assert len(selection) == 1 and f"confirmation {confirmed}" in selection[0]
    if confirmed == "timed":
        assert not any("not reached" in line for line in lines if "whole-model confirmation" in line
                       or "selection" in line), lines
    assert any(" region " in line and "rules conv-" in line for line in lines)
