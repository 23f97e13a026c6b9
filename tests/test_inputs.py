"""Input discovery: shapes read from the model, bounded by its tables, kept within a memory budget and settled
by probing the original (onnxfuse/inputs.py), and the `onnxfuse inputs` command."""

from __future__ import annotations

import json

import numpy as np
import onnx.helper as oh
import pytest
from conftest import make_model, ort_run, save
from onnx import TensorProto

from onnxfuse.errors import InputSpecError
from onnxfuse.inputs import discover
from onnxfuse.inputs.shapes import ShapeSpec, parse_shape_specs
from onnxfuse.runtime import make_session, run


def _probe(model):
    sess = make_session(model.SerializeToString(), "disable", "cpu")
    return lambda feeds: run(sess, feeds)


def _conv_model(shape):
    """An OCR-recognizer-like input [?, 3, 48, ?]: Conv + Relu."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", shape)], [("y", None)], {"w": w})


def test_fixed_dims_stay_and_dynamic_ones_get_realistic_sizes():
    plan, _ = discover(_conv_model([None, 3, 48, None]), None)
    assert plan.shapes == {"x": [2, 3, 48, 224]}
    assert {d.role for d in plan.dims} == {"batch", "image"} and plan.source == "discovered"


def test_memory_budget_skips_candidates_before_running_them():
    model = _conv_model(["n", 3, "h", "w"])
    calls = []

    def probe(feeds):
        calls.append(feeds["x"].shape)
        return _probe(model)(feeds)

    plan, _ = discover(model, probe, budget_bytes=1_000_000)  # 224x224 needs ~5 MB here
    assert calls == [plan.feeds["x"].shape]  # nothing over the budget was ever run
    assert plan.shapes["x"][2] < 224 and "over the memory budget" in plan.tried[0]
    with pytest.raises(InputSpecError, match=r"no input shapes found .*over the memory budget") as e:
        discover(model, probe, budget_bytes=100)
    assert "--shape h=N" in e.value.hint and "--shape w=N" in e.value.hint
    plan, _ = discover(_conv_model([None, 3, 48, None]), None, budget_bytes=500_000)  # unnamed dims walk too
    assert plan.shapes["x"][:3] == [2, 3, 48] and plan.shapes["x"][3] < 224 and plan.estimate_bytes <= 500_000
    with pytest.raises(InputSpecError) as e:
        discover(_conv_model([None, 3, 48, None]), None, budget_bytes=100)
    assert e.value.hint == "give them with --shape x:DIMS"


def _audio_frames_model(frame: int):
    """Audio cut into frames of `frame` samples: runs only when the length is a multiple of it."""
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["f"]), oh.make_node("ReduceMean", ["f"], ["y"], axes=[2],
                                                                      keepdims=0)]
    return make_model(nodes, [("x", ["batch", "samples"])], [("y", None)],
                      {"shape": np.array([0, -1, frame], np.int64)}, opset=13)


def test_probe_walks_down_until_the_original_runs():
    """Exactly 91 samples run (a Reshape to [batch, 7, 13]); every rung fails, and the error names the dims."""
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", ["batch", "samples"])], [("y", None)], {"shape": np.array([0, 7, 13], np.int64)},
                       opset=13)
    with pytest.raises(InputSpecError, match="no input shapes found") as e:
        discover(model, _probe(model))
    assert "8 tried" in str(e.value) and e.value.hint == "give them with --shape samples=N"
    plan, ref = discover(model, _probe(model), parse_shape_specs(["samples=91"]))
    assert plan.shapes["x"] == [2, 91] and plan.source == "--shape"


def test_a_length_that_is_not_whole_frames_is_cut_to_whole_frames():
    model = _audio_frames_model(512)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 15872]  # 16000 is not a whole number of 512-sample frames; 31 frames are
    assert len(plan.tried) == 1 and "Reshape" in plan.tried[0]
    assert "15872 after 1 failed" in plan.dims[1].why
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def test_reflect_pad_needs_a_minimum_length():
    """A dim of unknown meaning is tried larger too: reflect padding of 100 needs more than 100 samples."""
    nodes = [oh.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]
    model = make_model(nodes, [("x", [1, "n"])], [("y", None)], {"pads": np.array([0, 100, 0, 100], np.int64)})
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["x"][1] > 100


def _text_model(table_rows: int, past: bool = False):
    """input_ids [batch, seq] -> word + position embeddings (a table of `table_rows` rows); with `past`, a KV
    cache [batch, 2, past, 8] concatenated with the new keys and an attention mask over past + new."""
    rng = np.random.default_rng(0)
    inits = {"word": rng.standard_normal((100, 8)).astype(np.float32),
             "pos": rng.standard_normal((table_rows, 8)).astype(np.float32),
             "zero": np.array(0, np.int64), "one": np.array(1, np.int64), "ax1": np.array([1], np.int64)}
    nodes = [oh.make_node("Gather", ["word", "ids"], ["we"]),
             oh.make_node("Shape", ["ids"], ["s"]), oh.make_node("Gather", ["s", "one"], ["n"], axis=0)]
    inputs = [("ids", ["batch", "sequence"], TensorProto.INT64)]
    if past:
        inputs += [("past_key", ["batch", 2, "past_sequence", 8]),
                   ("attention_mask", ["batch", "past_sequence + sequence"], TensorProto.INT64)]
        nodes += [oh.make_node("Shape", ["past_key"], ["ps"]), oh.make_node("Gather", ["ps", "two"], ["p"], axis=0),
                  oh.make_node("Add", ["p", "n"], ["end"]), oh.make_node("Range", ["p", "end", "one"], ["pid"])]
        inits["two"] = np.array(2, np.int64)
    else:
        nodes.append(oh.make_node("Range", ["zero", "n", "one"], ["pid"]))
    nodes += [oh.make_node("Gather", ["pos", "pid"], ["pe"]), oh.make_node("Add", ["we", "pe"], ["y"])]
    outputs = [("y", None)]
    if past:  # present = past ++ new (one head pair), masked by attention_mask over past + new
        nodes += [oh.make_node("Unsqueeze", ["y", "ax1"], ["k"]),
                  oh.make_node("Concat", ["k", "k"], ["k2"], axis=1),
                  oh.make_node("Concat", ["past_key", "k2"], ["present"], axis=2),
                  oh.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
                  oh.make_node("Unsqueeze", ["mf", "ax13"], ["m4"]),
                  oh.make_node("Mul", ["present", "m4"], ["masked"])]
        inits["ax13"] = np.array([1, 3], np.int64)
        outputs.append(("masked", None))
    return make_model(nodes, inputs, outputs, inits)


def test_position_table_bounds_the_sequence():
    model = _text_model(40)
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["ids"] == [2, 40] and not plan.tried
    assert "position table 'pos' has 40 rows" in plan.dims[1].why
    assert plan.feeds["ids"].max() < 100  # ids stay inside the word table
    plan, _ = discover(_text_model(512), None)
    assert plan.shapes["ids"] == [2, 128]  # realistic length when the table allows it


def test_kv_cache_past_and_total_are_tied_and_fit_the_table():
    model = _text_model(64, past=True)
    plan, _ = discover(model, _probe(model))
    assert plan.shapes == {"ids": [2, 32], "past_key": [2, 2, 31, 8], "attention_mask": [2, 63]}
    assert not plan.tried
    roles = {d.key: d.role for d in plan.dims}
    assert roles == {"batch": "batch", "sequence": "seq", "past_sequence": "past",
                     "past_sequence + sequence": "total"}


def test_given_shapes_are_kept_and_only_the_rest_searched():
    model = _audio_frames_model(512)
    plan, _ = discover(model, _probe(model), parse_shape_specs(["batch=3"]))
    assert plan.shapes["x"] == [3, 15872]
    with pytest.raises(InputSpecError, match="onnxruntime failed"):
        discover(model, _probe(model), parse_shape_specs(["batch=3", "samples=1000"]))


def test_inputs_command_and_optimize_report(cli, tmp_path):
    src = save(_audio_frames_model(512), tmp_path / "a.onnx")
    code, stdout, stderr = cli("inputs", src, "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["shapes"]["x"] == [2, 15872] and len(data["tried"]) == 1
    code, stdout, _ = cli("inputs", src)
    assert code == 0 and "samples = 15872 (audio" in stdout and "did not run: samples=16000" in stdout
    code, stdout, stderr = cli("optimize", save(_conv_model(["n", 3, "h", "w"]), tmp_path / "c.onnx"),
                               tmp_path / "o.onnx", "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["inputs"]["shapes"] == {"x": [2, 3, 224, 224]} and data["peak_rss_bytes"] > 0


def test_no_runnable_shape_is_one_clear_line(cli, tmp_path):
    """Only 91 samples run: nothing the search tries does, so one line names the dim and nothing is written."""
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["y"]), oh.make_node("Relu", ["y"], ["z"])]
    model = make_model(nodes, [("x", ["batch", "samples"])], [("z", None)], {"shape": np.array([0, 7, 13], np.int64)},
                       opset=13)
    src = save(model, tmp_path / "a.onnx")
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx")
    assert code == 1 and stderr.count("\n") == 1
    assert "no input shapes found that the original model runs on" in stderr and "--shape samples=N" in stderr
    assert not (tmp_path / "o.onnx").exists()


def test_kv_cache_decoders_get_prefill_and_decode_profiles():
    from onnxfuse.inputs import discover_profiles

    model = _text_model(64, past=True)
    got = {p.name: (p.weight, plan.shapes) for p, plan, _ in discover_profiles(model, _probe(model), ShapeSpec(),
                                                                                 None, None)}
    assert got == {"prefill": (1.0, {"ids": [2, 32], "past_key": [2, 2, 0, 8], "attention_mask": [2, 32]}),
                   "decode": (1.0, {"ids": [2, 1], "past_key": [2, 2, 31, 8], "attention_mask": [2, 32]})}
    plain = _text_model(64)
    assert [p.name for p, _, _ in discover_profiles(plain, _probe(plain), ShapeSpec(), None, None)] == ["default"]


def test_profiles_are_parsed_with_weights_and_checked():
    from onnxfuse.inputs import discover_profiles, parse_profiles

    profiles = parse_profiles(["prefill:sequence=40,past_sequence=0", "decode:sequence=1,past_sequence=20@4"])
    assert [(p.name, p.weight, p.spec.dims) for p in profiles] == [
        ("prefill", 1.0, {"sequence": 40, "past_sequence": 0}),
        ("decode", 4.0, {"sequence": 1, "past_sequence": 20})]
    model = _text_model(64, past=True)
    plans = discover_profiles(model, _probe(model), ShapeSpec(), None, profiles)
    assert [plan.shapes["attention_mask"] for _, plan, _ in plans] == [[2, 40], [2, 21]]
    for bad in ("prefill", "p:", "p:seq=1@0", "p:seq=x"):
        with pytest.raises(InputSpecError, match="--profile|--shape"):
            parse_profiles([bad])
    with pytest.raises(InputSpecError, match="given twice"):
        parse_profiles(["a:seq=1", "a:seq=2"])
    with pytest.raises(InputSpecError):  # a user's profile the model cannot run is an error, not a fallback
        discover_profiles(model, _probe(model), ShapeSpec(), None, parse_profiles(["long:sequence=60"]))


def test_optimize_validates_every_profile_and_measures_their_weighted_total(cli, tmp_path):
    src = save(_text_model(64, past=True), tmp_path / "kv.onnx")
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx", "--json", "--measure-budget", "0.05",
                               measure=True)
    assert code == 0, stderr
    data = json.loads(stdout)
    assert [(p["name"], p["inputs"]["shapes"]["ids"]) for p in data["profiles"]] == [
        ("prefill", [2, 32]), ("decode", [2, 1])]
    code, stdout, stderr = cli("optimize", src, tmp_path / "o2.onnx", "--profile", "short:sequence=8@3")
    assert code == 0, stderr
    assert "inputs: ids[2x8]" in stdout
    code, _, stderr = cli("optimize", src, tmp_path / "o3.onnx", "--profile", "bad")
    assert code == 1 and "invalid --profile 'bad'" in stderr


def test_weighted_time_fn_adds_profiles_per_round():
    from onnxfuse.select import weighted_time_fn

    def fake(sources, feeds):
        return {k: [feeds["scale"] * (i + 1)] * 3 for i, k in enumerate(sources)}

    timed = weighted_time_fn(fake, [(1.0, {"scale": 1.0}), (4.0, {"scale": 10.0})])
    assert timed({"a": None, "b": None}, {}) == {"a": [41.0] * 3, "b": [82.0] * 3}


def test_frames_of_a_fixed_size_are_found_from_the_reshape_error():
    """Frames of 480 samples: no rung of the audio ladder divides, but onnxruntime names the requested shape, so
    the next try is the largest whole number of frames (16000 -> 15840)."""
    model = _audio_frames_model(480)
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 15840] and len(plan.tried) == 1


def test_feature_frames_get_their_own_ladder():
    """[batch, 80 mel bins, frames] (a Whisper-style encoder): 3000 frames, not a toy length."""
    nodes = [oh.make_node("ReduceMean", ["input_features"], ["y"], axes=[2], keepdims=0)]
    model = make_model(nodes, [("input_features", ["batch", 80, "frames"])], [("y", None)], opset=13)
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["input_features"] == [2, 80, 3000] and plan.dims[1].role == "frames"


def test_a_bucket_table_is_not_a_position_table():
    """T5's relative attention bias is gathered by buckets computed with Log/Min, not by positions: it bounds
    nothing (a 32-row bucket table must not cap the text at 32)."""
    rng = np.random.default_rng(0)
    inits = {"word": rng.standard_normal((100, 8)).astype(np.float32),
             "bias": rng.standard_normal((32, 8)).astype(np.float32), "cap": np.array(31, np.int64)}
    nodes = [oh.make_node("Gather", ["word", "ids"], ["we"]), oh.make_node("Shape", ["ids"], ["s"]),
             oh.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT), oh.make_node("Log", ["sf"], ["lg"]),
             oh.make_node("Cast", ["lg"], ["li"], to=TensorProto.INT64), oh.make_node("Min", ["li", "cap"], ["bk"]),
             oh.make_node("Gather", ["bias", "bk"], ["b"]), oh.make_node("Add", ["we", "b"], ["y"])]
    model = make_model(nodes, [("ids", ["batch", "sequence"], TensorProto.INT64)], [("y", None)], inits)
    plan, _ = discover(model, None)
    assert plan.shapes["ids"] == [2, 128]
