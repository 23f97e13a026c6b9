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
from onnxfuse.validate.runtime import make_session, run


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


def test_a_reshape_to_known_dims_fixes_the_length():
    """Exactly 91 samples run (a Reshape to [batch, 7, 13]): read from the Reshape's target, the first try runs."""
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", ["batch", "samples"])], [("y", None)], {"shape": np.array([0, 7, 13], np.int64)},
                       opset=13)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 91] and plan.tried == []
    assert "Reshape" in plan.dims[1].why and "exactly 91" in plan.dims[1].why
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def _conflicting_reshapes():
    """[batch, samples] reshaped to [batch, 7, 13] (exactly 91 samples) and to [batch, -1, 10] (whole frames of
    10): no length runs."""
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["y"]), oh.make_node("Reshape", ["x", "frames"], ["z"])]
    return make_model(nodes, [("x", ["batch", "samples"])], [("y", None), ("z", None)],
                      {"shape": np.array([0, 7, 13], np.int64), "frames": np.array([0, -1, 10], np.int64)}, opset=13)


def test_no_shape_that_runs_is_one_error_naming_the_dims():
    """Nothing runs: the error names the dims to give with --shape; a given shape is kept as it is."""
    model = _conflicting_reshapes()
    with pytest.raises(InputSpecError, match="no input shapes found") as e:
        discover(model, _probe(model))
    assert "tried; last: samples=" in str(e.value) and e.value.hint == "give them with --shape samples=N"
    with pytest.raises(InputSpecError, match="cannot be reshaped"):
        discover(model, _probe(model), parse_shape_specs(["samples=91"]))


def test_a_length_that_is_not_whole_frames_is_cut_to_whole_frames():
    """view(batch, -1, 512) on [batch, samples]: read from the Reshape, 1 s of audio is rounded to whole frames
    (16000 -> 31 frames of 512) before anything runs."""
    model = _audio_frames_model(512)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 15872] and plan.tried == []
    assert "multiple of 512" in plan.dims[1].why and "Reshape" in plan.dims[1].why
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def test_reflect_pad_needs_a_minimum_length():
    """A dim of unknown meaning is tried larger too: reflect padding of 100 needs more than 100 samples."""
    nodes = [oh.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]
    model = make_model(nodes, [("x", [1, "n"])], [("y", None)], {"pads": np.array([0, 100, 0, 100], np.int64)})
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["x"][1] > 100


