"""Nothing the user had is lost: a report or an output never replaces the input, the output or a data file the
input reads (refused before any work, one line, exit 1); a model and its data file appear as a pair; candidates
and temporary files never land beside the input and are removed on every exit path; a full TMPDIR is one line."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from conftest import make_model, ort_run

from onnxfuse.errors import ModelError, OnnxfuseError

X = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)


def _model(scale: float = 1.0) -> onnx.ModelProto:
    """Conv + BN + Relu (conv-bn-fold and conv-relu fire), weights large enough to go external."""
    rng = np.random.default_rng(0)
    inits = {"w": (scale * rng.standard_normal((32, 16, 3, 3))).astype(np.float32),
             "scale": rng.uniform(0.5, 1.5, 32).astype(np.float32), "bias": rng.standard_normal(32).astype(np.float32),
             "mean": rng.standard_normal(32).astype(np.float32), "var": rng.uniform(0.5, 1.5, 32).astype(np.float32)}
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             oh.make_node("Relu", ["b"], ["y"], name="relu")]
    return make_model(nodes, [("x", [1, 16, 8, 8])], [("y", [1, 32, 8, 8])], inits, opset=13)


def external(folder, name="m.onnx", data="m.data", scale: float = 1.0):
    folder.mkdir(exist_ok=True)
    path = folder / name
    onnx.save(_model(scale), str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=0)
    return path


def snapshot(folder) -> dict[str, tuple[bytes, int, int]]:
    """Every file in `folder`: (bytes, mtime_ns, mode)."""
    out = {}
    for n in sorted(os.listdir(folder)):
        p = os.path.join(folder, n)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[n] = (f.read(), st.st_mtime_ns, st.st_mode)
    return out


def refused(cli, folder, args, message, measure=False):
    """The command exits 1 with one line containing `message`, and nothing in `folder` changed."""
    before = snapshot(folder)
    code, _, err = cli(*args, measure=measure)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert message in err, err
    assert snapshot(folder) == before
    return err


# ---- 1. report paths -----------------------------------------------------------------------------------------


def test_html_onto_the_input_is_refused(cli, tmp_path):
    src = external(tmp_path / "d")
    err = refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--html", src],
                  "is the input model", measure=True)
    assert err.startswith(f"onnxfuse: error: --html {src}: ")
    assert not (tmp_path / "o.onnx").exists()


def test_html_onto_the_inputs_data_file_is_refused(cli, tmp_path):
    src = external(tmp_path / "d")
    refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--html", tmp_path / "d" / "m.data"],
            "is the external data of the input model")


def test_html_onto_the_output_is_refused(cli, tmp_path):
    src = external(tmp_path / "d")
    out = tmp_path / "d" / "o.onnx"
    refused(cli, tmp_path / "d", ["optimize", src, out, "--html", out], "is the output model", measure=True)
    refused(cli, tmp_path / "d", ["optimize", src, out, "--html", str(out) + ".data"], "is the data file of the output")
    assert not out.exists()


def test_html_onto_an_existing_output_keeps_it(cli, tmp_path):
    src = external(tmp_path / "d")
    out = tmp_path / "o" / "o.onnx"
    out.parent.mkdir()
    out.write_bytes(b"an earlier output")
    refused(cli, tmp_path / "o", ["optimize", src, out, "--html", out], "is the output model")


def test_html_through_a_hard_link_to_the_input_is_refused(cli, tmp_path):
    src = external(tmp_path / "d")
    link = tmp_path / "report.html"
    os.link(src, link)
    refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--html", link], "is the input model")


def test_html_onto_the_inputs_npz_is_refused(cli, tmp_path):
    src = external(tmp_path / "d")
    npz = tmp_path / "d" / "in.npz"
    np.savez(npz, x=X)
    refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--inputs", npz, "--html", npz],
            "this run reads")


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_bench_and_profile_html_onto_a_model_is_refused(cli, tmp_path, command):
    src = external(tmp_path / "d")
    other = external(tmp_path / "e", "b.onnx", "b.data")
    refused(cli, tmp_path / "d", [command, src, "--html", src], "is the input model")
    refused(cli, tmp_path / "e", [command, src, other, "--html", tmp_path / "e" / "b.data"],
            "is the external data of the input model")


# ---- 4. a report folder that cannot take it: before the run ----------------------------------------------


@pytest.mark.parametrize("case", ["missing", "directory", "file-as-folder", "read-only"])
def test_html_where_it_cannot_be_written_fails_first(cli, tmp_path, case, monkeypatch):
    import onnxfuse.pipeline

    src = external(tmp_path / "d")
    html = {"missing": tmp_path / "no" / "r.html", "directory": tmp_path / "d",
            "file-as-folder": src / "r.html", "read-only": tmp_path / "ro" / "r.html"}[case]
    if case == "read-only":
        html.parent.mkdir()
        html.parent.chmod(0o555)
        if os.access(html.parent, os.W_OK):
            pytest.skip("running as root: permissions do not apply")
    ran = []
    monkeypatch.setattr(onnxfuse.pipeline, "_optimize", lambda *a, **k: ran.append(1))
    expect = {"missing": "does not exist", "directory": "is a directory", "file-as-folder": "is not a folder",
              "read-only": "is not writable"}[case]
    refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--html", html], expect, measure=True)
    assert not ran and not (tmp_path / "o.onnx").exists()


def test_bench_html_into_a_missing_folder_fails_first(cli, tmp_path, monkeypatch):
    import onnxfuse

    src = external(tmp_path / "d")
    monkeypatch.setattr(onnxfuse, "bench", lambda *a, **k: pytest.fail("benchmarked before checking --html"))
    refused(cli, tmp_path / "d", ["bench", src, "--html", tmp_path / "no" / "r.html"], "does not exist")


# ---- 2. outputs onto the input's external data ------------------------------------------------------------


def test_output_whose_data_file_is_the_inputs_data_is_refused(cli, tmp_path):
    d = tmp_path / "d"
    src = external(d, "m.onnx", "out.onnx.data")
    err = refused(cli, d, ["optimize", src, d / "out.onnx"], "is the external data of the input model", measure=True)
    assert "out.onnx.data" in err
    assert not (d / "out.onnx").exists()
    np.testing.assert_allclose(ort_run(src, {"x": X})[0], ort_run(_model(), {"x": X})[0], rtol=1e-6)


def test_output_that_is_the_inputs_data_file_is_refused(cli, tmp_path):
    d = tmp_path / "d"
    src = external(d)
    refused(cli, d, ["optimize", src, d / "m.data"], "is the external data of the input model")
    refused(cli, d, ["optimize", src, d / "m.data", "--force"], "is the external data of the input model")


def test_output_hard_linked_to_the_inputs_data_is_refused(cli, tmp_path):
    d = tmp_path / "d"
    src = external(d)
    (tmp_path / "o").mkdir()
    os.link(d / "m.data", tmp_path / "o" / "x.onnx")
    refused(cli, d, ["optimize", src, tmp_path / "o" / "x.onnx"], "is the external data of the input model")


def test_batch_output_onto_another_inputs_data_is_refused(cli, tmp_path):
    a = external(tmp_path / "a", "a.onnx", "a.data")
    b = external(tmp_path / "b", "b.onnx", "a.onnx.data")  # b's weights are named as a's output data would be
    out = tmp_path / "out"
    out.mkdir()
    os.link(b.parent / "a.onnx.data", out / "a.onnx.data")  # OUTDIR holds (a hard link to) b's weights
    before = snapshot(out), snapshot(tmp_path / "b")
    code, _, err = cli("optimize", a, b, out, "--jobs", "1")
    assert code == 1 and "a.onnx.data is the external data of the input model" in err, err
    assert len(err.strip().splitlines()) == 1
    assert (snapshot(out), snapshot(tmp_path / "b")) == before  # refused before any model was written


def test_force_onto_the_input_itself_still_works(cli, tmp_path):
    d = tmp_path / "d"
    src = external(d, "m.onnx", "m.onnx.data")
    code, _, err = cli("optimize", src, src, "--force")
    assert code == 0, err
    np.testing.assert_allclose(ort_run(src, {"x": X})[0], ort_run(_model(), {"x": X})[0], rtol=1e-4, atol=1e-4)
    assert "Conv" not in [n.op_type for n in onnx.load(str(src), load_external_data=False).graph.node]
    names = sorted(os.listdir(d))  # the old data went with the old model; the new has a name it did not read
    assert len(names) == 2 and names[0] == "m.onnx" and names[1].startswith("m.onnx.") and names[1] != "m.onnx.data"


# ---- 3. the model and its data file as a pair ------------------------------------------------------------


def test_interrupt_between_data_and_model_keeps_the_old_pair(cli, tmp_path, monkeypatch):
    old_src = external(tmp_path / "a", scale=1.0)
    new_src = external(tmp_path / "b", scale=2.0)
    out = tmp_path / "o" / "out.onnx"
    out.parent.mkdir()
    assert cli("optimize", old_src, out)[0] == 0
    old_y = ort_run(out, {"x": X})[0]
    before = snapshot(out.parent)

    real, calls = os.replace, []

    def replace_then_interrupt(a, b):
        calls.append((a, b))
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace_then_interrupt)
    code, _, err = cli("optimize", new_src, out)
    monkeypatch.undo()
    assert code == 130, err
    assert len(calls) == 2  # the data file was renamed into place, the model was not
    assert snapshot(out.parent) == before  # the old pair, whole, and nothing new beside it
    np.testing.assert_array_equal(ort_run(out, {"x": X})[0], old_y)

    assert cli("optimize", new_src, out)[0] == 0  # and then for real: the new pair, the old data gone
    np.testing.assert_allclose(ort_run(out, {"x": X})[0], ort_run(new_src, {"x": X})[0], rtol=1e-4, atol=1e-4)
    names = sorted(os.listdir(out.parent))
    assert len(names) == 2 and names[0] == "out.onnx" and names[1].startswith("out.onnx.")


def test_the_same_model_twice_writes_the_same_bytes(cli, tmp_path):
    src = external(tmp_path / "a")
    out = tmp_path / "o" / "out.onnx"
    out.parent.mkdir()
    assert cli("optimize", src, out)[0] == 0
    first = {n: v[0] for n, v in snapshot(out.parent).items()}
    assert sorted(first) == ["out.onnx", "out.onnx.data"]
    assert cli("optimize", src, out)[0] == 0
    assert {n: v[0] for n, v in snapshot(out.parent).items()} == first


def test_an_unrelated_file_named_like_the_data_is_kept(cli, tmp_path):
    src = external(tmp_path / "a")
    out = tmp_path / "o" / "out.onnx"
    out.parent.mkdir()
    (out.parent / "out.onnx.data").write_bytes(b"the user's own file")
    assert cli("optimize", src, out)[0] == 0
    assert (out.parent / "out.onnx.data").read_bytes() == b"the user's own file"
    np.testing.assert_allclose(ort_run(out, {"x": X})[0], ort_run(src, {"x": X})[0], rtol=1e-4, atol=1e-4)


# ---- 5. candidates never beside the input ------------------------------------------------------------------


def test_candidates_are_not_written_beside_the_input(cli, tmp_path, monkeypatch):
    from onnxfuse.validate import runtime

    d = tmp_path / "d"
    src = external(d)
    before = snapshot(d)
    seen = []
    real = runtime.Candidate._write

    def spy(self, *args):
        real(self, *args)
        seen.append((self.source, sorted(os.listdir(d))))

    monkeypatch.setattr(runtime.Candidate, "_write", spy)
    code, _, err = cli("optimize", src, tmp_path / "o.onnx", measure=True)
    assert code == 0, err
    assert seen and all(not str(s).startswith(str(d)) and names == sorted(before) for s, names in seen)
    assert snapshot(d) == before


def test_a_run_that_fails_midway_leaves_no_candidate(cli, tmp_path, monkeypatch):
    import tempfile

    from onnxfuse.validate import validate

    d = tmp_path / "d"
    src = external(d)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    before = snapshot(d)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(validate, "make_session", boom)  # while a candidate exists
    code, _, err = cli("optimize", src, tmp_path / "o.onnx")
    assert code == 130, err
    assert snapshot(d) == before and not (tmp_path / "o.onnx").exists()
    assert os.listdir(tmp) == []


# ---- 6. a full TMPDIR --------------------------------------------------------------------------------------


def test_no_space_for_a_candidate_is_one_line_and_leaves_nothing(cli, tmp_path, monkeypatch):
    import tempfile

    from onnxfuse.validate import runtime

    d = tmp_path / "d"
    d.mkdir()
    onnx.save(_model(), str(d / "m.onnx"))  # embedded: candidates are split into a .weights side file
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    real_open = open

    def full_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if str(path).endswith(".weights") and "w" in mode:
            f.write(b"partial")
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr(runtime, "open", full_open, raising=False)
    before = snapshot(d)
    code, _, err = cli("optimize", d / "m.onnx", tmp_path / "o.onnx")
    assert code == 1, err
    assert err.strip() == (f"onnxfuse: error: no space left in TMPDIR={tmp}: cannot write a candidate model "
                           "(No space left on device) (hint: free space there, or set TMPDIR to a folder with more)")
    assert os.listdir(tmp) == [] and snapshot(d) == before and not (tmp_path / "o.onnx").exists()


def test_nchwc_probe_with_no_space_is_one_line(cli, tmp_path, monkeypatch):
    import onnxruntime as ort

    from onnxfuse import targets

    monkeypatch.delenv(targets.NCHWC_ENV, raising=False)
    targets._probe_nchwc.cache_clear()

    def full(*a, **k):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Error writing probe.onnx: No space left on device")

    monkeypatch.setattr(ort, "InferenceSession", full)
    with pytest.raises(OnnxfuseError, match=r"^no space left in TMPDIR=.*: cannot write onnxruntime's optimized"):
        targets._probe_nchwc()
    targets._probe_nchwc.cache_clear()


def test_html_write_failure_leaves_no_partial_report(tmp_path, monkeypatch):
    from onnxfuse.inspect import html_report

    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(OnnxfuseError, match="cannot write the report"):
        html_report.write(str(tmp_path / "r.html"), "<html></html>")
    monkeypatch.setattr(os, "replace", real)
    assert os.listdir(tmp_path) == []


def test_writer_refuses_nothing_it_should_not(tmp_path):
    from onnxfuse.load.collisions import check_writes

    src = external(tmp_path / "d")
    check_writes([(str(src), str(tmp_path / "d" / "o.onnx"))])  # nothing there yet: fine
    with pytest.raises(ModelError, match="is the external data"):
        check_writes([(str(src), str(tmp_path / "d" / "m.data"))])


def test_no_space_for_the_static_copy_is_one_line(cli, tmp_path, monkeypatch):
    import onnxfuse.pipeline

    src = external(tmp_path / "d")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(onnxfuse.pipeline, "fix_input_shapes", full)
    err = refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx", "--static", "--shape", "x:1x16x8x8"],
                  "cannot write the copy with fixed input shapes (No space left on device)", measure=True)
    assert err.startswith("onnxfuse: error: no space left in TMPDIR=")


def test_no_space_in_a_temporary_folder_of_onnxruntime_is_one_line(cli, tmp_path, monkeypatch):
    """An ENOSPC no step words itself (onnxruntime's profile or optimized graph in a temporary folder) is still
    one line naming TMPDIR, exit 1, never an internal error."""
    import tempfile

    import onnxfuse.pipeline

    src = external(tmp_path / "d")
    where = os.path.join(tempfile.gettempdir(), "onnxfuse-ort-x", "optimized.onnx")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)

    monkeypatch.setattr(onnxfuse.pipeline, "_optimize", full)
    err = refused(cli, tmp_path / "d", ["optimize", src, tmp_path / "o.onnx"], f"cannot write {where}")
    assert err.startswith(f"onnxfuse: error: no space left in TMPDIR={tempfile.gettempdir()}: ")


def test_session_writing_into_a_full_tmpdir_is_no_space_not_a_bad_model(tmp_path, monkeypatch):
    import onnxruntime as ort

    from onnxfuse.validate.runtime import make_session

    onnx.save(_model(), str(tmp_path / "m.onnx"))

    def full(*a, **k):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : write failed: No space left on device")

    monkeypatch.setattr(ort, "InferenceSession", full)
    with pytest.raises(OnnxfuseError, match=r"^no space left in TMPDIR=.*onnxruntime's optimized model"):
        make_session(str(tmp_path / "m.onnx"), "all", optimized_path=str(tmp_path / "opt.onnx"))


@pytest.mark.parametrize("name", ["big.onnx", "candidate.onnx"])
def test_lazily_read_weights_are_linked_into_tmpdir_not_written_beside(cli, tmp_path, monkeypatch, name):
    """A model with >= 8 MB of embedded weights is read lazily: its candidates reference the model file itself,
    through a hard link in the candidate's own temporary folder (whatever the model is called)."""
    from onnxfuse.load.lazy import link_folder
    from onnxfuse.validate import runtime

    d = tmp_path / "d"
    d.mkdir()
    w = np.random.default_rng(0).standard_normal((512, 512, 3, 3)).astype(np.float32)  # 9.4 MB
    m = make_model([oh.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                    oh.make_node("Relu", ["c"], ["y"], name="relu")],
                   [("x", [1, 512, 4, 4])], [("y", [1, 512, 4, 4])], {"w": w}, opset=13)
    onnx.save(m, str(d / name))
    if link_folder(str(d / name)) != tempfile.gettempdir():
        pytest.skip("TMPDIR is on another file system: the candidates are made beside the input")
    before = snapshot(d)
    seen = []
    real = runtime.Candidate._write

    def spy(self, proto, locations, src_dir):
        real(self, proto, locations, src_dir)
        seen.append((bool(locations), str(self.source), os.stat(d / name).st_nlink, sorted(os.listdir(d))))

    monkeypatch.setattr(runtime.Candidate, "_write", spy)
    code, _, err = cli("optimize", d / name, tmp_path / "o.onnx")
    assert code == 0, err
    assert seen and all(lazy and not src.startswith(str(d)) and links == 2 and names == [name]
                        for lazy, src, links, names in seen), seen
    assert snapshot(d) == before and os.stat(d / name).st_nlink == 1
    x = np.random.default_rng(1).standard_normal((1, 512, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(ort_run(tmp_path / "o.onnx", {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-3,
                               atol=1e-3)


def test_where_tmpdir_cannot_link_the_weights_candidates_link_them_beside_the_input(cli, tmp_path, monkeypatch):
    """TMPDIR on another file system (a tmpfs /tmp): a model read lazily keeps being read lazily, and its
    candidates' private folder is made beside the input (hard links again, never a copy of the weights per
    candidate), removed when the run ends."""
    from onnxfuse.validate import runtime

    d = tmp_path / "d"
    d.mkdir()
    w = np.random.default_rng(0).standard_normal((512, 512, 3, 3)).astype(np.float32)  # 9.4 MB: read lazily
    m = make_model([oh.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                    oh.make_node("Relu", ["c"], ["y"], name="relu")],
                   [("x", [1, 512, 4, 4])], [("y", [1, 512, 4, 4])], {"w": w}, opset=13)
    onnx.save(m, str(d / "big.onnx"))
    tmp = tempfile.gettempdir()
    real_link = os.link

    def cross_device(a, b, *args, **kw):
        if os.path.abspath(b).startswith(tmp + os.sep) and not os.path.abspath(b).startswith(str(d)):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_link(a, b, *args, **kw)

    monkeypatch.setattr(os, "link", cross_device)
    monkeypatch.setattr(shutil, "copyfile", lambda *a, **k: pytest.fail("copied the weights"))
    seen = []
    real = runtime.Candidate._write

    def spy(self, proto, locations, src_dir):
        real(self, proto, locations, src_dir)
        seen.append((str(self.source), bool(locations), os.stat(d / "big.onnx").st_nlink))

    monkeypatch.setattr(runtime.Candidate, "_write", spy)
    before = snapshot(d)
    code, _, err = cli("optimize", d / "big.onnx", tmp_path / "o.onnx")
    assert code == 0, err
    assert seen and all(s.startswith(str(d / ".onnxfuse-tmp-")) and lazy and links == 2 for s, lazy, links in seen)
    assert snapshot(d) == before


def test_an_existing_output_elsewhere_does_not_parse_the_input(tmp_path, monkeypatch):
    """Rerunning into an existing OUT in another folder costs no parse of a (possibly large) input: its data files
    can only be in its own folder, or hard links."""
    from onnxfuse.load import collisions

    src = external(tmp_path / "d")
    out = tmp_path / "o" / "o.onnx"
    out.parent.mkdir()
    out.write_bytes(b"an earlier output")
    monkeypatch.setattr(collisions, "data_files", lambda m: pytest.fail("parsed the input"))
    collisions.check_writes([(str(src), str(out))])
    os.link(src.parent / "m.data", tmp_path / "o" / "link")
    monkeypatch.undo()
    with pytest.raises(ModelError, match="is the external data of the input model"):
        collisions.check_writes([(str(src), str(tmp_path / "o" / "link"))])
