"""The public API (onnxfuse/__init__.py): a ModelProto in, the optimized ModelProto out, the README example
runs as written, and the CLI's JSON is the result's to_json()."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import onnx
from conftest import MODELS, ort_run

import onnxfuse


def test_all_names_exist_and_are_documented():
    for name in onnxfuse.__all__:
        obj = getattr(onnxfuse, name)
        if callable(obj):
            assert obj.__doc__, f"onnxfuse.{name} has no docstring"


def test_optimize_takes_a_model_proto_and_returns_the_model(tmp_path):
    proto = onnx.load(os.path.join(MODELS, "cnn_small.onnx"))
    result = onnxfuse.optimize(proto, options=onnxfuse.OptimizeOptions(measure=False))
    assert result.input == "<ModelProto>" and result.output is None and result.written == []
    assert isinstance(result.model, onnx.ModelProto)
    assert "com.microsoft.FusedConv" in result.ops_after and result.validation == "passed"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(ort_run(result.model, feeds)[0], ort_run(proto, feeds)[0], rtol=1e-4, atol=1e-5)
    out = tmp_path / "o.onnx"
    written = onnxfuse.optimize(proto, out, onnxfuse.OptimizeOptions(measure=False))
    assert written.written == [str(out)] and onnx.load(str(out)).graph.node == written.model.graph.node


def test_errors_are_onnxfuse_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    try:
        onnxfuse.optimize(bad)
    except onnxfuse.OnnxfuseError as e:
        assert "\n" not in str(e)
    else:
        raise AssertionError("no error for a file that is not a model")


def test_readme_example_runs(tmp_path, monkeypatch):
    readme = open(os.path.join(os.path.dirname(MODELS), "README.md")).read()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    onnx.save(onnx.load(os.path.join(MODELS, "cnn_small.onnx")), "model.onnx")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert isinstance(scope["optimized"], onnx.ModelProto) and os.path.exists("model.opt.onnx")
    assert scope["result"].validation.startswith("passed")


def test_cli_json_is_the_results_to_json(cli, tmp_path):
    code, stdout, _ = cli("optimize", os.path.join(MODELS, "cnn_small.onnx"), tmp_path / "o.onnx", "--json")
    assert code == 0
    data = json.loads(stdout)
    again = onnxfuse.optimize(os.path.join(MODELS, "cnn_small.onnx"), None,
                              onnxfuse.OptimizeOptions(measure=False)).to_json()
    assert set(data) == set(again) and data["fired"] == again["fired"]


def test_every_package_folder_ships_in_the_wheel():
    """setup.py finds the packages (find_packages skips a folder without __init__.py, which the editable install
    would still import as a namespace package: the wheel would then lack it, as it once lacked onnxfuse/inputs)."""
    import os

    from setuptools import find_packages

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = set(find_packages(root, include=["onnxfuse", "onnxfuse.*"]))
    folders = {os.path.relpath(d, root).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(root, "onnxfuse"))
               if any(f.endswith(".py") for f in files)}
    assert folders - found == set()
