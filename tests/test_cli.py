"""The command line: what a user sees, including one-line errors with non-zero exit codes."""

import json
import os
import subprocess
import sys

import onnx
import onnx.helper as oh
from conftest import MODELS

CNN = os.path.join(MODELS, "cnn_small.onnx")


def test_optimize_prints_summary(cli, tmp_path):
    out = tmp_path / "o.onnx"
    code, stdout, stderr = cli("optimize", CNN, out, details=False)
    assert code == 0, stderr
    assert stdout.splitlines()[0] == f"wrote {out}"
    assert "nodes 36 -> 16; kept 14 rewrites: conv-bn-fold x3" in stdout
    assert "not measured (--no-measure): every validated rewrite kept; validated" in stdout
    assert out.exists()
    code, stdout, stderr = cli("optimize", CNN, out, "--details")
    assert "nodes 36 -> 16" in stdout and "validation: passed" in stdout
    assert "logits" in stdout  # the per-output validation table


def test_optimize_json(cli, tmp_path):
    code, stdout, _ = cli("optimize", CNN, tmp_path / "o.onnx", "--json")
    assert code == 0
    data = json.loads(stdout)
    assert data["schema"] == "onnxfuse.optimize/1"
    assert data["fired"]["conv-bn-fold"] == 3
    assert data["validation"]["status"] == "passed"
    assert data["validation"]["outputs"][0]["name"] == "logits"
    assert data["nodes_before"] == 36 and data["nodes_after"] == 16


def test_dry_run_writes_nothing(cli, tmp_path):
    out = tmp_path / "o.onnx"
    code, stdout, _ = cli("optimize", CNN, out, "--dry-run")
    assert code == 0 and not out.exists() and "dry run" in stdout


def _one_line_error(code, stderr, fragment, expected_code=1):
    assert code == expected_code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in stderr


def test_refuses_to_overwrite_input(cli, tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(open(CNN, "rb").read())
    code, _, stderr = cli("optimize", src, src)
    _one_line_error(code, stderr, "refusing to overwrite")
    assert src.read_bytes() == open(CNN, "rb").read()
    code, _, stderr = cli("optimize", src, src, "--force")
    assert code == 0, stderr


def test_bad_flag_one_line(cli, tmp_path):
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--targett", "cpu")
    _one_line_error(code, stderr, "No such option: --targett", expected_code=2)
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--target", "tpu")
    _one_line_error(code, stderr, "--target tpu: expected one of the registered targets: cpu, cuda, openvino")
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--only", "no-such-rule")
    _one_line_error(code, stderr, "--only no-such-rule: no rule with that id")


def test_bad_pattern_file_points_at_line(cli, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rules:\n- id: x\n  match:\n    Y: Relu(Q)\n  rewrite:\n    Y: Sigmod(Q)\n")
    out = tmp_path / "o.onnx"
    code, _, stderr = cli("optimize", CNN, out, "--patterns", p)
    _one_line_error(code, stderr, f"{p}:6:8: error: unknown operator 'Sigmod'")
    assert not out.exists()


def test_bad_shape_flag(cli, tmp_path):
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--shape", "nosuchinput:1x3x32x32")
    _one_line_error(code, stderr, "nosuchinput")
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--shape", "x:1x3x32")
    _one_line_error(code, stderr, "x")


def test_shape_flag_used(cli, tmp_path):
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--shape", "x:3x3x32x32")
    assert code == 0, stderr
    assert "3x10" in stdout  # the validated output shape follows the given batch


def test_patterns_list_show_check_schema(cli, tmp_path):
    code, stdout, _ = cli("patterns", "list")
    assert code == 0 and "erf-gelu" in stdout and "conv-bn-fold" in stdout
    code, stdout, _ = cli("patterns", "show", "erf-gelu")
    assert code == 0 and "com.microsoft.Gelu(X)" in stdout
    code, stdout, _ = cli("patterns", "schema")
    schema = json.loads(stdout)
    assert "match" in schema["definitions"]["rule"]["properties"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n- id: x\n  match:\n    Y: Relux(Q)\n  rewrite:\n    Y: Relu(Q)\n")
    code, _, stderr = cli("patterns", "check", bad)
    assert code == 1 and f"{bad}:4:8: error: unknown operator 'Relux'" in stderr


def test_patterns_test_command(cli):
    code, stdout, _ = cli("patterns", "test", "--rule", "erf-gelu")
    assert code == 0 and "ok erf-gelu" in stdout


def _erf_gelu_model(tmp_path, sqrt2: float, probe: bool) -> str:
    """x * 0.5 * (1 + erf(x / sqrt2)); with `probe`, the Erf output is also a graph output's source."""
    import numpy as np
    from conftest import make_model, save

    nodes = [
        oh.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
        oh.make_node("Erf", ["d"], ["e"], name="erf"),
        oh.make_node("Add", ["e", "one"], ["p"], name="add"),
        oh.make_node("Mul", ["x", "half"], ["xh"], name="mul_half"),
        oh.make_node("Mul", ["xh", "p"], ["y"], name="gelu_out"),
    ] + ([oh.make_node("Identity", ["e"], ["probe"], name="probe")] if probe else [])
    outputs = [("y", [2, 8])] + ([("probe", [2, 8])] if probe else [])
    consts = {"sqrt2": np.array(sqrt2, "float32"), "one": np.array(1.0, "float32"), "half": np.array(0.5, "float32")}
    return save(make_model(nodes, [("x", [2, 8])], outputs, consts), tmp_path / "g.onnx")


def test_explain_names_the_blocking_consumer(cli, tmp_path):
    """An erf-Gelu whose interior Erf output is also read elsewhere cannot fuse: explain says where."""
    code, stdout, _ = cli("explain", _erf_gelu_model(tmp_path, 1.4142135, probe=True), "--rule", "erf-gelu")
    assert code == 0
    assert "Identity 'probe'" in stdout and "consumer(s) outside the match" in stdout


def test_explain_names_the_wrong_constant(cli, tmp_path):
    code, stdout, _ = cli("explain", _erf_gelu_model(tmp_path, 1.3, probe=False), "--json")
    data = json.loads(stdout)
    reasons = [m["reason"] for m in data["near_misses"] if m["rule"] == "erf-gelu"]
    # the region is run against Gelu: the reason is how far it is, on the candidate that ends the chain only
    assert reasons == ["computes 'gelu': the ops from 'x' compute something else (off by 0.0204, tolerance 1e-05)"]


def test_console_script_no_traceback(tmp_path):
    """The installed entry point, as a user runs it."""
    r = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(tmp_path / "x.onnx"),
                        str(tmp_path / "y.onnx")], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_written_model_is_valid(cli, tmp_path):
    out = tmp_path / "o.onnx"
    assert cli("optimize", CNN, out)[0] == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_optimize_measures_by_default(cli, tmp_path):
    """The real timer runs (no timing assertions here: benchmarks measure speed); the report shows it. The budget
    is far above what this 1 ms model needs (timing stops at its minimum runs well before), so that a busy machine
    still measures: with 3 s, the plan's estimate of capture alone could pass 60% of it ('not measured')."""
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--json", "--measure-budget", "60",
                               measure=True)
    assert code == 0, stderr
    m = json.loads(stdout)["measure"]
    assert m["provider"] == "cpu" and m["threads"] == 1 and m["rounds"] >= 1
    assert {g["group"] for g in m["groups"]} >= {"com.microsoft.FusedConv"}
    assert m["strategy"] == "regions" and m["budget_s"] == 60 and m["note"] == ""
    assert set(m["phases"]) >= {"regions", "capture", "time regions"}
    assert m["undecided"] == sum(g["source"] == "budget" for g in m["groups"])
    assert m["confirmed"] == "timed" and (m["final_verdict"] in ("faster", "slower", "no significant change") or m["final_verdict"].startswith("within the noise floor")) or \
        m["confirmed"].startswith("skipped") and m["final_verdict"] is None or m["confirmed"].startswith("not needed")


def test_a_tiny_budget_times_nothing_and_says_what_decided_instead(cli, tmp_path):
    """A budget limits what is timed, never what is kept: each unit says it was not timed and which prior kept or
    left it out."""
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--measure-budget", "0.0001", "--json",
                               measure=True)
    assert code == 0, stderr
    m = json.loads(stdout)["measure"]
    assert "not measured" not in m["note"] and m["undecided"] >= 1
    timeable = [g for g in m["groups"] if g["source"] not in ("exact", "untimed")]
    assert timeable and all(g["source"] == "budget" and "not timed within the budget; " in g["why"] for g in timeable)


