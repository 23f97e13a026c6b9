"""The dependency floors pyproject.toml declares are the versions CI tests: .ci/oldest.txt pins each runtime
dependency at its floor, and .ci/run's oldest venv uses the lowest Python `requires-python` allows."""

from __future__ import annotations

import os
import re
import tomllib

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _release(v: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in v.split("."))
    return parts + (0,) * (3 - len(parts))


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _pins() -> dict[str, str]:
    text = open(os.path.join(ROOT, ".ci", "oldest.txt"), encoding="utf-8").read()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([\d.]+)\s*$", text, re.M))


def test_every_runtime_dependency_has_a_floor_and_ci_pins_exactly_it():
    floors = {}
    for spec in _project()["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([\d.]+)(,<[\d.]+)?", spec.replace(" ", ""))
        assert m, f"pyproject.toml: {spec!r} has no '>=' floor (or more than a known-break '<' cap)"
        floors[m.group(1).lower()] = m.group(2)
    pins = {k.lower(): v for k, v in _pins().items()}
    assert set(pins) == set(floors), "pyproject.toml's dependencies and .ci/oldest.txt name different packages"
    for name, floor in floors.items():
        assert _release(pins[name]) == _release(floor), f"{name}: floor {floor}, .ci/oldest.txt pins {pins[name]}"


def test_ci_runs_the_oldest_python_requires_python_allows():
    m = re.fullmatch(r">=3\.(\d+)", _project()["requires-python"])
    assert m
    run = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert f"python3.{m.group(1)} -m venv" in run and "-c .ci/oldest.txt" in run


def test_the_oldest_subset_lists_test_files_that_exist():
    text = open(os.path.join(ROOT, ".ci", "oldest-tests.txt"), encoding="utf-8").read()
    files = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    files = [f for f in files if f]
    assert files
    for f in files:
        assert os.path.isfile(os.path.join(ROOT, "tests", f)), f


def test_readme_states_the_floors_pyproject_declares():
    project = _project()
    floors = dict(re.findall(r"^([a-z]+)>=([\d.]+)", "\n".join(project["dependencies"]), re.M))
    readme = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    python = project["requires-python"].removeprefix(">=")
    assert f"Python {python}+, onnx {floors['onnx']}+ and onnxruntime {floors['onnxruntime']}+" in readme
