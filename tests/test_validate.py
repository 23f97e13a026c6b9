from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.errors import InputSpecError, ModelError, OnnxfuseError
from onnxfuse.inputs import ShapeSpec, make_inputs, parse_shape_specs
from onnxfuse.validate.compare import OutputCheck, Tolerance, compare_outputs, default_tolerance
from onnxfuse.validate.runtime import make_session, run

VOCAB = 50
HIDDEN = 8


# ---- model builders ---------------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def embedding_model() -> onnx.ModelProto:
    """input_ids -> Cast -> Gather(word table, vocab 50); token_type_ids -> Gather(vocab 2); mask * result."""
    rng = np.random.default_rng(1)
    word = numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "word")
    types = numpy_helper.from_array(rng.standard_normal((2, HIDDEN)).astype(np.float32), "types")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["word", "ids32"], ["we"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["te"]),
        helper.make_node("Add", ["we", "te"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["out"]),
    ]
    axis = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis")
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])]
    return _model(nodes, inputs, outputs, [word, types, axis])


def image_model() -> onnx.ModelProto:
    """float image [N, 3, H, W] -> Relu -> Add(bias) -> ReduceMean; exercises optimizer levels."""
    bias = numpy_helper.from_array(np.full((1, 3, 1, 1), 0.5, dtype=np.float32), "bias")
    nodes = [
        helper.make_node("Relu", ["image"], ["r"]),
        helper.make_node("Add", ["r", "bias"], ["a"]),
        helper.make_node("Identity", ["a"], ["b"]),
        helper.make_node("ReduceMean", ["b"], ["out"], keepdims=0, axes=[2, 3]),
    ]
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "height", None])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])]
    return _model(nodes, inputs, outputs, [bias], opset=17)


def _save(model: onnx.ModelProto, tmp_path: Path, name: str = "m.onnx") -> str:
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


# ---- default_tolerance ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elem_type", "expected"),
    [
        (TensorProto.FLOAT, Tolerance(1e-4, 1e-4)),
        (TensorProto.DOUBLE, Tolerance(1e-4, 1e-4)),
        (TensorProto.FLOAT16, Tolerance(1e-2, 1e-2)),
        (TensorProto.BFLOAT16, Tolerance(1e-2, 1e-2)),
        (TensorProto.INT64, Tolerance(0.0, 0.0)),
        (TensorProto.BOOL, Tolerance(0.0, 0.0)),
    ],
)
def test_default_tolerance(elem_type: int, expected: Tolerance) -> None:
    assert default_tolerance(elem_type) == expected


# ---- parse_shape_specs ------------------------------------------------------------------------------------------


def test_parse_tensor_and_dim_specs() -> None:
    spec = parse_shape_specs(["image:1x3x224x224", "ids:2,128", "batch=4", " seq = 16 ", "x:0:5", "s:"])
    assert spec.tensors == {"image": [1, 3, 224, 224], "ids": [2, 128], "x:0": [5], "s": []}
    assert spec.dims == {"batch": 4, "seq": 16}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("image", "shapes='image': expected NAME:1x3x224x224 for an input or DIM=4"),
        ("image:1x-3", "non-negative integers"),
        ("image:1xx3", "non-negative integers"),
        ("image:axb", "non-negative integers"),
        (":1x2", "missing input name"),
        ("batch=four", "non-negative integer"),
        ("=4", "missing dimension name"),
    ],
)
def test_parse_shape_spec_errors(raw: str, fragment: str) -> None:
    with pytest.raises(InputSpecError) as err:
        parse_shape_specs([raw])
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_shape_spec_duplicate() -> None:
    with pytest.raises(InputSpecError, match="^shapes='x:2': input 'x' given twice$"):
        parse_shape_specs(["x:1", "x:2"])
    with pytest.raises(InputSpecError, match="^shapes='batch=2': dimension 'batch' given twice$"):
        parse_shape_specs(["batch=1", "batch=2"])


# ---- make_inputs: synthesized ----------------------------------------------------------------------------------


