"""The first screen is the answer: README's first command, run in an 80-column pseudo-terminal, prints a few
lines, the verdict among the first three, none wrapping; `--details` prints the tables; the screens README and
docs/commands.md show are the ones the commands print."""

import fcntl
import json
import os
import re
import select
import shlex
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from onnxfuse.inspect.summary import fit, fit_list

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = ("faster:", "slower:", "no significant change:", "within noise", "no faster selection",
            "not measured", "not timed", "nothing rewritten")


def _pty_run(argv: list[str], cols: int, env: dict[str, str]) -> str:
    """What `argv` writes to a terminal `cols` wide (stdout and stderr, as a user sees them)."""
    import pty

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, cwd=ROOT)
    os.close(slave)
    raw = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            raw += chunk
        elif p.poll() is not None:
            break
    assert p.wait(timeout=120) == 0, raw.decode(errors="replace")
    os.close(master)
    return raw.decode(errors="replace")


def screen(raw: str, cols: int) -> tuple[list[str], list[str]]:
    """(the lines left on a `cols`-wide screen, the lines that wrapped): a small terminal that knows what the
    progress line uses (carriage return, erase line, cursor up) and ignores colours."""
    lines, row, col, wrapped = [""], 0, 0, []
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]", raw):
        if token == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            col = 0
        elif token.endswith("K"):  # erase the line
            lines[row] = ""
        elif token.endswith("A"):  # cursor up
            row = max(0, row - int(token[2:-1] or 1))
        elif not token.startswith("\x1b"):
            if col >= cols:
                wrapped.append(lines[row])
                row, col = row + 1, 0
                if row == len(lines):
                    lines.append("")
            lines[row] = lines[row][:col].ljust(col) + token + lines[row][col + 1:]
            col += 1
    return [line.rstrip() for line in lines if line.strip()], wrapped


def readme_first_command() -> list[str]:
    """README's first command, after its `pip install ... &&`."""
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return shlex.split(block.splitlines()[0].split("&&", 1)[1])


def test_readme_first_command_fits_an_80_column_terminal_the_verdict_first(tmp_path):
    argv = readme_first_command()
    assert argv[:2] == ["onnxfuse", "optimize"]
    argv[-1] = str(tmp_path / "out.onnx")
    env = dict(os.environ, ONNXFUSE_CACHE_DIR=str(tmp_path / "cache"), TERM="xterm-256color")
    env.pop("COLUMNS", None)
    lines, wrapped = screen(_pty_run([sys.executable, "-m", "onnxfuse.cli", *argv[1:]], 80, env), 80)
    assert not wrapped
    assert len(lines) <= 15, lines
    assert any(line.startswith(VERDICTS) for line in lines[:3]), lines
    assert lines[0] == f"wrote {tmp_path / 'out.onnx'}" or len(str(tmp_path)) > 70


OPTIONAL = ("left out", "rolled back", "repaired on load")  # lines a run prints or not, by what it found


def _shapes(lines: list[str]) -> list[str]:
    """The screen's lines as kinds, without their numbers, names and lists, and without the lines a run on
    another CPU may leave out: what README's copy must share with a run."""
    return ["verdict" if line.startswith(VERDICTS) else line.split()[0] if line.startswith(("wrote", "took")) else
            re.sub(r"[\d.]+", "N", line.split(":")[0] if ":" in line else line.split()[0])
            for line in lines if not line.startswith(OPTIONAL)]


@pytest.mark.parametrize("doc", ["README.md", "docs/commands.md"])
def test_the_screen_the_docs_show_is_the_screen_optimize_prints(cli, tmp_path, doc):
    """The docs' copy of the first screen (the block after `$ onnxfuse optimize models/cnn_small.onnx`) has the
    lines a run prints, in order, each of its kind (the numbers and the rules kept depend on the CPU)."""
    text = (ROOT / doc).read_text()
    shown = text.split("$ onnxfuse optimize models/cnn_small.onnx", 1)[1].split("```", 1)[0].strip().splitlines()[1:]
    code, stdout, _ = cli("optimize", ROOT / "models" / "cnn_small.onnx", tmp_path / "out.onnx", measure=True,
                          details=False)
    assert code == 0
    printed = stdout.strip().splitlines()
    assert _shapes(shown) == _shapes(printed)
    assert all(len(s) <= 80 for s in shown)


