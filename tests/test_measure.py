"""The paired ratio every verdict reads (speed itself is measured in benchmarks/)."""

import numpy as np

from onnxfuse.measure.stats import Ratio, paired_ratio


def test_paired_ratio_verdicts():
    ref = [1.0] * 50
    assert paired_ratio([0.9] * 50, ref).verdict == "faster"
    assert paired_ratio([1.1] * 50, ref).verdict == "slower"
    noisy = list(1 + 0.05 * np.random.default_rng(0).standard_normal(50))
    assert paired_ratio(noisy, ref).verdict == "no significant change"
    r = paired_ratio([0.9] * 50, ref)
    assert isinstance(r, Ratio) and r.low <= r.median <= r.high


def test_a_paired_ratio_is_the_same_for_the_same_timings():
    """Seeded bootstrap: a given set of timings always gives the same interval (and so the same decision)."""
    rng = np.random.default_rng(1)
    a, b = list(1 + 0.05 * rng.standard_normal(40)), list(1 + 0.05 * rng.standard_normal(40))
    assert paired_ratio(a, b) == paired_ratio(a, b)


def test_compare_runs_the_protocol_on_two_models_of_its_callers():
    """measure.compare (what the benchmarks that compare models of their own call): four sessions, a verdict with
    its interval and noise floor, each model's median; with subset_inputs each model reads only its own inputs.
    Fifty chained MatMuls against one is a difference no load hides."""
    import onnx.helper as oh
    from onnx import TensorProto

    from onnxfuse.measure.compare import compare

    def chain(n: int, extra_input: bool) -> bytes:
        nodes = [oh.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}" if i < n - 1 else "y"])
                 for i in range(n)]
        ins = [oh.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])]
        if extra_input:
            ins.append(oh.make_tensor_value_info("unused", TensorProto.FLOAT, [1]))
        w = oh.make_tensor("w", TensorProto.FLOAT, [64, 64], np.full(64 * 64, 1 / 64, np.float32).tolist())
        g = oh.make_graph(nodes, "g", ins, [oh.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [w])
        return oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8).SerializeToString()

    feeds = {"x": np.ones((64, 64), np.float32), "unused": np.zeros(1, np.float32)}
    c = compare(chain(1, False), chain(50, True), feeds, seconds=0.2, min_runs=8, subset_inputs=True)
    assert c.verdict.word == "slower" and c.verdict.ratio.low > 5 and c.variant_s > c.base_s > 0
    assert c.verdict.floor >= 0.005 and "ms ->" in c.line()
