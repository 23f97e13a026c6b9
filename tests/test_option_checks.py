"""Flag and option values are checked before anything runs, in one place (options.py): one line naming the one
option at fault; the CLI names the flag, the Python API the option, never a flag."""

from __future__ import annotations

import json
import os

import pytest
from conftest import MODELS

import onnxfuse
from onnxfuse import OnnxfuseError, OptimizeOptions

CNN = os.path.join(MODELS, "cnn_small.onnx")

BAD_FLAGS = [
    (["--rtol", "-1"], "onnxfuse: error: --rtol -1: must be a finite number >= 0"),
    (["--atol", "-0.5"], "onnxfuse: error: --atol -0.5: must be a finite number >= 0"),
    (["--atol", "nan"], "onnxfuse: error: --atol nan: must be a finite number >= 0"),
    (["--threads", "0"], "onnxfuse: error: --threads 0: expected a thread count >= 1, or auto (hint: auto: onnxruntime's default, one thread per physical core)"),
    (["--measure-budget", "0"], "onnxfuse: error: --measure-budget 0: must be a number of seconds > 0"),
    (["--measure-budget", "-3"], "onnxfuse: error: --measure-budget -3: must be a number of seconds > 0"),
    (["--jobs", "0"], "onnxfuse: error: --jobs 0: must be >= 1"),
    (["--target", "gpu"], "onnxfuse: error: --target gpu: expected one of the registered targets: cpu, cuda, openvino"),
]


@pytest.mark.parametrize("flags,line", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_optimize_flag_values_checked_up_front(cli, tmp_path, monkeypatch, flags, line):
    import onnxfuse.pipeline as P

    monkeypatch.setattr(P, "load_model", lambda *a, **k: pytest.fail("loaded a model with a bad flag value"))
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", *flags)
    assert code == 1 and stdout == ""
    assert stderr.strip() == line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("cmd,flags,line", [
    ("bench", ["--budget", "0"], "--budget 0: must be a number of seconds > 0"),
    ("bench", ["--runs", "0"], "--runs 0: must be >= 1"),
    ("bench", ["--threads", "0"], "--threads 0: expected a thread count >= 1, or auto (hint: auto: onnxruntime's default, one thread per physical core)"),
    ("bench", ["--level", "max"], "--level max: expected one of disable, basic, extended, all"),
    ("bench", ["--provider", "gpu"], "--provider gpu: expected one of the registered targets: cpu, cuda, openvino"),
    ("bench", ["--batch", "1,0"], "--batch 1,0: sizes must be >= 1"),
    ("profile", ["--threads", "0"], "--threads 0: expected a thread count >= 1, or auto (hint: auto: onnxruntime's default, one thread per physical core)"),
    ("profile", ["--runs", "0"], "--runs 0: must be >= 1"),
    ("explain", ["--target", "gpu"], "--target gpu: expected one of the registered targets: cpu, cuda, openvino"),
    ("inputs", ["--target", "gpu"], "--target gpu: expected one of the registered targets: cpu, cuda, openvino"),
])
def test_other_commands_check_values(cli, cmd, flags, line):
    code, _, stderr = cli(cmd, CNN, *flags)
    assert code == 1
    assert stderr.strip() == f"onnxfuse: error: {line}"


@pytest.mark.parametrize("kw,message", [
    (dict(target="gpu"), "target='gpu': expected one of the registered targets: cpu, cuda, openvino"),
    (dict(measure_threads=0), "measure_threads=0: must be >= 1"),
    (dict(measure_threads=2.5), "measure_threads=2.5: expected a whole number"),
    (dict(rtol=-1), "rtol=-1: must be a finite number >= 0"),
    (dict(measure_budget_s=0), "measure_budget_s=0: must be a number of seconds > 0"),
    (dict(shapes=3), "shapes=3: expected a list of strings, got int"),
])
def test_api_errors_name_the_option_not_a_flag(kw, message):
    with pytest.raises(OnnxfuseError) as e:
        onnxfuse.optimize(CNN, None, OptimizeOptions(**kw))
    assert str(e.value) == message
    assert "--" not in str(e.value)


def test_api_bench_profile_inputs_errors_name_options():
    with pytest.raises(OnnxfuseError, match=r"^budget_s=0: must be a number of seconds > 0$"):
        onnxfuse.bench([CNN], budget_s=0)
    with pytest.raises(OnnxfuseError, match=r"^threads=0: must be >= 1$"):
        onnxfuse.profile(CNN, threads=0)
    with pytest.raises(OnnxfuseError, match=r"^target='gpu': expected one of the registered targets: cpu, cuda, openvino$"):
        onnxfuse.find_inputs(CNN, target="gpu")


def test_a_str_for_a_list_is_one_item():
    """`shapes="batch=1"` is one spec (the batch really is 1), not five one-character specs."""
    opts = OptimizeOptions(shapes="batch=1", skip="silu", measure=False)
    result = onnxfuse.optimize(CNN, None, opts)
    assert opts.shapes == ["batch=1"] and opts.skip == ["silu"]
    assert result.inputs.shapes == {"x": [1, 3, 32, 32]}
    assert onnxfuse.find_inputs(CNN, "batch=3", probe=False).shapes == {"x": [3, 3, 32, 32]}


# ---- unknown input and dim names (typos) -------------------------------------------------------------------

UNKNOWN_DIM = "unknown dim 'batchh'; the model's dims are: batch"


@pytest.mark.parametrize("argv", [
    ["optimize", CNN, "OUT", "--shape", "batchh=4"],
    ["inputs", CNN, "--shape", "batchh=4"],
    ["inputs", CNN, "--shape", "batchh=4", "--no-probe"],
    ["bench", CNN, "--shape", "batchh=4", "--budget", "0.1"],
    ["profile", CNN, "--shape", "batchh=4", "--runs", "1"],
])
def test_unknown_dim_in_shape_is_an_error_everywhere(cli, tmp_path, argv):
    code, stdout, stderr = cli(*[str(tmp_path / "o.onnx") if a == "OUT" else a for a in argv])
    assert code == 1 and stdout == ""
    assert stderr.strip() == f"onnxfuse: error: --shape batchh=4: {UNKNOWN_DIM}"
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("cmd", ["optimize", "inputs", "bench"])
def test_unknown_dim_in_profile_is_an_error(cli, tmp_path, cmd):
    argv = [cmd, CNN] + ([str(tmp_path / "o.onnx")] if cmd == "optimize" else [])
    code, _, stderr = cli(*argv, "--profile", "p:batchh=4@2")
    assert code == 1
    assert stderr.strip() == f"onnxfuse: error: --profile p:batchh=4@2: {UNKNOWN_DIM}"


def test_unknown_dim_in_the_api_names_the_option():
    with pytest.raises(OnnxfuseError) as e:
        onnxfuse.optimize(CNN, None, OptimizeOptions(shapes=["batch=1", "batchh=4"], measure=False))
    assert str(e.value) == f"shapes='batchh=4': {UNKNOWN_DIM}"
    with pytest.raises(OnnxfuseError) as e:
        onnxfuse.optimize(CNN, None, OptimizeOptions(profiles=["p:batchh=4"], measure=False))
    assert str(e.value) == f"profiles='p:batchh=4': {UNKNOWN_DIM}"
    with pytest.raises(OnnxfuseError, match=UNKNOWN_DIM):
        onnxfuse.find_inputs(CNN, ["batchh=4"], probe=False)


def test_known_dims_still_apply(cli):
    """The check does not refuse real names: a named dim and an unnamed one (`input[axis]`) both take effect."""
    assert onnxfuse.find_inputs(CNN, ["batch=3"], probe=False).shapes == {"x": [3, 3, 32, 32]}
    code, stdout, stderr = cli("inputs", CNN, "--shape", "batch=5", "--json", "--no-probe")
    assert code == 0, stderr
    assert json.loads(stdout)["shapes"] == {"x": [5, 3, 32, 32]}


def test_batch_sweep_on_a_fixed_batch_names_the_option(cli, tmp_path):
    import onnx.helper as oh
    from conftest import make_model, save

    src = save(make_model([oh.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])]), tmp_path / "f.onnx")
    code, _, stderr = cli("bench", src, "--batch", "1,2", "--budget", "0.2")
    assert code == 1
    assert stderr.strip() == ("onnxfuse: error: --batch 1,2: a batch sweep needs a model whose inputs share a "
                              "dynamic first (batch) dimension")
    with pytest.raises(OnnxfuseError, match=r"^batches='1,2': a batch sweep needs"):
        onnxfuse.bench([src], batches=[1, 2], budget_s=0.2)