def test_ids_stay_in_vocab_and_mask_is_ones() -> None:
    feeds = make_inputs(embedding_model(), parse_shape_specs(["batch=3", "sequence=200"]), seed=5)
    assert set(feeds) == {"input_ids", "token_type_ids", "attention_mask"}
    ids = feeds["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (3, 200)
    assert ids.min() >= 0 and ids.max() < VOCAB
    assert ids.max() >= 8  # sampled over the whole table, not the [0, 8) fallback
    types = feeds["token_type_ids"]
    assert set(np.unique(types)) <= {0, 1}
    assert np.array_equal(feeds["attention_mask"], np.ones((3, 200), dtype=np.int64))


def test_default_dims_batch_and_sequence() -> None:
    feeds = make_inputs(embedding_model())
    assert feeds["input_ids"].shape == (2, 32)
    assert feeds["attention_mask"].shape == (2, 32)


def test_seed_is_deterministic_and_matters() -> None:
    model = embedding_model()
    a = make_inputs(model, seed=0)["input_ids"]
    b = make_inputs(model, seed=0)["input_ids"]
    c = make_inputs(model, seed=1)["input_ids"]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_smallest_gather_bound_wins() -> None:
    small = numpy_helper.from_array(np.zeros((5, 2), dtype=np.float32), "small")
    nodes = [
        helper.make_node(
            "Constant", [], ["big"], value=numpy_helper.from_array(np.zeros((100, 2), np.float32))
        ),
        helper.make_node("Gather", ["big", "ids"], ["a"]),
        helper.make_node("Flatten", ["ids"], ["flat"], axis=0),
        helper.make_node("Gather", ["small", "flat"], ["b"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 64])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
        ],
        [small],
    )
    ids = make_inputs(model)["ids"]
    assert ids.shape == (4, 64)
    assert ids.min() >= 0 and ids.max() < 5


def test_ids_read_by_a_fused_embedding_stay_inside_its_tables() -> None:
    """An optimized BERT reads its ids in com.microsoft.EmbedLayerNormalization, not in Gathers: the word and
    segment tables (inputs 2 and 4) still bound the synthesized ids, so the model runs."""
    tables = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in
              (("word", (30, 4)), ("pos", (64, 4)), ("seg", (2, 4)), ("gamma", (4,)), ("beta", (4,)))]
    node = helper.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "gamma", "beta"],
                            ["y", "mask_index"], domain="com.microsoft")
    model = _model([node], [helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 16]),
                            helper.make_tensor_value_info("segs", TensorProto.INT32, [2, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], tables)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    feeds = make_inputs(model)
    assert feeds["ids"].max() < 30 and feeds["segs"].max() < 2


def test_gather_axis_one_bound() -> None:
    table = numpy_helper.from_array(np.zeros((200, 3), dtype=np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "idx"], ["y"], axis=1)]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table],
    )
    idx = make_inputs(model)["idx"]
    assert idx.max() < 3


def test_special_int_names_bool_and_float() -> None:
    nodes = [
        helper.make_node("Identity", [n], [n + "_o"]) for n in ("position_ids", "sr", "flag", "x", "other")
    ]
    inputs = [
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [2, "seq_len"]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, [3]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 1000]),
        helper.make_tensor_value_info("other", TensorProto.INT32, [1000]),
    ]
    outputs = [
        helper.make_tensor_value_info(n.name + "_o", n.type.tensor_type.elem_type, None) for n in inputs
    ]
    feeds = make_inputs(_model(nodes, inputs, outputs))
    assert np.array_equal(feeds["position_ids"], np.tile(np.arange(32), (2, 1)))
    assert feeds["sr"].shape == () and int(feeds["sr"]) == 16000
    assert feeds["flag"].dtype == np.bool_ and feeds["flag"].all()
    x = feeds["x"]
    assert x.dtype == np.float16 and abs(float(x.astype(np.float32).std()) - 1.0) < 0.1
    other = feeds["other"]
    assert other.dtype == np.int32 and other.min() >= 0 and other.max() < 8


def test_image_defaults_and_initializer_inputs_skipped() -> None:
    model = image_model()
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 3, 1, 1]))
    feeds = make_inputs(model)
    assert list(feeds) == ["image"]
    assert feeds["image"].shape == (2, 3, 224, 224)
    assert feeds["image"].dtype == np.float32


