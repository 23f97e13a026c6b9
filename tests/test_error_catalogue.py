"""The error catalogue (docs/errors.md): every hostile input gives one clear line on stderr, a non-zero exit
code, no traceback, and no output file."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import MODELS, make_model, save

CNN = os.path.join(MODELS, "cnn_small.onnx")
OUT = "out.onnx"


def relu_model(tmp, **kw):
    return save(make_model([oh.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("y", [2])], **kw),
                tmp / "m.onnx")


def external_model(tmp):
    d = tmp / "src"
    d.mkdir()
    w = np.ones((4, 3, 3, 3), np.float32)
    m = make_model([oh.make_node("Conv", ["x", "w"], ["c"], name="conv"), oh.make_node("Relu", ["c"], ["y"])],
                   [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], {"w": w}, opset=13)
    onnx.save(m, str(d / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    return d / "m.onnx"


def _write(path, data: bytes | str):
    (path.write_text if isinstance(data, str) else path.write_bytes)(data)
    return str(path)


def _proto_edit(tmp, edit):
    m = make_model([oh.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("y", [2])])
    edit(m)
    return _write(tmp / "m.onnx", m.SerializeToString())


def _ext_edit(tmp, edit):
    p = external_model(tmp)
    edit(p)
    return str(p)


def _set_location(p, loc):
    _set_external(p, "location", loc)


def _set_external(p, key, value):
    m = onnx.load(str(p), load_external_data=False)
    for t in m.graph.initializer:
        field = next((e for e in t.external_data if e.key == key), None) or t.external_data.add()
        field.key, field.value = key, value
    p.write_bytes(m.SerializeToString())


def _pattern(tmp, text):
    return ["--patterns", _write(tmp / "p.yaml", text)]


GOOD_RULE = "rules:\n- id: r\n  match:\n    Y: Relu(X)\n  rewrite:\n    Y: Relu(X)\n"
SHARED_BAD = ("rules:\n- id: r\n  match:\n    n: Neg(X)\n    s: Sigmoid(n)\n    Y: Mul(s, n)\n"
              "  where:\n    s: {shared: true}\n  rewrite:\n    Y: X\n")

# (case id, builds argv after `optimize` from tmp_path, stderr fragment, exit code)
CASES = [
    ("empty file", lambda t: [_write(t / "e.onnx", b""), OUT], "empty file", 1),
    ("truncated protobuf", lambda t: [_write(t / "t.onnx", open(CNN, "rb").read()[:5000]), OUT],
     "not a valid ONNX model", 1),
    ("not an ONNX file", lambda t: [_write(t / "n.onnx", "name,value\n1,2\n"), OUT], "not a valid ONNX", 1),
    ("a directory", lambda t: [str(t), OUT], "is a directory", 1),
    ("missing file", lambda t: [str(t / "nope.onnx"), OUT], "no such file", 1),
    ("external data missing", lambda t: [_ext_edit(t, lambda p: os.unlink(p.parent / "m.data")), OUT],
     "external data file 'm.data' for tensor 'w' is missing", 1),
    ("external data truncated",
     lambda t: [_ext_edit(t, lambda p: (p.parent / "m.data").write_bytes(b"\0" * 10)), OUT], "is truncated", 1),
    ("external data outside the folder", lambda t: [_ext_edit(t, lambda p: _set_location(p, "../../etc/passwd")), OUT],
     "outside the model's folder (refused)", 1),
    ("external data absolute path", lambda t: [_ext_edit(t, lambda p: _set_location(p, "/etc/passwd")), OUT],
     "outside the model's folder (refused)", 1),
    ("external data offset not a number", lambda t: [_ext_edit(t, lambda p: _set_external(p, "offset", "abc")), OUT,
                                                     "--no-validate"],
     "tensor 'w' has external data offset 'abc': not a non-negative integer", 1),
    ("external data offset negative", lambda t: [_ext_edit(t, lambda p: _set_external(p, "offset", "-4096")), OUT,
                                                 "--no-validate"],
     "tensor 'w' has external data offset '-4096': not a non-negative integer", 1),
    ("external data offset past the end", lambda t: [_ext_edit(t, lambda p: _set_external(p, "offset", "4096")), OUT,
                                                     "--no-validate"],
     "external data file 'm.data' is truncated (tensor 'w' needs bytes 4096..4528, file has 432)", 1),
    ("external data length not a number", lambda t: [_ext_edit(t, lambda p: _set_external(p, "length", "-5")), OUT,
                                                     "--no-validate"],
     "tensor 'w' has external data length '-5': not a non-negative integer", 1),
    ("external data length other than the tensor's size",
     lambda t: [_ext_edit(t, lambda p: _set_external(p, "length", "400")), OUT, "--no-validate"],
     "tensor 'w' has external data length 400, but its type and dims need 432 bytes", 1),
    ("external data location with a NUL byte",
     lambda t: [_ext_edit(t, lambda p: _set_location(p, "m.da\0ta")), OUT, "--no-validate"],
     "tensor 'w' has external data location 'm.da\\x00ta': it contains a NUL byte", 1),
    ("external data location empty", lambda t: [_ext_edit(t, lambda p: _set_location(p, "")), OUT, "--no-validate"],
     "tensor 'w' has external data without a location", 1),
    ("external data location a folder",
     lambda t: [_ext_edit(t, lambda p: [(p.parent / "sub").mkdir(), _set_location(p, "sub")]), OUT, "--no-validate"],
     "external data file 'sub' for tensor 'w' is not a regular file", 1),
    ("external data escaping through the folder", lambda t: [_ext_edit(t, lambda p: _set_location(p, "../x")), OUT,
                                                            "--no-validate"],
     "tensor 'w' has external data location '../x' outside the model's folder (refused)", 1),
    ("opset newer than onnx",
     lambda t: [_proto_edit(t, lambda m: setattr(m.opset_import[0], "version", onnx.defs.onnx_opset_version() + 3)),
                OUT], "newer than the installed onnx", 1),
    ("unknown domain without schema", lambda t: [_custom_domain_model(t), OUT],
     "ops with no known schema (my.custom:Foo)", 1),
    ("graph with a cycle", lambda t: [save(make_model(
        [oh.make_node("Add", ["x", "b"], ["a"]), oh.make_node("Relu", ["a"], ["b"]),
         oh.make_node("Relu", ["a"], ["y"])], [("x", [2])], [("y", [2])]), t / "c.onnx"), OUT], "has a cycle", 1),
    ("duplicate output names", lambda t: [save(make_model(
        [oh.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2]), ("y", [2])]), t / "d.onnx"), OUT],
     "graph output 'y' is listed twice", 1),
    ("input nothing produces", lambda t: [save(make_model(
        [oh.make_node("Add", ["x", "ghost"], ["y"])], [("x", [2])], [("y", [2])]), t / "g.onnx"), OUT],
     "reads 'ghost', which nothing produces", 1),
    ("output folder missing", lambda t: [CNN, str(t / "no" / "o.onnx")], "does not exist", 1),
    ("output equals input", lambda t: [relu_model(t), str(t / "m.onnx")], "refusing to overwrite", 1),
    ("report is the input model", lambda t: [relu_model(t), OUT, "--html", "m.onnx"],
     "--html m.onnx: is the input model ", 1),
    ("report is the output model", lambda t: [CNN, OUT, "--html", OUT],
     "--html out.onnx: is the output model out.onnx; the report would replace it", 1),
    ("report folder missing", lambda t: [CNN, OUT, "--html", "no/r.html"], "--html no/r.html: folder ", 1),
    ("report path is a directory", lambda t: [CNN, OUT, "--html", "."],
     "--html .: is a directory, expected a report file path", 1),
    ("output's data file is the input's external data", lambda t: [_ext_named(t, "out.onnx.data"), OUT],
     "out.onnx: the output's data file ", 1),
    ("output is the input's external data file", lambda t: [_ext_named(t, "w.bin"), "w.bin"],
     "w.bin: the output is the external data of the input model", 1),
    ("malformed YAML", lambda t: [CNN, OUT, *_pattern(t, "rules:\n- id: x\n  match: [\n")], "p.yaml:4:1: error: YAML", 1),
    ("pattern unknown op", lambda t: [CNN, OUT, *_pattern(t, GOOD_RULE.replace("Y: Relu(X)\n  rewrite", "Y: Rellu(X)\n  rewrite"))],
     "p.yaml:4:8: error: unknown operator 'Rellu'", 1),
    ("pattern wrong arity", lambda t: [CNN, OUT, *_pattern(t, GOOD_RULE.replace("Relu(X)\n  rewrite", "Relu(X, X)\n  rewrite"))],
     "p.yaml:4:8: error: Relu takes 1 inputs, got 2", 1),
    ("pattern undefined name", lambda t: [CNN, OUT, *_pattern(t, GOOD_RULE.replace("    Y: Relu(X)\n", "    Y: Relu(Z)\n", 1)
                                                              .replace("rewrite:\n    Y: Relu(X)", "rewrite:\n    Y: Relu(X)"))],
     "p.yaml:6:13: error: undefined name 'X' in rewrite", 1),
    ("pattern constraint of the wrong type", lambda t: [CNN, OUT, *_pattern(t, GOOD_RULE.replace(
        "  rewrite", "  where:\n    X: {rank: two}\n  rewrite"))], "p.yaml:6:15: error: 'rank' must be", 1),
    ("pattern file missing", lambda t: [CNN, OUT, "--patterns", str(t / "none.yaml")], "no such pattern file", 1),
    ("--shape for an input that does not exist", lambda t: [CNN, OUT, "--shape", "image:1x3x32x32"], "image", 1),
    ("--shape with the wrong rank", lambda t: [CNN, OUT, "--shape", "x:1x3x32"], "x", 1),
    ("--inputs file missing", lambda t: [CNN, OUT, "--inputs", str(t / "none.npz")], "none.npz", 1),
    ("--inputs with a wrong name", lambda t: [CNN, OUT, "--inputs", _npz(t, image=np.zeros((1, 3, 32, 32), np.float32))],
     "image", 1),
    ("--inputs declaring more than the memory budget",
     lambda t: [CNN, OUT, "--inputs", _npz_declaring(t, (1 << 24, 3, 32, 32))],
     "in.npz: array 'x' declares shape (16777216, 3, 32, 32) float32 (192.0 GB), more than the memory budget "
     "leaves for it (", 1),
    ("--inputs declaring a shape the model cannot take",
     lambda t: [CNN, OUT, "--inputs", _npz_declaring(t, (1 << 20, 1 << 20))],
     "in.npz: input 'x' has rank 2 (shape (1048576, 1048576)), the model expects rank 4 [batch, 3, 32, 32]", 1),
    ("--inputs array holding objects",
     lambda t: [CNN, OUT, "--inputs", _npz_declaring(t, (1, 3, 32, 32), "|O")],
     "in.npz: array 'x' holds Python objects (object), not numbers", 1),
    ("unknown flag", lambda t: [CNN, OUT, "--fast"], "No such option: --fast", 2),
    ("bad flag value", lambda t: [CNN, OUT, "--target", "tpu"], "--target tpu: expected one of the registered targets: cpu, cuda, openvino", 1),
    ("unknown rule id", lambda t: [CNN, OUT, "--skip", "nope"], "--skip nope: no rule with that id", 1),
    ("--static without every dim", lambda t: [CNN, OUT, "--static"],
     "fixing the input shapes (static) needs a value for every dynamic input dim; missing: x[0] (batch)", 1),
    ("pattern shared line reads a removed one", lambda t: [CNN, OUT, *_pattern(t, SHARED_BAD)],
     "shared line 's' reads line 'n', which is not shared", 1),
]


def _ext_named(t, location):
    """m.onnx in the working folder, its weights in `location` beside it."""
    m = make_model([oh.make_node("Conv", ["x", "w"], ["c"], name="conv"), oh.make_node("Relu", ["c"], ["y"])],
                   [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], {"w": np.ones((4, 3, 3, 3), np.float32)}, opset=13)
    onnx.save(m, str(t / "m.onnx"), save_as_external_data=True, location=location, size_threshold=0)
    return str(t / "m.onnx")


def _custom_domain_model(t):
    m = make_model([oh.make_node("Foo", ["x"], ["y"], domain="my.custom")], [("x", [2])], [("y", [2])])
    m.opset_import.append(oh.make_opsetid("my.custom", 1))
    return save(m, t / "u.onnx")


def _npz_declaring(t, shape, dtype="<f4"):
    """An .npz whose one array's header declares `shape` but holds no data (a 192 GB header is 128 bytes)."""
    import io
    import zipfile

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": dtype, "fortran_order": False, "shape": shape})
    p = t / "in.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", head.getvalue())
    return str(p)