NCHWC_LINE = ("ONNXFUSE_CPU_NCHWC={!r}: expected 1 (the CPU that will run the model runs convolutions in onnxruntime's "
              "NCHWc layout: x86 with AVX2 or AVX-512) or 0 (it does not: ARM, x86 without AVX2); unset, this "
              "machine's onnxruntime is asked")


@pytest.mark.parametrize("value", ["banana", "yes", "2", "-1"])
def test_a_cpu_nchwc_setting_it_cannot_use_is_refused(cli, tmp_path, monkeypatch, value):
    """The environment is checked like a flag, before anything loads (it was silently ignored: this machine was
    probed instead)."""
    monkeypatch.setenv("ONNXFUSE_CPU_NCHWC", value)
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx")
    assert code == 1 and stdout == ""
    assert stderr.strip() == "onnxfuse: error: " + NCHWC_LINE.format(value)
    assert not (tmp_path / "o.onnx").exists()
    code, _, stderr = cli("explain", CNN)
    assert code == 1 and stderr.strip() == "onnxfuse: error: " + NCHWC_LINE.format(value)
    with pytest.raises(OnnxfuseError, match=r"^ONNXFUSE_CPU_NCHWC="):
        onnxfuse.optimize(CNN)


@pytest.mark.parametrize("value,expected", [("1", True), (" 0 ", False), ("", None)])
def test_the_accepted_cpu_nchwc_settings(monkeypatch, value, expected):
    from onnxfuse.targets import nchwc_setting

    monkeypatch.setenv("ONNXFUSE_CPU_NCHWC", value)
    assert nchwc_setting() is expected
