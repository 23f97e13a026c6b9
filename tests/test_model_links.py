"""Models reached through links optimize exactly as through their real path: a symbolic link to the file, to its
folder, the Hugging Face hub cache's layout (snapshots/<rev>/model.onnx -> ../../blobs/<sha>, and the same for
the external data), and hard links. Where a link puts the data outside the model file's real folder,
onnxruntime refuses the model and onnxfuse says so, in one line with a hint."""

import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxfuse
from onnxfuse.errors import ModelError
from onnxfuse.load.lazy import LAZY_MIN_BYTES


def _proto(rows: int) -> onnx.ModelProto:
    """MatMul, bias Add and an erf Gelu: a rule fires, so the output differs from the input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((rows, 2048)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(2048).astype(np.float32), "B")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Div", ["a", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, rows])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2048])], [w, b, *consts])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _embedded(folder) -> str:
    """One file whose weights (8 MB) are read lazily from the model file itself."""
    m = _proto(LAZY_MIN_BYTES // (4 * 2048))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(m, path)
    return path


def _external(folder) -> str:
    """model.onnx and model.onnx_data."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(_proto(64), path, save_as_external_data=True, location="model.onnx_data", size_threshold=1024)
    return path


def _optimized(path: str, out_folder) -> dict[str, bytes]:
    """The files optimize writes for `path` (measurement off: it is timing, not rewriting, that varies)."""
    os.makedirs(out_folder)
    result = onnxfuse.optimize(path, os.path.join(out_folder, "out.onnx"),
                               options=onnxfuse.OptimizeOptions(measure=False))
    assert result.fired, "a rule fires: the comparison is of a rewritten model"
    return {f: open(os.path.join(out_folder, f), "rb").read() for f in sorted(os.listdir(out_folder))}


def _hub(real: str, cache) -> str:
    """The hub cache's layout: the model and each data file a blob, named in the snapshot by a relative link."""
    blobs, snap = os.path.join(cache, "blobs"), os.path.join(cache, "snapshots", "0a1b2c")
    os.makedirs(blobs)
    os.makedirs(snap)
    for i, f in enumerate(sorted(os.listdir(os.path.dirname(real)))):
        shutil.copyfile(os.path.join(os.path.dirname(real), f), os.path.join(blobs, f"{i:02d}f3e9"))
        os.symlink(os.path.join("..", "..", "blobs", f"{i:02d}f3e9"), os.path.join(snap, f))
    return os.path.join(snap, "model.onnx")


def _each_file(real: str, folder, link) -> str:
    """Each file of the model's folder made in `folder` by `link(source, destination)`."""
    os.makedirs(folder)
    for f in os.listdir(os.path.dirname(real)):
        link(os.path.join(os.path.dirname(real), f), os.path.join(folder, f))
    return os.path.join(folder, "model.onnx")


def _file_link(real: str, folder) -> str:
    """Each file of the model linked, by an absolute link, into a project folder."""
    return _each_file(real, folder, os.symlink)


def _folder_link(real: str, folder) -> str:
    os.symlink(os.path.dirname(real), folder)
    return os.path.join(folder, "model.onnx")


def _hard_links(real: str, folder) -> str:
    return _each_file(real, folder, os.link)


@pytest.mark.parametrize("make", [_embedded, _external], ids=["weights-read-lazily", "external-data"])
@pytest.mark.parametrize("reach", [_hub, _file_link, _folder_link, _hard_links],
                         ids=["hub-cache", "file-links", "folder-link", "hard-links"])
def test_a_model_through_links_optimizes_byte_for_byte_as_through_its_real_path(tmp_path, make, reach):
    real = make(tmp_path / "real")
    linked = reach(real, str(tmp_path / "linked"))
    assert os.path.realpath(linked) != linked or reach is _hard_links
    want = _optimized(real, tmp_path / "out-real")
    got = _optimized(linked, tmp_path / "out-linked")
    assert got == want


def test_weights_read_lazily_through_a_link_are_read_lazily(tmp_path):
    from onnxfuse.load.loader import load_model

    linked = _hub(_embedded(tmp_path / "real"), str(tmp_path / "cache"))
    _, info = load_model(linked)
    assert info.lazy


def test_data_a_link_places_outside_the_model_files_real_folder_is_refused_in_one_line_as_onnxruntime_does(tmp_path):
    real = _external(tmp_path / "real")
    os.makedirs(tmp_path / "weights")
    os.rename(os.path.join(os.path.dirname(real), "model.onnx_data"), tmp_path / "weights" / "data.bin")
    os.makedirs(tmp_path / "project")
    os.symlink(real, tmp_path / "project" / "model.onnx")
    os.symlink(tmp_path / "weights" / "data.bin", tmp_path / "project" / "model.onnx_data")
    linked = str(tmp_path / "project" / "model.onnx")
    with pytest.raises(Exception, match="escapes model directory"):
        ort.InferenceSession(linked, providers=["CPUExecutionProvider"])
    with pytest.raises(ModelError) as e:
        onnxfuse.optimize(linked, str(tmp_path / "out.onnx"), options=onnxfuse.OptimizeOptions(measure=False))
    assert str(e.value) == (
        f"{linked}: tensor 'W' has external data 'model.onnx_data' that a symbolic link places outside the model "
        f"file's real folder {os.path.dirname(real)} (onnxruntime refuses it too) (hint: link the folder instead "
        "of each file, or put the data file beside the model's real file)")
    assert not os.path.exists(tmp_path / "out.onnx")