def _npz(t, **arrays):
    p = t / "in.npz"
    np.savez(p, **arrays)
    return str(p)


@pytest.mark.parametrize("case,argv,fragment,code", CASES, ids=[c[0] for c in CASES])
def test_catalogue(cli, tmp_path, monkeypatch, case, argv, fragment, code):
    monkeypatch.chdir(tmp_path)
    args = argv(tmp_path)
    before = set(os.listdir(tmp_path))
    got_code, _, stderr = cli("optimize", *args)
    assert got_code == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / OUT).exists()
    assert {p for p in os.listdir(tmp_path) if p.startswith(".onnxfuse-")} == set()
    assert set(os.listdir(tmp_path)) == before


def test_unreadable_file(cli, tmp_path, monkeypatch):
    path = relu_model(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == path else real(p, mode, **k))
    code, _, stderr = cli("optimize", path, tmp_path / "o.onnx")
    assert code == 1 and stderr.strip() == f"onnxfuse: error: {path}: permission denied"


def test_unwritable_output_folder(cli, tmp_path, monkeypatch):
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(out_dir) and mode == os.W_OK
                        else real(p, mode, **k))
    code, _, stderr = cli("optimize", CNN, out_dir / "o.onnx")
    assert code == 1 and "is not writable" in stderr and os.listdir(out_dir) == []


