"""Shared helpers: tiny models built with onnx.helper, onnxruntime runs, the CLI in-process."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, Phase, settings
from onnx import TensorProto, numpy_helper

from onnxfuse.measure.timing import Timings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
SHARED_MODELS = os.path.join(os.path.dirname(ROOT), "shared", "models")
ort.set_default_logger_severity(3)
# Measured decisions are cached across runs (decision_cache.py): the suite never uses the user's cache, and each
# test gets a fresh, empty one (the fixture below), so no state is carried between runs or between tests (the
# order tests run in, which xdist varies, cannot change what one sees).
os.environ["ONNXFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="onnxfuse-test-cache-")
# Rules with a condition on the CPU's layout (conv-add: not where onnxruntime runs convolutions in NCHWc) rewrite
# the same on every machine the suite runs on: it decides as for an x86 CPU with AVX2 or AVX-512 (the probe of
# this machine's onnxruntime is tested on its own, tests/rules/test_conv.py).
os.environ["ONNXFUSE_CPU_NCHWC"] = "1"


@pytest.fixture(autouse=True)
def _fresh_decision_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("decision-cache")))
    # output width as a pipe has it (pytest-xdist's workers inherit COLUMNS=80 from the controller): a test of
    # the terminal's width sets COLUMNS itself
    monkeypatch.delenv("COLUMNS", raising=False)

# Property tests are deterministic in the suite: the same examples every run (derandomized), no example
# database carried between runs, and no shrinking (a failure is reproducible as it is). Fresh seeds belong in
# benchmarks/fuzz_long.py. ONNXFUSE_FUZZ_EXAMPLES sets how many examples (default 30).
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    max_examples=int(os.environ.get("ONNXFUSE_FUZZ_EXAMPLES", "30")),
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
settings.load_profile("ci")


def make_model(nodes, inputs, outputs, inits=(), opset=17, name="g") -> onnx.ModelProto:
    """inputs/outputs: (name, shape) for float32, or (name, shape, elem_type)."""
    def vi(spec):
        n, shape, *t = spec
        return oh.make_tensor_value_info(n, t[0] if t else TensorProto.FLOAT, shape)

    graph = oh.make_graph(nodes, name, [vi(i) for i in inputs], [vi(o) for o in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    ops = [oh.make_opsetid("", opset)]
    return oh.make_model(graph, opset_imports=ops, ir_version=8)


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def ort_run(model, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def op_types(model) -> list[str]:
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    return [(n.domain + "." if n.domain else "") + n.op_type for n in m.graph.node]


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr). `optimize` runs with --no-measure unless
    measure=True; `optimize`, `bench`, `explain` and `profile` print their tables (--details) unless details=False (the first screen's
    own tests)."""
    from onnxfuse.cli import main

    def run(*args: str, measure: bool = False, details: bool = True) -> tuple[int, str, str]:
        argv = [str(a) for a in args]
        if argv and argv[0] == "optimize" and not measure:
            argv.append("--no-measure")  # exact-rewrite tests must not depend on timing
        if argv and argv[0] in ("optimize", "bench", "explain", "profile") and details and "--details" not in argv:
            argv.append("--details")
        code = main(argv)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def stepping_clock(step=0.4):
    """A clock that advances `step` seconds per reading (for time.perf_counter): a budget of 4 s runs out
    after a few steps."""
    t = [0.0]

    def now():
        t[0] += step
        return t[0]

    return now


def fake_interleaved(region=0.8, whole=0.9):
    """A stand-in for measured selection's `interleave` (select/region_run.py): a region's fused version ("f") takes
    `region` of its original's time, and in a whole-model comparison (the confirmation, a group decided on the
    model) the candidate ("c", "c2") takes `whole` of its base's; the sessions are still made for real. `calls`
    lists the sessions of each call."""
    def fake(sessions, profiles, *, estimator, **_kw):
        fake.calls.append(sorted(sessions))
        rng = np.random.default_rng(0)
        base = 1e-3 * (1 + 0.001 * rng.standard_normal(30))
        out = {k: list(base * (region if k == "f" else whole if k in ("c", "c2") else 1.0)) for k in sessions}
        return Timings.of(out, estimator, len(profiles))
    fake.calls = []
    return fake


def one_generation(fake):
    """A stand-in for in_generations (measure/timing.py) that times through `fake` (interleave's signature) once,
    on the first generation's sessions: a fake's timings do not depend on the order sessions were made in."""
    return lambda open_sessions, profiles, **kw: fake(open_sessions(False), profiles, **kw)


def fake_timing(monkeypatch, fake) -> None:
    """Measured selection times through `fake`: region timings, and whole-model comparisons (one_generation)."""
    from onnxfuse.select import region_run

    monkeypatch.setattr(region_run, "interleave", fake)
    monkeypatch.setattr(region_run, "in_generations", one_generation(fake))


@pytest.fixture
def fake_timer(monkeypatch):
    """Measured selection on fake timings and a fake clock: what it keeps no longer depends on how busy the
    machine is. `fake_timer(region, whole)` installs fake_interleaved(region, whole) and makes time.perf_counter
    a clock that advances 0.1 ms per reading (and time.thread_time with it), so that budgets, deadlines and the costs the budget plans with (a
    session, a run, a rebuild) are the same every run. Returns the fake (its `calls`)."""

    def install(region=0.8, whole=0.9):
        fake = fake_interleaved(region, whole)
        fake_timing(monkeypatch, fake)
        fake_clocks(monkeypatch, stepping_clock(1e-4))
        return fake

    return install


def fake_clocks(monkeypatch, clock) -> None:
    """Wall time and thread CPU time both read `clock` (the budget clock reads both: measure/budget.py)."""
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "thread_time", clock)