def test_tensor_spec_binds_shared_dims() -> None:
    feeds = make_inputs(embedding_model(), parse_shape_specs(["input_ids:2x7"]))
    assert feeds["input_ids"].shape == (2, 7)
    assert feeds["attention_mask"].shape == (2, 7)  # shares 'batch'/'sequence' with input_ids


def test_tensor_spec_wins_over_named_dim_for_its_tensor() -> None:
    feeds = make_inputs(embedding_model(), parse_shape_specs(["input_ids:2x7", "sequence=9"]))
    assert feeds["input_ids"].shape == (2, 7)
    assert feeds["attention_mask"].shape == (2, 9)


def test_named_dim_spec() -> None:
    feeds = make_inputs(image_model(), parse_shape_specs(["height=10", "N=2"]))
    assert feeds["image"].shape == (2, 3, 10, 224)


def test_tensor_spec_rank_mismatch() -> None:
    with pytest.raises(InputSpecError, match=r"--shape image:1x3x8 has rank 3, the model input has rank 4"):
        make_inputs(image_model(), parse_shape_specs(["image:1x3x8"]))


def test_tensor_spec_fixed_dim_mismatch() -> None:
    with pytest.raises(InputSpecError, match=r"at dim 1 \(fixed to 3\)"):
        make_inputs(image_model(), parse_shape_specs(["image:1x4x8x8"]))


def test_tensor_spec_unknown_input_lists_real_names() -> None:
    with pytest.raises(InputSpecError) as err:
        make_inputs(embedding_model(), parse_shape_specs(["ids:1x2"]))
    msg = str(err.value)
    assert "'ids'" in msg and "input_ids, token_type_ids, attention_mask" in msg


def test_unknown_rank_needs_spec() -> None:
    vi = onnx.ValueInfoProto()
    vi.name = "x"
    vi.type.tensor_type.elem_type = TensorProto.FLOAT
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InputSpecError, match="rank of input 'x' is unknown"):
        make_inputs(model)
    assert make_inputs(model, parse_shape_specs(["x:2x3"]))["x"].shape == (2, 3)


# ---- make_inputs: npz --------------------------------------------------------------------------------------------


def _npz(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return str(path)


def _bert_arrays(batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros((batch, seq), np.int64),
        "token_type_ids": np.zeros((batch, seq), np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
    }


def test_npz_roundtrip(tmp_path: Path) -> None:
    arrays = _bert_arrays()
    arrays["input_ids"] = np.arange(10, dtype=np.int32).reshape(2, 5)  # int32 -> int64 is a safe cast
    feeds = make_inputs(embedding_model(), npz_path=_npz(tmp_path, **arrays))
    assert feeds["input_ids"].dtype == np.int64
    assert np.array_equal(feeds["input_ids"], np.arange(10).reshape(2, 5))


def test_npz_missing_input(tmp_path: Path) -> None:
    arrays = _bert_arrays()
    del arrays["attention_mask"]
    with pytest.raises(InputSpecError, match="missing array for model input 'attention_mask'"):
        make_inputs(embedding_model(), npz_path=_npz(tmp_path, **arrays))


def test_npz_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match="array 'pixel_values' is not a model input"):
        make_inputs(embedding_model(), npz_path=_npz(tmp_path, pixel_values=np.zeros(3), **_bert_arrays()))


def test_npz_wrong_dtype(tmp_path: Path) -> None:
    arrays = _bert_arrays()
    arrays["input_ids"] = arrays["input_ids"].astype(np.float32)
    with pytest.raises(InputSpecError, match="input 'input_ids' has dtype float32, the model expects int64"):
        make_inputs(embedding_model(), npz_path=_npz(tmp_path, **arrays))


def test_npz_wrong_rank(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match=r"input 'image' has rank 3 .*expects rank 4"):
        make_inputs(image_model(), npz_path=_npz(tmp_path, image=np.zeros((3, 8, 8), np.float32)))


def test_npz_wrong_fixed_dim(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match=r"dim 1 must be 3"):
        make_inputs(image_model(), npz_path=_npz(tmp_path, image=np.zeros((1, 4, 8, 8), np.float32)))


def test_npz_inconsistent_symbolic_dims(tmp_path: Path) -> None:
    arrays = _bert_arrays()
    arrays["attention_mask"] = np.ones((2, 6), np.int64)
    with pytest.raises(InputSpecError, match="dimension 'sequence' is 5 in input 'input_ids' but 6"):
        make_inputs(embedding_model(), npz_path=_npz(tmp_path, **arrays))


def test_npz_not_found_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match="inputs file not found"):
        make_inputs(image_model(), npz_path=str(tmp_path / "nope.npz"))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    with pytest.raises(InputSpecError, match="cannot read .npz file"):
        make_inputs(image_model(), npz_path=str(bad))
    npy = tmp_path / "single.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(InputSpecError, match="not an .npz archive"):
        make_inputs(image_model(), npz_path=str(npy))


