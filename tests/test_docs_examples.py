"""The example rule in docs/writing-patterns.md loads and passes its self-test, as the page says it does."""

from __future__ import annotations

import os
import re

import pytest

import onnxfuse

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "writing-patterns.md")


def test_complete_example_rule_checks_and_self_tests(tmp_path):
    text = open(DOC, encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "id: conv-channel-scale" in b]
    assert len(blocks) == 1
    for key in ("require:", "compute:", "example:", "c.pads"):
        assert key in blocks[0]
    path = tmp_path / "scale.yaml"
    path.write_text(blocks[0])
    rules = onnxfuse.load_rules([str(path)], builtin=False)
    assert [r.id for r in rules] == ["conv-channel-scale"]
    (report,) = list(onnxfuse.self_test(rules))
    assert report.ok, report.problems
    assert report.summary == "float32: 2 models fired once with equal outputs; 1 mutant did not fire"


DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")
PACKAGE = os.path.dirname(onnxfuse.__file__)


def _doc(name: str) -> str:
    return open(os.path.join(DOCS, name), encoding="utf-8").read()


def _leaf_commands():
    """(command words, its long options) for every command `onnxfuse --help` reaches."""
    import typer

    from onnxfuse.cli.app import app
    from onnxfuse.cli.commands import run  # noqa: F401  (registers every command)

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, {o for p in cmd.params for o in p.opts if o.startswith("--")} - {"--help"}

    return list(walk(typer.main.get_command(app), []))


def test_commands_synopsis_lists_every_option_of_each_command():
    """docs/commands.md's synopsis block names every option each command's --help lists, and no option that
    command does not have."""
    block = re.search(r"```\n(onnxfuse .*?)```", _doc("commands.md"), re.S).group(1)
    entries: list[str] = []
    for line in block.splitlines():
        line = line.split("#", 1)[0]
        if line.startswith("onnxfuse "):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line
    by_top: dict[str, set[str]] = {}
    for entry in entries:
        by_top.setdefault(entry.split()[1], set()).update(re.findall(r"--[a-z][\w-]*", entry))
    commands = _leaf_commands()
    for path, options in commands:
        assert path[0] in by_top, f"docs/commands.md has no synopsis of 'onnxfuse {path[0]}'"
        missing = options - by_top[path[0]]
        assert not missing, f"'onnxfuse {' '.join(path)}' options missing from docs/commands.md: {sorted(missing)}"
    for top, named in by_top.items():
        real = set().union(*(o for p, o in commands if p[0] == top)) | ({"--version"} if top == "version" else set())
        assert named <= real, f"docs/commands.md names options 'onnxfuse {top}' lacks: {sorted(named - real)}"


def test_architecture_names_every_module_and_only_modules_that_exist():
    """docs/architecture.md's module list names every module of the package (as `name.py` or `package/`), and
    every `x.py` it names exists."""
    text = _doc("architecture.md")
    named = set(re.findall(r"([\w/]+\.py)\b", text))
    files = {os.path.relpath(os.path.join(d, f), PACKAGE) for d, _, fs in os.walk(PACKAGE) for f in fs
             if f.endswith(".py") and "__pycache__" not in d}
    basenames = {os.path.basename(f) for f in files}
    for f in sorted(files):
        if os.path.basename(f) in ("__init__.py", "__main__.py"):
            continue
        assert os.path.basename(f) in {os.path.basename(n) for n in named}, f"docs/architecture.md does not name {f}"
    for n in sorted(named):
        assert os.path.basename(n) in basenames or n.startswith("tests/"), f"docs/architecture.md names {n}, which does not exist"


def test_architecture_lists_what_the_cli_imports_besides_the_public_api():
    """The `cli/` entry of docs/architecture.md names every onnxfuse module the CLI imports; whatever it imports
    from the package itself is public API."""
    import ast

    entry = re.search(r"- \*\*`cli/`\*\*(.*?)\n- \*\*", _doc("architecture.md"), re.S).group(1)
    named = set(re.findall(r"`([\w/]+)`", entry))
    for f in sorted(os.listdir(os.path.join(PACKAGE, "cli"))):
        if not f.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(PACKAGE, "cli", f), encoding="utf-8").read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level < 2:
                continue
            if node.module is None:  # from .. import X: the public API (or the version)
                for alias in node.names:
                    assert alias.name in onnxfuse.__all__ or alias.name in ("__version__", "signals"), (f, alias.name)
                    if alias.name == "signals":
                        assert "signals" in named
                continue
            module = node.module.replace(".", "/")
            assert module in named, f"cli/{f} imports onnxfuse.{node.module}, which docs/architecture.md does not list"


CNN = os.path.join(os.path.dirname(__file__), "..", "models", "cnn_small.onnx")


@pytest.mark.parametrize("args", [
    ("--fast",), ("--atoll",), ("--threads", "0"), ("--jobs", "0"), ("--rtol", "-1"), ("--measure-budget", "0"),
    ("--target", "tpu"), ("--skip", "nope"), ("--inputs", "none.npz"),
], ids=lambda a: " ".join(a))
def test_errors_md_quotes_the_message_the_cli_prints(cli, tmp_path, monkeypatch, args):
    """Each of these lines of docs/errors.md is what the command prints (whole, or, for a hint, the part the
    page quotes), with the exit code the page gives."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("optimize", CNN, "o.onnx", *args)
    (line,) = err.strip().splitlines()
    doc = _doc("errors.md")
    if args == ("--atoll",):
        part = "No such option: --atoll (did you mean --atol or --rtol?)"
        assert part in line and f"`{part}`" in doc
    else:
        assert f"`{line}`" in doc, line
    row = next(r for r in doc.splitlines() if line.split(": error: ", 1)[1].split(" (")[0] in r)
    assert f"| {code} |" in row
    assert not os.path.exists(tmp_path / "o.onnx")


def test_json_md_units_of_measure_seconds_and_phases(tmp_path):
    """docs/json.md: `measure.seconds` and `measure.phases` are seconds, as `timings_s` is (the measuring phase
    holds them all, so in milliseconds they would exceed it a thousandfold)."""
    import json
    import subprocess
    import sys

    assert "seconds where it ends in `_s` and in `seconds` and `phases`" in " ".join(_doc("json.md").split())
    env = {**os.environ, "ONNXFUSE_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", CNN, str(tmp_path / "o.onnx"),
                        "--measure-budget", "2", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    m, whole = d["measure"], d["timings_s"]["measure"]
    assert 0 < m["seconds"] <= whole
    assert m["phases"] and all(0 <= v <= whole for v in m["phases"].values())


def test_architecture_rank_table_is_test_layers_stages():
    """The import-direction table of docs/architecture.md lists tests/test_layers.py's STAGES, in order."""
    from test_layers import STAGES

    rows = re.findall(r"^\| (?:base|\d+|top) \| (.*?) \|$", _doc("architecture.md"), re.M)
    table = [tuple(sorted(m.rstrip("/") for m in re.findall(r"`([\w/]+)`", row))) for row in rows]
    stages = [tuple(sorted("__init__" if m == "" else m for m in stage)) for stage in STAGES]
    assert table == stages