def _text_model(table_rows: int, past: bool = False, total: str = "past_sequence + sequence", cross: bool = False,
                hidden_table: bool = False):
    """input_ids [batch, seq] -> word + position embeddings (a table of `table_rows` rows); with `past`, a KV
    cache [batch, 2, past, 8] concatenated with the new keys and an attention mask over past + new (its length
    named `total`); with `cross` too, a cross-attention cache [batch, 2, mem, 8] that the new keys only read;
    `hidden_table`: the positions go through a Mul by 1, so the graph does not show the table bounds them."""
    rng = np.random.default_rng(0)
    inits = {"word": rng.standard_normal((100, 8)).astype(np.float32),
             "pos": rng.standard_normal((table_rows, 8)).astype(np.float32),
             "zero": np.array(0, np.int64), "one": np.array(1, np.int64), "ax1": np.array([1], np.int64)}
    nodes = [oh.make_node("Gather", ["word", "ids"], ["we"]),
             oh.make_node("Shape", ["ids"], ["s"]), oh.make_node("Gather", ["s", "one"], ["n"], axis=0)]
    inputs = [("ids", ["batch", "sequence"], TensorProto.INT64)]
    if past:
        inputs += [("past_key", ["batch", 2, "past_sequence", 8]),
                   ("attention_mask", ["batch", total], TensorProto.INT64)]
        nodes += [oh.make_node("Shape", ["past_key"], ["ps"]), oh.make_node("Gather", ["ps", "two"], ["p"], axis=0),
                  oh.make_node("Add", ["p", "n"], ["end"]), oh.make_node("Range", ["p", "end", "one"], ["pid"])]
        inits["two"] = np.array(2, np.int64)
    else:
        nodes.append(oh.make_node("Range", ["zero", "n", "one"], ["pid"]))
    if hidden_table:
        nodes.append(oh.make_node("Mul", ["pid", "one"], ["pid1"]))
    nodes += [oh.make_node("Gather", ["pos", "pid1" if hidden_table else "pid"], ["pe"]),
              oh.make_node("Add", ["we", "pe"], ["y"])]
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
    if cross:  # scores of the new keys against a cache nothing appends to: [b, 2, s, mem]
        inputs.append(("past_cross_key", ["batch", 2, "encoder_length", 8]))
        nodes += [oh.make_node("Transpose", ["past_cross_key"], ["ckt"], perm=[0, 1, 3, 2]),
                  oh.make_node("MatMul", ["k2", "ckt"], ["cross_scores"])]
        outputs.append(("cross_scores", None))
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
    assert data["shapes"]["x"] == [2, 15872] and data["tried"] == []
    assert "multiple of 512" in data["dims"][1]["why"]
    code, stdout, _ = cli("inputs", src)
    assert code == 0 and "samples = 15872 (audio" in stdout
    code, stdout, _ = cli("inputs", save(_tiled_bias_model(), tmp_path / "t.onnx"))
    assert code == 0 and "n = 192" in stdout and "did not run: n=16000" in stdout
    code, stdout, stderr = cli("optimize", save(_conv_model(["n", 3, "h", "w"]), tmp_path / "c.onnx"),
                               tmp_path / "o.onnx", "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["inputs"]["shapes"] == {"x": [2, 3, 224, 224]} and data["peak_rss_bytes"] > 0


def test_no_runnable_shape_is_one_clear_line(cli, tmp_path):
    """Two Reshapes that disagree: nothing runs, so one line names the dim and nothing is written."""
    src = save(_conflicting_reshapes(), tmp_path / "a.onnx")
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


def test_decode_profile_total_follows_the_fixed_past_length():
    """A mask over past + new whose dim is a bare name (dynamo's 'total_sequence'): at decode it is 31 + 1, not
    the new length alone (that ran nothing, and the decoder fell back to one plain shape)."""
    from onnxfuse.inputs import discover_profiles

    model = _text_model(64, past=True, total="total_sequence")
    got = {p.name: plan.shapes["attention_mask"] for p, plan, _ in discover_profiles(
        model, _probe(model), ShapeSpec(), None, None)}
    assert got == {"prefill": [2, 32], "decode": [2, 32]}


def test_profiles_fall_back_to_the_length_that_runs():
    """A position table the graph does not show as one (40 rows): prefill 128 / decode 1 after 127 cannot run,
    so the profiles take the length plain discovery settled on (16: 16 + 15 fit), not one plain shape."""
    from onnxfuse.inputs import discover_profiles

    model = _text_model(40, past=True, hidden_table=True)
    got = {p.name: plan.shapes["past_key"][2:3] + plan.shapes["ids"][1:] for p, plan, _ in discover_profiles(
        model, _probe(model), ShapeSpec(), None, None)}
    assert got == {"prefill": [0, 16], "decode": [15, 1]}


def test_cross_attention_cache_keeps_its_length_at_prefill_and_decode():
    """A cache that no Concat appends to is an encoder's memory: a realistic length in both profiles (never 0
    at prefill, as a self-attention cache is), named or not."""
    from onnxfuse.inputs import discover_profiles

    model = _text_model(512, past=True, cross=True)
    for p, plan, _ in discover_profiles(model, _probe(model), ShapeSpec(), None, None):
        assert plan.shapes["past_cross_key"] == [2, 2, 128, 8], p.name
        assert plan.shapes["past_key"][2] == (0 if p.name == "prefill" else 127)
    roles = {d.key: d.role for d in discover(model, _probe(model))[0].dims}
    assert roles["encoder_length"] == "memory" and roles["past_sequence"] == "past"
    from onnxfuse.inputs.roles import memory_caches
    from onnxfuse.inputs.shapes import model_inputs

    assert memory_caches(model, model_inputs(model)) == {"past_cross_key"}  # by structure, whatever its name


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
        with pytest.raises(InputSpecError, match=f"^profiles={bad!r}: "):
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
    assert code == 1 and stderr.startswith("onnxfuse: error: --profile bad: expected NAME:DIM=V,DIM=V[@WEIGHT]")


def test_bench_times_a_kv_decoder_at_prefill_and_decode(cli, tmp_path):
    from onnxfuse.inspect.latency import bench

    src = save(_text_model(64, past=True, total="total_sequence"), tmp_path / "kv.onnx")
    res = bench([src, src], min_runs=5, budget_s=0.05)
    assert [(r.profile, r.inputs["ids"], r.inputs["past_key"][2]) for r in [res, *res.profiles]] == [
        ("prefill", [1, 32], 0), ("decode", [1, 1], 31)]  # optimize times batch 1
    assert all(r.verdict and len(r.models) == 2 for r in [res, *res.profiles])
    data = res.to_json()
    assert data["profile"] == "prefill" and [p["profile"] for p in data["profiles"]] == ["decode"]
    code, stdout, stderr = cli("bench", src, "--budget", "0.05", "--runs", "5", "--profile", "short:sequence=8")
    assert code == 0, stderr
    assert "ids 1x8" in stdout and "profile:" not in stdout  # one profile: the plain table
    code, stdout, stderr = cli("bench", src, src, "--budget", "0.05", "--runs", "5")
    assert code == 0, stderr
    assert "prefill profile: latency" in stdout and "decode: B vs A" in stdout


def test_interleave_adds_profiles_per_round_relative_to_the_first_session(monkeypatch):
    from onnxfuse.measure import timing as I

    clock = [0.0]

    class Fake:
        def __init__(self, k):
            self.k = k

        def run(self, _out, feeds):
            clock[0] += feeds["scale"] * self.k

    monkeypatch.setattr(I, "now", lambda: (clock[0], clock[0]))
    t = I.interleave({"a": Fake(1), "b": Fake(2)}, [(1.0, {"scale": 1.0}), (4.0, {"scale": 10.0})],
                     estimator="cpu", min_runs=3, floor_runs=3)
    # each profile relative to the first session's time there (1 and 10): a = 1 + 4, b = 2 + 4 * 2
    assert dict(t) == {"a": [5.0] * 3, "b": [10.0] * 3} and t.on("wall") == dict(t)


def test_frames_of_a_fixed_size_are_read_from_the_reshape_target():
    """Frames of 480 samples (the target [batch, -1, 480] built from Shape(x)[0], as torch exports `view`):
    ~1 s of audio rounded to whole frames (16000 -> 15840), and every rung of the ladder divides too."""
    nodes = [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             oh.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             oh.make_node("Concat", ["b1", "minus1", "k"], ["target"], axis=0),
             oh.make_node("Reshape", ["x", "target"], ["f"]),
             oh.make_node("ReduceMean", ["f"], ["y"], axes=[2], keepdims=0)]
    inits = {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "k": np.array([480], np.int64)}
    model = make_model(nodes, [("x", ["batch", "samples"])], [("y", None)], inits, opset=13)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 15840] and plan.tried == []
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])
    from onnxfuse.inputs.discover import plan_dims
    from onnxfuse.inputs.shapes import model_inputs
    ladder = plan_dims(model, model_inputs(model), ShapeSpec(), 2)["samples"].ladder
    assert all(v % 480 == 0 for v in ladder) and ladder[0] == 15840