# ---- compare_outputs --------------------------------------------------------------------------------------------


def _one(ref: np.ndarray, got: np.ndarray, tolerance: Tolerance | None = None) -> OutputCheck:
    [check] = compare_outputs({"y": ref}, {"y": got}, tolerance)
    return check


def test_compare_equal() -> None:
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    check = _one(a, a.copy())
    assert check.passed
    assert check.max_abs == 0.0 and check.min_tolerance == 0.0 and check.cosine == 1.0
    assert check.tolerance == Tolerance(1e-4, 1e-4)
    assert check.dtype == "float32" and check.shape == (2, 3) and check.note == ""


def test_compare_all_zero_cosine_is_one() -> None:
    z = np.zeros(4, np.float32)
    assert _one(z, z.copy()).cosine == 1.0


def test_compare_slightly_different() -> None:
    ref = np.array([1.0, 2.0, 0.0, -4.0], np.float32)
    got = ref + np.array([0.0, 1e-5, 5e-5, 0.0], np.float32)
    check = _one(ref, got)
    assert check.passed
    assert check.max_abs == pytest.approx(5e-5, rel=1e-2)
    assert check.min_tolerance == pytest.approx(5e-5, rel=1e-2)
    assert check.cosine > 0.999999

    worse = ref + np.array([0.0, 0.0, 0.0, 1e-2], np.float32)
    check = _one(ref, worse)
    assert not check.passed
    assert check.max_rel == pytest.approx(2.5e-3, rel=1e-2)
    assert "exceeds" in check.note
    assert _one(ref, worse, Tolerance(rtol=1e-2, atol=1e-2)).passed


def test_compare_fp16_default_tolerance() -> None:
    ref = np.array([1.0, 2.0], np.float16)
    got = np.array([1.005, 2.0], np.float16)
    check = _one(ref, got)
    assert check.tolerance == Tolerance(1e-2, 1e-2) and check.passed


def test_compare_nan_in_reference_same_positions() -> None:
    ref = np.array([np.nan, 1.0, np.inf, 2.0], np.float32)
    got = np.array([np.nan, 1.0, np.inf, 2.0 + 1e-6], np.float32)
    check = _one(ref, got)
    assert check.passed
    assert check.ref_nan == 2 and check.new_nan == 0
    assert "original output already contains 2 NaN" in check.note
    assert np.isfinite(check.cosine) and check.cosine > 0.9999


def test_compare_nan_in_reference_but_finite_in_optimized_fails() -> None:
    check = _one(np.array([np.nan, 1.0], np.float32), np.array([0.0, 1.0], np.float32))
    assert not check.passed and "finite at 1" in check.note


def test_compare_new_nan() -> None:
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    got = np.array([1.0, np.nan, np.inf], np.float32)
    check = _one(ref, got)
    assert not check.passed
    assert check.new_nan == 2 and check.ref_nan == 0
    assert "2 new NaN" in check.note


def test_compare_shape_and_dtype_mismatch_and_missing() -> None:
    check = _one(np.zeros((1, 4), np.float32), np.zeros((1, 5), np.float32))
    assert not check.passed and check.note == "shape mismatch (1, 4) vs (1, 5)"
    check = _one(np.zeros(3, np.float32), np.zeros(3, np.float64))
    assert not check.passed and "dtype mismatch float32 vs float64" in check.note
    checks = compare_outputs({"a": np.zeros(2), "b": np.zeros(2)}, {"a": np.zeros(2), "c": np.zeros(1)})
    by_name = {c.name: c for c in checks}
    assert by_name["a"].passed
    assert not by_name["b"].passed and "missing" in by_name["b"].note
    assert not by_name["c"].passed and "only in the optimized" in by_name["c"].note