def test_explain_reports_misaligned_channels(cli):
    code, stdout, _ = cli("explain", CNN, "--json")
    data = json.loads(stdout)
    width = data["vector_width"]
    assert width in (8, 16)
    dims = {(m["node"], m["dim"]): m for m in data["misaligned"]}
    first = dims[("/layer1/relu/Relu/conv-relu", "in channels (per group)")]  # RGB input: 3 channels
    assert first["value"] == 3 and first["padded"] == width and abs(first["waste"] - (width - 3) / width) < 1e-9
    assert all(m["value"] % width for m in data["misaligned"])


def test_patterns_list_for_a_target_says_which_rules_are_used_and_why_not(cli):
    code, stdout, stderr = cli("patterns", "list", "--target", "cuda")
    assert code == 0, stderr
    assert "rules on cuda (kernels: " in stdout
    rows = {line.split("│")[1].strip(): line for line in stdout.splitlines() if line.startswith("│ ")
            and line.split("│")[1].strip()}
    used = {rule: row.split("│")[2].strip() for rule, row in rows.items()}
    assert used["conv-relu"] == "yes" and used["conv-nhwc"] == "yes"
    assert used["gemm-activation"] == "no" and used["conv-activation"] == "no"
    assert "no CUDA kernel for" in stdout and "declared for cpu only" in rows["gemm-activation"]
    code, stdout, _ = cli("patterns", "list", "-t", "cpu")
    assert code == 0
    used = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in stdout.splitlines()
            if line.startswith("│ ") and line.split("│")[1].strip()}
    assert used["conv-nhwc"] == "no" and used["erf-gelu"] == "partly"  # CPU Gelu: float32, not float16
    assert "the CPU kernel for" in stdout and "float16" in stdout  # the why column wraps
    code, _, stderr = cli("patterns", "list", "--target", "tpu")
    _one_line_error(code, stderr, "--target tpu: expected one of the registered targets: cpu, cuda, openvino")
