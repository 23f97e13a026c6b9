"""What `onnxfuse profile` says it knows about each remaining cost (inspect/remaining.py): the layout boundaries
with the layout rules, rules that would rewrite an op, rules held back on the target, near misses, no rule."""

from collections import defaultdict

import numpy as np
import onnx.helper as oh
import pytest
from conftest import make_model, save

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.inspect.remaining import LAYOUT_OPS, layout_boundaries, notes, ort_optimized, reads
from onnxfuse.rewrite.ruleset import load_rules

C, R = 32, 8
RNG = np.random.default_rng(0)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _se_cnn(dynamic: bool):
    """Conv -> Relu = c; squeeze-excitation gate g from c; Conv(c * g): the SE Mul between two convolutions."""
    nodes = [oh.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             oh.make_node("Relu", ["c0"], ["c"], name="relu0"),
             oh.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
             oh.make_node("Conv", ["p", "w1", "b1"], ["r"], name="squeeze"),
             oh.make_node("Relu", ["r"], ["rr"], name="relu1"),
             oh.make_node("Conv", ["rr", "w2", "b2"], ["e"], name="excite"),
             oh.make_node("Sigmoid", ["e"], ["g"], name="gate"),
             oh.make_node("Mul", ["c", "g"], ["m"], name="se_mul"),
             oh.make_node("Conv", ["m", "w0", "b0"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    shape = [1, C, "h", "w"] if dynamic else [1, C, 16, 16]
    inits = {"w0": _w(C, C, 3, 3), "b0": _w(C), "w1": _w(R, C, 1, 1), "b1": _w(R), "w2": _w(C, R, 1, 1),
             "b2": _w(C)}
    return make_model(nodes, [("x", shape)], [("y", shape)], inits)


def _profiled(path: str, ops) -> dict[str, list[str]]:
    """Node names per op type as onnxruntime runs the file (what the profiler reports)."""
    by_op = defaultdict(list)
    for n in ort_optimized(path).graph.node:
        by_op[n.op_type].append(n.name)
    return {op: by_op[op] for op in ops if by_op.get(op)}


def test_layout_note_names_the_se_mul_and_why_se_gate_broadcast_misses_it(tmp_path):
    path = save(_se_cnn(dynamic=True), tmp_path / "se_dyn.onnx")
    profiled = _profiled(path, LAYOUT_OPS)
    if not profiled:
        pytest.skip("onnxruntime runs no NCHWc convolutions on this machine")
    bounds = layout_boundaries(ort_optimized(path).graph)
    assert bounds.ends.get("Mul") == ["se_mul"] and "Mul" in bounds.starts
    got = notes(path, profiled)
    ro = got["ReorderOutput"]
    assert ro.boundaries["Mul"] == 1 and "Mul 1" in ro.text.split(";")[0]
    miss = next(f for f in ro.facts if f.rule == "se-gate-broadcast")
    assert miss.kind == "near miss" and miss.nodes == 1
    # the reason says the H/W dims are not static (and what would fix them)
    assert "X.dims is [1, 32, -1, -1]" in miss.reason and "not known before run time" in ro.text
    assert "--static" in ro.text


def test_a_rule_that_matches_a_file_not_optimized_is_named(tmp_path):
    path = save(_se_cnn(dynamic=False), tmp_path / "se.onnx")
    got = notes(path, {"Mul": ["se_mul"], **_profiled(path, LAYOUT_OPS)})
    mul = got["Mul"]
    assert [(f.kind, f.rule, f.nodes) for f in mul.facts] == [("rewrites", "se-gate-broadcast", 1)]
    assert "by se-gate-broadcast 1" in mul.text and "this file was not optimized" in mul.text
    if "ReorderOutput" in got:  # the layout note names the rule for the boundary Mul too
        assert "se-gate-broadcast 1" in got["ReorderOutput"].text


def test_a_rule_dropped_from_an_optimized_file_is_named_as_such(tmp_path):
    src = save(_se_cnn(dynamic=False), tmp_path / "se.onnx")
    out = str(tmp_path / "se.opt.onnx")
    r = optimize(src, out, OptimizeOptions(measure=False, skip=["se-gate-broadcast"]))
    assert r.fired  # conv-relu at least: the output carries onnxfuse's provenance
    mul = notes(out, {"Mul": ["se_mul"]})["Mul"]
    assert "by se-gate-broadcast 1" in mul.text and "onnxfuse's output" in mul.text


def test_a_rule_held_back_on_the_target_gives_its_reason(tmp_path):
    path = save(_se_cnn(dynamic=False), tmp_path / "se.onnx")
    mul = notes(path, {"Mul": ["se_mul"]}, target="cuda")["Mul"]
    held = next(f for f in mul.facts if f.rule == "se-gate-broadcast")
    assert (held.kind, held.nodes, held.reason) == ("held back", 1, "declared for cpu only")
    assert "se-gate-broadcast held back on cuda: declared for cpu only" in mul.text
    # on cpu, a rule whose fused op has no kernel there (NhwcConv is CUDA's)
    conv = notes(path, {"Conv": ["conv0", "conv1"]})["Conv"]
    nhwc = next(f for f in conv.facts if f.rule == "conv-nhwc")
    assert nhwc.kind == "held back" and "no CPU kernel" in nhwc.reason


def test_no_rule_reads_the_op(tmp_path):
    assert not any("Floor" in reads(r) for r in load_rules())
    path = save(make_model([oh.make_node("Floor", ["x"], ["y"], name="floor")], [("x", [2, 8])], [("y", [2, 8])]),
                tmp_path / "floor.onnx")
    got = notes(path, {"Floor": ["floor"], "QuickGelu": ["made_by_ort"]})
    assert got["Floor"].text == "no rule reads Floor" and got["Floor"].facts == []
    assert got["QuickGelu"].text.startswith("onnxruntime's own op")
    assert got["Floor"].to_json() == {"text": "no rule reads Floor", "facts": [], "boundaries": {}}


def test_a_file_onnxfuse_cannot_load_gets_the_reason(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    got = notes(str(bad), {"Add": ["a"]})
    assert got["Add"].text.startswith("not known: ")