def test_a_reshape_baked_to_the_export_length_is_found_from_the_error():
    """A traced model that cut frames of 480 and then baked the export's 20 frames into a later Reshape: the
    error names input {33,2,16} and target {20,8,4}, so the next try scales the length to exactly that
    (15840 -> 9600 samples), which runs."""
    nodes = [oh.make_node("Reshape", ["x", "frames"], ["f"]), oh.make_node("Transpose", ["f"], ["t"], perm=[1, 0, 2]),
             oh.make_node("Slice", ["t", "st", "en", "ax"], ["u"]),
             oh.make_node("Reshape", ["u", "baked"], ["y"])]
    inits = {"frames": np.array([0, -1, 480], np.int64), "baked": np.array([20, -1, 4], np.int64),
             "st": np.array([0], np.int64), "en": np.array([16], np.int64), "ax": np.array([2], np.int64)}
    nodes[-1] = oh.make_node("Reshape", ["u", "baked2"], ["y"])
    inits["baked2"] = np.array([20, 8, 4], np.int64)
    model = make_model(nodes, [("x", [2, "samples"])], [("y", None)], inits, opset=13)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 9600] and len(plan.tried) == 1 and "needs exactly 20x8x4" in plan.dims[0].why
    assert "Input shape:{33,2,16}" in plan.tried[0]
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def test_a_state_whose_wanted_size_grows_with_the_batch_is_not_chased():
    """silero VAD after its Squeeze became a Reshape: frames of 512 samples fold into the LSTM's batch, so at 16000
    samples onnxruntime says initial_h 'must have shape {1,62,32}. Actual:{1,2,32}'; at batch 62 it wants 1922.
    The batch is tried once at the value named, not chased up (which spent every probe before the ladder reached
    512, the one length that runs); the length search goes on and finds 512."""
    rng = np.random.default_rng(0)
    hd = 32
    nodes = [oh.make_node("Unsqueeze", ["input", "ax1"], ["u"]),
             oh.make_node("Conv", ["u", "wc"], ["c"], kernel_shape=[512], strides=[512]),  # [B, 8, T]
             oh.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]),
             oh.make_node("Reshape", ["t", "to"], ["x"]),  # [1, B*T, 8]: the frames fold into the batch
             oh.make_node("LSTM", ["x", "w", "r", "", "", "state"], ["", "y"], hidden_size=hd)]
    inits = {"ax1": np.array([1], np.int64), "wc": rng.standard_normal((8, 1, 512)).astype(np.float32) / 20,
             "to": np.array([1, -1, 8], np.int64), "w": rng.standard_normal((1, 4 * hd, 8)).astype(np.float32) / 4,
             "r": rng.standard_normal((1, 4 * hd, hd)).astype(np.float32) / 4}
    model = make_model(nodes, [("input", ["batch", "sequence"]), ("state", [1, "batch", hd])], [("y", None)], inits)
    plan, ref = discover(model, _probe(model))
    assert plan.shapes == {"input": [2, 512], "state": [1, 2, hd]}
    assert "{1,62,32}. Actual:{1,2,32}" in plan.tried[0] and "{1,1922,32}. Actual:{1,62,32}" in plan.tried[1]
    assert not any("Actual:{1,1922," in t for t in plan.tried) and len(plan.tried) == 6  # then 8000 ... 1024
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0], rtol=1e-6)