def test_ctrl_c_midway(cli, tmp_path, monkeypatch):
    import onnxfuse.rewrite.engine as E

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(E, "apply_match", interrupted)
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx")
    assert code == 130 and stderr.strip() == "onnxfuse: interrupted; nothing written"
    assert os.listdir(tmp_path) == []


def test_pattern_producing_invalid_graph_is_caught_before_writing(cli, tmp_path):
    rules = tmp_path / "bad.yaml"
    rules.write_text("rules:\n- id: bad\n  match:\n    Y: Relu(X)\n  rewrite:\n    Y: com.microsoft.FusedConv(X, X)\n")
    src = relu_model(tmp_path)
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx", "--patterns", rules, "--no-builtin")
    assert code == 0, stderr
    assert "rolled back" in stdout and "bad" in stdout
    assert [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node] == ["Relu"]


def test_original_output_already_nan(cli, tmp_path):
    """NaN from the model itself is reported, not blamed on the rewrite."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], name="conv"), oh.make_node("Relu", ["c"], ["r"], name="relu"),
             oh.make_node("Log", ["x2"], ["y2"], name="log"), oh.make_node("Identity", ["r"], ["y"], name="id")]
    m = make_model(nodes, [("x", [1, 3, 8, 8]), ("x2", [4])], [("y", [1, 4, 6, 6]), ("y2", [4])], {"w": w}, opset=13)
    code, stdout, stderr = cli("optimize", save(m, tmp_path / "nan.onnx"), tmp_path / "o.onnx", "--details")
    assert code == 0, stderr
    assert "validation: passed" in stdout and "NaN" in stdout
    assert "conv-relu" in stdout


def test_catalogue_is_documented():
    doc = open(os.path.join(os.path.dirname(MODELS), "docs", "errors.md")).read()
    for case, *_ in CASES:
        assert f"| {case} |" in doc, case
    assert len(CASES) + 5 >= 25
