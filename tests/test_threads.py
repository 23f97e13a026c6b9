"""The thread count is part of every measured decision: reported in text, JSON and HTML, part of the decision
cache key, and `--threads auto` measures at what onnxruntime uses by default (one thread per physical core)."""

from __future__ import annotations

import json
import os

from conftest import MODELS

from onnxfuse.validate.runtime import physical_cores, resolve_threads

CNN = os.path.join(MODELS, "cnn_small.onnx")


def _topology_cores() -> int:
    """Physical cores counted independently: distinct (package, core) of the CPUs this process may use."""
    ids = set()
    for c in os.sched_getaffinity(0):
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        ids.add((open(base + "physical_package_id").read(), open(base + "core_id").read()))
    return len(ids)


def test_auto_is_onnxruntimes_default_thread_count():
    assert physical_cores() == _topology_cores() >= 1
    assert resolve_threads("auto") == physical_cores() and resolve_threads("3") == 3 and resolve_threads(2) == 2


def test_threads_auto_is_measured_reported_and_keyed(cli, tmp_path, fake_timer):
    fake_timer()  # decisions are cached for both thread counts whatever the machine's load
    n = physical_cores()
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "a.onnx", "--threads", "auto", "--measure-budget", "2",
                               "--json", measure=True)
    assert code == 0, stderr
    assert json.loads(stdout)["measure"]["threads"] == n
    code, stdout, stderr = cli("optimize", CNN, tmp_path / "b.onnx", "--threads", "1", "--measure-budget", "2",
                               "--details", measure=True)
    assert code == 0, stderr
    text = " ".join(stdout.split())
    assert "measured on cpu, 1 thread(s)" in text
    hint = f"decided at 1 thread(s); onnxruntime's default here uses {n}"
    assert (hint in text) is (n != 1)
    code, stdout, _ = cli("cache", "show")
    assert f"cnn_small.onnx  {n} thread(s)" in stdout and "cnn_small.onnx  1 thread(s)" in stdout


def test_the_thread_count_is_part_of_the_decision_cache_key(cli, tmp_path, fake_timer):
    """Fake timings and clock: real ones could leave a class undecided ('budget', not 'cached', on the rerun)."""
    fake_timer()

    def groups(threads: str) -> set[str]:
        code, stdout, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--threads", threads,
                                   "--measure-budget", "2", "--json", measure=True)
        assert code == 0, stderr
        return {g["source"] for g in json.loads(stdout)["measure"]["groups"] if g["source"] != "exact"}

    assert "cached" not in groups("1")
    assert groups("1") <= {"cached"}  # the same run again: every timed decision comes from the cache
    assert "cached" not in groups("2")  # another thread count: nothing reused


def test_bad_thread_counts_are_one_line_errors(cli, tmp_path):
    for value, what in (("0", "expected a thread count >= 1, or auto"), ("many", "expected a thread count or auto")):
        code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--threads", value)
        assert code == 1 and len(stderr.strip().splitlines()) == 1 and f"--threads {value}: {what}" in stderr


def test_html_names_the_thread_count_of_the_decisions(tmp_path, fake_timer):
    fake_timer()  # something is measured whatever the machine's load
    from onnxfuse import OptimizeOptions, optimize
    from onnxfuse.inspect.html_report import render

    r = optimize(CNN, tmp_path / "o.onnx", OptimizeOptions(measure_threads=2, measure_budget_s=2))
    assert r.measure is not None and r.measure.threads == 2 and r.measure.groups
    page = render("t", result=r)
    assert "timed on cpu at 2 thread(s): the decisions hold for that thread count" in page