def test_a_dim_a_constant_fixes_gets_that_size_not_a_toy_one():
    """x[batch, c] + bias[768]: c runs at 768 or 1 (a broadcast), and 1 is a toy size. Read from the constant,
    768 is the first try; the why names the node."""
    model = make_model([oh.make_node("Add", ["x", "b"], ["y"])], [("x", ["batch", "c"])], [("y", None)],
                       {"b": np.ones(768, np.float32)})
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [2, 768] and plan.tried == []
    assert "Add 'y' meets a constant dim of 768" in plan.dims[1].why
    w = np.ones((3, 8), np.float32)  # the inner dim of a MatMul with a constant weight
    model = make_model([oh.make_node("MatMul", ["x", "w"], ["y"])], [("x", ["batch", "t", "k"])], [("y", None)],
                       {"w": w})
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["x"][2] == 3 and "MatMul" in plan.dims[2].why


def test_a_dim_a_constant_fixes_keeps_that_size_while_the_others_are_searched():
    """A ViT export (Optimum's: pixel_values [batch, num_channels, height, width]): the patch Conv fixes the
    channels at 3, and the position table runs only at 32x32 (16 patches of 8). The channels stay 3 at every try
    (before, the search paired 3 with 224 only and reached 32 with a toy channel count: no shapes found)."""
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], strides=[8, 8]),
             oh.make_node("Reshape", ["c", "s"], ["r"]), oh.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             oh.make_node("Add", ["t", "pos"], ["y"])]
    model = make_model(nodes, [("x", ["batch_size", "num_channels", "height", "width"])], [("y", None)],
                       {"w": rng.standard_normal((8, 3, 8, 8)).astype(np.float32),
                        "s": np.array([0, 8, -1], np.int64), "pos": np.zeros((1, 16, 8), np.float32)})
    plan, ref = discover(model, _probe(model))
    b, c, h, w = plan.shapes["x"]
    assert c == 3 and (h // 8) * (w // 8) == 16 and all("num_channels=3" in t for t in plan.tried)
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def _tiled_bias_model():
    nodes = [oh.make_node("Tile", ["b", "r"], ["bt"]), oh.make_node("Add", ["x", "bt"], ["y"])]
    return make_model(nodes, [("x", [1, 4, "n"])], [("y", None)],
                      {"b": np.ones(96, np.float32), "r": np.array([2], np.int64)})


def test_a_broadcast_against_a_computed_tensor_takes_its_size_from_the_error():
    """x[1, 4, n] + Tile(b, 2) (192 values, not a constant the graph reader sees): the broadcast error names 192,
    so the next try is 192 (not the ladder's toy sizes); the why says what decided it."""
    model = _tiled_bias_model()
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"] == [1, 4, 192] and len(plan.tried) == 1
    assert "broadcast against 192" in plan.dims[0].why
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0])


