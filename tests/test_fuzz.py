"""Property-based tests: random graphs of the ops the built-in patterns touch (and near misses of them).
Invariants: the output is a valid model, loads in onnxruntime, gives the same outputs, no rewrite had to be
rolled back (a rule never fires where its semantics do not hold), and a second optimize changes nothing.
Bounded here (CI); benchmarks/fuzz_long.py runs many more examples."""

import os

import numpy as np
import onnx
from conftest import ort_run
from fuzz_graphs import random_model
from hypothesis import HealthCheck, given, settings

from onnxfuse.api import OptimizeOptions, optimize

EXAMPLES = int(os.environ.get("ONNXFUSE_FUZZ_EXAMPLES", "30"))


def check_invariants(model: onnx.ModelProto, feeds: dict, tmp: str) -> dict:
    src, out, again = (os.path.join(tmp, n) for n in ("in.onnx", "out.onnx", "again.onnx"))
    onnx.save(model, src)
    r = optimize(src, out, OptimizeOptions(measure=False, inputs_npz=None))
    assert r.rolled_back == [], [(rb.rule, rb.reason) for rb in r.rolled_back]
    got = onnx.load(out)
    onnx.checker.check_model(got, full_check=True)
    for a, b in zip(ort_run(model, feeds), ort_run(got, feeds), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    r2 = optimize(out, again, OptimizeOptions(measure=False))
    assert r2.applications == [], [a.rule for a in r2.applications]
    return r.fired


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
@given(random_model())
def test_random_graphs_keep_their_meaning(tmp_path_factory, case):
    model, feeds = case
    check_invariants(model, feeds, str(tmp_path_factory.mktemp("fuzz")))