def test_compare_integers_exact_even_with_loose_tolerance() -> None:
    ref = np.array([1, 2, 2**62 + 1], np.int64)
    assert _one(ref, ref.copy()).passed
    check = _one(ref, np.array([1, 2, 2**62], np.int64), Tolerance(rtol=1.0, atol=1.0))
    assert not check.passed and check.tolerance == Tolerance(0.0, 0.0)
    assert not _one(np.array([True, False]), np.array([True, True])).passed


# ---- onnxruntime sessions --------------------------------------------------------------------------------------


def test_two_levels_agree(tmp_path: Path) -> None:
    path = _save(image_model(), tmp_path)
    feeds = make_inputs(onnx.load(path), parse_shape_specs(["N=2"]), seed=3)
    ref = run(make_session(path, level="disable"), feeds)
    got = run(make_session(path, level="all", threads=2), feeds)
    assert list(ref) == ["out"] and ref["out"].shape == (2, 3)
    expected = (np.maximum(feeds["image"], 0) + 0.5).mean(axis=(2, 3))
    np.testing.assert_allclose(ref["out"], expected, rtol=1e-5)
    checks = compare_outputs(ref, got)
    assert [c.passed for c in checks] == [True]


def test_embedding_model_runs(tmp_path: Path) -> None:
    path = _save(embedding_model(), tmp_path)
    feeds = make_inputs(onnx.load(path), parse_shape_specs(["sequence=300"]))
    out = run(make_session(path, level="extended"), feeds)["out"]
    assert out.shape == (2, 300, HIDDEN) and np.isfinite(out).all()


def test_run_feed_errors(tmp_path: Path) -> None:
    session = make_session(_save(image_model(), tmp_path))
    good = np.zeros((1, 3, 4, 4), np.float32)
    with pytest.raises(InputSpecError, match=r"dim 1 must be 3"):
        run(session, {"image": np.zeros((1, 2, 4, 4), np.float32)})
    with pytest.raises(InputSpecError, match="dtype float64, the model expects float32"):
        run(session, {"image": good.astype(np.float64)})
    with pytest.raises(InputSpecError, match="no value for model input 'image'"):
        run(session, {})
    with pytest.raises(InputSpecError, match="'extra' is not a model input"):
        run(session, {"image": good, "extra": good})


def test_run_failure_inside_graph_is_input_spec_error(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "y"], ["z"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["a"]) for n in ("x", "y")]
    path = _save(
        _model(nodes, inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)]), tmp_path
    )
    session = make_session(path)
    with pytest.raises(InputSpecError) as err:
        run(session, {"x": np.ones(3, np.float32), "y": np.ones(4, np.float32)})
    assert str(err.value).startswith("onnxruntime failed to run the model: [ONNXRuntimeError]")
    assert "\n" not in str(err.value)


def test_make_session_errors(tmp_path: Path) -> None:
    path = _save(image_model(), tmp_path)
    with pytest.raises(OnnxfuseError, match="unknown optimization level 'max'"):
        make_session(path, level="max")
    with pytest.raises(OnnxfuseError, match="provider='tpu': expected one of the registered targets: cpu, cuda"):
        make_session(path, provider="tpu")
    with pytest.raises(ModelError, match="model file not found"):
        make_session(str(tmp_path / "missing.onnx"))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage bytes")
    with pytest.raises(ModelError) as err:
        make_session(str(bad))
    assert "onnxruntime cannot load" in str(err.value) and "\n" not in str(err.value)


def test_cuda_unavailable_message(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA provider is installed")
    with pytest.raises(OnnxfuseError, match="CUDA execution provider not available"):
        make_session(_save(image_model(), tmp_path), provider="cuda")


def test_shape_spec_dataclass_default() -> None:
    assert ShapeSpec() == ShapeSpec(tensors={}, dims={})


def test_bfloat16_inputs_and_tolerance() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4, 8])],
    )
    x = make_inputs(model)["x"]
    assert x.dtype.name == "bfloat16" and x.shape == (4, 8)
    check = _one(x, x.copy())
    assert check.passed and check.tolerance == Tolerance(1e-2, 1e-2)
    shifted = (x.astype(np.float32) + 0.5).astype(x.dtype)
    assert not _one(x, shifted).passed