def test_a_dim_that_only_runs_at_a_toy_size_says_so():
    """A dim of no role that runs only at 1 (Expand to [1, 3, 4] needs n=1 or 3; the error names neither):
    the why says it is a toy size and to give the real one."""
    model = make_model([oh.make_node("Expand", ["x", "s"], ["y"])], [("x", [1, "n", 4])], [("y", None)],
                       {"s": np.array([1, 3, 4], np.int64)})
    plan, _ = discover(model, _probe(model))
    assert plan.shapes["x"] == [1, 1, 4] and len(plan.tried) == 5 and plan.dims[0].role == "other"
    assert "toy size" in plan.dims[0].why and "--shape" in plan.dims[0].why


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


# ---- memory: weights are not copied for shape inference, the checker, candidates and the written model --------


def _weighted_model():
    """x[batch, 64] @ W[64, 128] (8192 floats: a 'large' initializer) + b, then a Reshape by a small constant."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((64, 128)).astype(np.float32), "b": np.ones(128, np.float32),
             "shape": np.array([0, -1, 32], np.int64)}
    nodes = [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["m", "b"], ["a"]),
             oh.make_node("Reshape", ["a", "shape"], ["y"])]
    model = make_model(nodes, [("x", ["batch", 64])], [("y", ["batch", 4, 32])], inits, opset=13)
    model.metadata_props.add(key="k", value="v")
    return model


def test_streamed_write_is_byte_identical():
    import io

    from onnx import numpy_helper

    from onnxfuse.load.write import write_streamed

    model = _weighted_model()
    model.graph.initializer.append(numpy_helper.from_array(np.arange(5000, dtype=np.float32), "typed"))
    model.graph.initializer[-1].float_data.extend(model.graph.initializer[-1].float_data)  # not raw_data
    f = io.BytesIO()
    write_streamed(f, model)
    assert f.getvalue() == model.SerializeToString()


def test_shape_inference_and_checker_run_without_the_weights():
    import onnx

    from onnxfuse.load.loader import infer_types, weightless

    model = _weighted_model()
    light = weightless(model)
    assert [t.name for t in light.graph.initializer] == ["b", "shape"]  # w (8192 floats) became a typed input
    assert light.graph.input[-1].name == "w" and model.graph.initializer[0].name == "w"  # the model is unchanged
    onnx.checker.check_model(light)
    full = onnx.shape_inference.infer_shapes(model, data_prop=True)
    got = infer_types(model)
    assert [i.name for i in got.graph.input] == [i.name for i in model.graph.input]
    assert {v.name: v.type for v in got.graph.value_info} == {v.name: v.type for v in full.graph.value_info}


def test_candidates_keep_their_weights_in_a_mapped_side_file(tmp_path):
    """A candidate is written as a model plus a page-aligned weights file onnxruntime maps; it runs like the
    model and the validator's checks pass on it."""
    import os

    from onnxfuse.load.loader import LoadInfo
    from onnxfuse.validate.runtime import Candidate

    model = _weighted_model()
    cand = Candidate(model, LoadInfo(str(tmp_path / "m.onnx"), 0, False, 0))
    try:
        assert isinstance(cand.source, str) and os.path.exists(cand.source + ".weights")
        assert os.path.getsize(cand.source) < 4096 < os.path.getsize(cand.source + ".weights")
        feeds = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
        got = run(make_session(cand.source, "all"), feeds)["y"]
        np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5)
    finally:
        cand.close()
    assert not os.path.exists(cand.source)


