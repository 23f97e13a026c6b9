"""The house around the package (docs/architecture.md, docs/benchmarks.md): corpora/ builds test corpora,
benchmarks/ answers questions with printed numbers. Every module of both says how it is run and is listed in
docs/benchmarks.md; none edits sys.path (they import each other as packages, run from the repository root);
no benchmark times onnxruntime runs in a loop of its own (they go through onnxfuse.measure)."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "benchmarks.md").read_text()
MODULES = sorted(p for folder in ("benchmarks", "corpora") for p in (ROOT / folder).glob("*.py")
                 if p.name != "__init__.py")
# the one benchmark that runs a test's own property with more examples: it imports that test from tests/
READS_A_TEST = {"fuzz_long.py"}


def test_the_house_has_both_folders():
    assert any(p.parent.name == "benchmarks" for p in MODULES) and any(p.parent.name == "corpora" for p in MODULES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_module_says_how_it_runs_and_is_listed(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    module = f"{path.parent.name}.{path.stem}"
    assert doc, f"{module} has no docstring"
    assert f"python -m {module}" in doc or path.parent.name == "corpora" and "Imported by" in doc, \
        f"{module}: its docstring does not give its usage (python -m {module} ...) or who imports it"
    # listed in docs/benchmarks.md's tables, by its name there
    assert re.search(rf"`{path.stem}`", DOCS), f"{module} is not in docs/benchmarks.md's tables"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_module_edits_sys_path(path):
    text = path.read_text()
    if path.name in READS_A_TEST:
        assert text.count("sys.path.insert") == 1
        return
    assert "sys.path.insert" not in text and "sys.path.append" not in text, f"{path.name} edits sys.path"


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent.name == "benchmarks"], ids=lambda p: p.name)
def test_no_benchmark_times_runs_in_a_loop_of_its_own(path):
    """A `for`/`while` loop whose body both reads a clock and runs a session is a timing loop of its own."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.For, ast.While)):
            body = ast.unparse(node)
            clock = re.search(r"perf_counter|thread_time|time\.time\(\)|monotonic", body)
            runs = re.search(r"\.run\(\s*None|\.run\(\s*\[", body)
            assert not (clock and runs), f"{path.name}:{node.lineno}: a loop that times runs itself"


OPTIONAL = ("torch", "tensorflow", "tf2onnx", "transformers", "optimum", "ray", "onnxslim", "paddle", "keras")
# imports every module in one fresh process (what they import, torch among them, stays out of the suite's own);
# prints one line per module: ok, skipped (an optional package missing), or the error
IMPORT_ALL = f"""
import importlib, sys
OPTIONAL = {OPTIONAL!r}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print(name, "ok")
    except ImportError as e:
        top = (e.name or "").split(".")[0]
        print(name, "skipped" if top in OPTIONAL else f"error: {{e!r}}")
    except Exception as e:
        print(name, f"error: {{e!r}}")
"""


def test_each_module_imports():
    """Importing runs nothing (the work is under `if __name__ == "__main__"`) and every name a module imports
    from the house resolves; a module that needs an optional third-party package is skipped where it is not
    installed."""
    import subprocess
    import sys

    names = [f"{p.parent.name}.{p.stem}" for p in MODULES]
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL, *names], cwd=ROOT, capture_output=True, text=True,
                         timeout=300).stdout.splitlines()
    assert len(out) == len(names), out
    assert [line for line in out if " error: " in line] == []