def test_details_prints_the_tables(cli, tmp_path):
    code, stdout, _ = cli("optimize", ROOT / "models" / "cnn_small.onnx", tmp_path / "o.onnx", "--details")
    assert code == 0
    assert "rules fired (the rewrites kept in the output)" in stdout and "op counts that changed" in stdout
    assert "validation: passed" in stdout and "time: patterns" in stdout


def test_a_list_ends_with_how_many_more_and_a_line_is_cut_only_without_one():
    line = fit_list("kept 5 rewrites: ", ["conv-bn-fold x3", "conv-relu", "gelu", "layernorm", "attention"], 41)
    assert line == "kept 5 rewrites: conv-bn-fold x3, +4 more" and len(line) <= 41
    assert fit_list("kept: ", ["a", "b"], 40) == "kept: a, b"
    assert fit("x" * 50, 20) == "x" * 17 + "..."


def test_a_batch_prints_a_line_per_model_that_fits_the_terminal(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    models = [ROOT / "models" / "cnn_small.onnx", *sorted((ROOT / "models" / "styles").glob("cnn_*.onnx"))[:2]]
    code, stdout, _ = cli("optimize", *models, tmp_path / "out", details=False)
    assert code == 0
    lines = stdout.splitlines()
    assert len(lines) == len(models) + 1 and all(len(line) <= 80 for line in lines), lines
    assert any(line.startswith("cnn_small.onnx: not measured, nodes 36 -> 16, validated, ") for line in lines)
    assert lines[-1].startswith(f"{len(models)} model(s): {len(models)} written to ")


def test_bench_answers_first(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    cnn = ROOT / "models" / "cnn_small.onnx"
    code, stdout, _ = cli("bench", cnn, cnn, "--budget", "0.5", details=False)
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].startswith(VERDICTS[:4] + ("no significant change",)) and " B runs in " in lines[0], lines
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines)


def test_explain_answers_in_a_screen_with_where_and_why_of_the_closest_near_misses(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    model = ROOT / "models" / "transformers" / "bert_ts17.onnx"
    code, stdout, _ = cli("explain", model, details=False)
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].startswith("would fire: ") and lines[1].startswith("near misses: ")
    assert len(lines) <= 15 and all(len(line) <= 80 for line in lines), lines
    near = json.loads(cli("explain", model, "--json")[1])["near_misses"]
    shown = [m for m in near if not m.get("hidden")][0]
    assert lines[2].startswith(f"  {shown['rule']} (") and lines[3].startswith("    " + shown["reason"][:40])


def test_profile_answers_in_a_screen(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, stdout, _ = cli("profile", ROOT / "models" / "cnn_small.onnx", "--runs", "3", details=False)
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0] == "A models/cnn_small.onnx" or lines[0].startswith("A ")
    assert lines[1].startswith("  ") and " ms a run; GEMM-bound limit " in lines[1]
    assert lines[2].startswith("  most time: Conv ")
    assert len(lines) <= 15 and all(len(line) <= 80 for line in lines), lines


def test_a_model_with_nothing_to_rewrite_says_the_output_is_the_input(cli, tmp_path):
    """No rule fires: no timing to report (a ratio of the input against itself is noise, not a verdict)."""
    import onnx.helper as oh
    from onnx import TensorProto

    g = oh.make_graph([oh.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                      [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    path = tmp_path / "relu.onnx"
    onnx_model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    path.write_bytes(onnx_model.SerializeToString())
    code, stdout, _ = cli("optimize", path, tmp_path / "out.onnx", measure=True, details=False)
    assert code == 0
    assert stdout.splitlines()[1].startswith("nothing rewritten: the output is the input; ")