def test_inputs_command_shows_the_profiles_optimize_uses(cli, tmp_path):
    """`onnxfuse inputs` on a KV-cache decoder prints the prefill and decode profiles that optimize validates and
    measures on (not one shape set of its own), in text and JSON."""
    src = save(_text_model(64, past=True), tmp_path / "kv.onnx")
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx", "--json")
    assert code == 0, stderr
    optimized = [(p["name"], p["weight"], p["inputs"]["shapes"]) for p in json.loads(stdout)["profiles"]]
    code, stdout, stderr = cli("inputs", src, "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    shown = [(p["name"], p["weight"], p["inputs"]["shapes"]) for p in data["profiles"]]
    assert [n for n, _, _ in shown] == ["prefill", "decode"]
    assert shown == optimized
    assert data["shapes"] == shown[0][2]  # the top-level fields are the first profile's, as optimize's `inputs`
    code, stdout, _ = cli("inputs", src)
    assert code == 0
    assert stdout.index("prefill profile (weight 1):") < stdout.index("decode profile (weight 1):")
    assert "ids: int64[2x32]" in stdout and "ids: int64[2x1]" in stdout
    code, stdout, stderr = cli("inputs", src, "--profile", "short:sequence=8@3", "--json")
    assert code == 0, stderr
    assert [(p["name"], p["weight"], p["inputs"]["shapes"]["ids"]) for p in json.loads(stdout)["profiles"]] == [
        ("short", 3.0, [2, 8])]


def test_find_inputs_is_the_first_profile_optimize_runs(tmp_path):
    import onnxfuse

    src = save(_text_model(64, past=True), tmp_path / "kv.onnx")
    profiles = onnxfuse.find_profiles(src)
    assert [(n, w) for n, w, _ in profiles] == [("prefill", 1.0), ("decode", 1.0)]
    assert onnxfuse.find_inputs(src).shapes == profiles[0][2].shapes


@pytest.mark.parametrize(("op", "index"), [("GroupQueryAttention", 3), ("MultiHeadAttention", 6)])
def test_a_cache_a_fused_attention_appends_to_is_a_self_attention_cache(op, index):
    """An optimized decoder's past key goes into GroupQueryAttention (or MultiHeadAttention's past input), which
    appends the new keys itself: it is the self-attention cache a Concat made of it before (0 at prefill), not an
    encoder's memory (profiling the optimized Llama found no shapes that ran)."""
    from onnxfuse.inputs.roles import memory_caches
    from onnxfuse.inputs.shapes import model_inputs

    ins = [""] * (index + 2)
    ins[0], ins[index], ins[index + 1] = "q", "past_key", "past_value"
    node = oh.make_node(op, ins, ["y", "present_key", "present_value"], domain="com.microsoft", num_heads=2)
    model = make_model([node], [("q", [1, 3, 16]), ("past_key", [1, 2, "past_sequence", 8]),
                                ("past_value", [1, 2, "past_sequence", 8])],
                       [("y", None), ("present_key", None), ("present_value", None)])
    assert memory_caches(model, model_inputs(model)) == frozenset()


def test_position_ids_shared_by_the_batch_move_the_batch_to_one():
    """RotaryEmbedding reading position ids [1, s] (a hand-written decoder's, shared by the batch): onnxruntime
    says "Input 'position_ids' dimension 0 should be of size batch_size, got 1" at the default batch of 2. The size
    it names is the batch, so the batch is tried at 1, and the why says so."""
    rng = np.random.default_rng(0)
    n, d = 4, 16
    model = make_model([oh.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                                     num_heads=n)],
                       [("x", ["batch", "seq", n * d]), ("pos", [1, "seq"], TensorProto.INT64)], [("y", None)],
                       {"cos": rng.standard_normal((128, d // 2)).astype(np.float32),
                        "sin": rng.standard_normal((128, d // 2)).astype(np.float32)})
    model.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    plan, ref = discover(model, _probe(model))
    assert plan.shapes["x"][0] == 1 and plan.shapes["pos"] == [1, plan.shapes["x"][1]]
    assert "position_ids' dimension 0 should be of size batch_size, got 1" in plan.tried[0]
    batch = next(c for c in plan.dims if c.role == "batch")
    assert batch.why == "batch, default 2; 1: RotaryEmbedding needs 1 where 2 was given (after 1 failed try)"
    np.testing.assert_allclose(ref["y"], ort_run(model, plan.feeds)[0], rtol=1e-6)
