"""Many models at once: `onnxfuse optimize IN... OUTDIR --jobs N`, and the timing lock that keeps measuring
serialized across processes."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import onnx
import pytest
from conftest import MODELS

import onnxfuse
from onnxfuse.batch import collect
from onnxfuse.measure.lock import WAIT_KEY, busy_lock, lock_path, timing_lock

NAMES = ["cnn_small.onnx", "if_subgraph.onnx", "transformer_small.onnx"]


def _folder(tmp_path, names, broken=()):
    src = tmp_path / "in"
    src.mkdir()
    for n in names:
        shutil.copy(os.path.join(MODELS, n), src / n)
    for n in broken:
        (src / n).write_bytes(b"not a model")
    return src


def test_folder_into_output_folder_matches_single_model_output(cli, tmp_path):
    src = _folder(tmp_path, NAMES)
    out = tmp_path / "out"  # created by optimize
    code, stdout, stderr = cli("optimize", src, out, "--jobs", "2")
    assert code == 0, stderr
    lines = stdout.strip().splitlines()
    assert len(lines) == len(NAMES) + 1, stdout
    assert lines[-1].startswith(f"{len(NAMES)} model(s): {len(NAMES)} written to {out}, 0 failed")
    assert "with --jobs 2" in lines[-1]
    cnn = next(line for line in lines if line.startswith(str(src / "cnn_small.onnx")))
    assert "nodes 36 -> 16" in cnn and "FusedConv" in cnn and "validation passed" in cnn
    assert sorted(os.listdir(out)) == NAMES  # each output keeps its input's name; no temporary files left
    for n in NAMES:
        onnx.checker.check_model(onnx.load(str(out / n)), full_check=True)
        single = tmp_path / f"single-{n}"
        onnxfuse.optimize(str(src / n), single, onnxfuse.OptimizeOptions(measure=False))
        assert (out / n).read_bytes() == single.read_bytes(), n


def test_broken_model_fails_alone_json(cli, tmp_path):
    src = _folder(tmp_path, ["cnn_small.onnx"], broken=["broken.onnx"])
    out = tmp_path / "out"
    code, stdout, stderr = cli("optimize", src, out, "--jobs", "2", "--json")
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"onnxfuse: error: {src / 'broken.onnx'}: not a valid ONNX model"), lines[0]
    assert os.listdir(out) == ["cnn_small.onnx"]  # nothing at all for the broken one
    data = json.loads(stdout)
    assert [os.path.basename(d["input"]) for d in data] == ["broken.onnx", "cnn_small.onnx"]  # sorted by name
    bad, good = data
    assert bad["schema"] == good["schema"] == "onnxfuse.optimize/1"
    assert bad["output"] is None and "not a valid ONNX model" in bad["error"] and bad["seconds"] >= 0
    assert good["error"] is None and good["output"] == str(out / "cnn_small.onnx")
    assert good["nodes_before"] == 36 and good["nodes_after"] == 16 and good["fired"]["conv-bn-fold"] == 3
    assert good["validation"]["status"] == "passed" and good["written"] == [good["output"]]
    assert good["measure"] is None and good["seconds"] > 0


def test_two_inputs_of_one_name_is_one_error_line(cli, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(os.path.join(MODELS, "cnn_small.onnx"), a / "m.onnx")
    shutil.copy(os.path.join(MODELS, "if_subgraph.onnx"), b / "m.onnx")
    code, stdout, stderr = cli("optimize", a / "m.onnx", b, tmp_path / "out")
    assert code == 1 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "two inputs are named m.onnx" in lines[0], stderr
    assert not (tmp_path / "out").exists()


def test_collect_folders_sorted_and_recursive(tmp_path):
    src = _folder(tmp_path, ["transformer_small.onnx", "cnn_small.onnx"])
    (src / "sub").mkdir()
    shutil.copy(os.path.join(MODELS, "if_subgraph.onnx"), src / "sub" / "if_subgraph.onnx")
    (src / "notes.txt").write_text("not a model")
    out = str(tmp_path / "out")
    items = collect([str(src)], out)
    assert [os.path.basename(i.input) for i in items] == ["cnn_small.onnx", "transformer_small.onnx"]
    assert items[0].output == os.path.join(out, "cnn_small.onnx")
    deep = collect([str(src)], out, recursive=True)
    assert [os.path.basename(i.input) for i in deep] == ["cnn_small.onnx", "transformer_small.onnx",
                                                         "if_subgraph.onnx"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(onnxfuse.OnnxfuseError, match="no .onnx models in this folder"):
        collect([str(tmp_path / "empty")], out)
    with pytest.raises(onnxfuse.OnnxfuseError, match="is a directory, and OUT .* names a file"):
        collect([str(src)], str(tmp_path / "o.onnx"))


def test_lock_serializes_holders(tmp_path):
    """Two holders of the lock (separate opens of the file, as separate processes do) never overlap."""
    path = str(tmp_path / "timing.lock")
    intervals: list[tuple[float, float]] = []
    waits: list[dict] = []

    def hold() -> None:
        timings: dict[str, float] = {}
        with timing_lock(timings, path=path):
            start = time.perf_counter()
            time.sleep(0.3)
            intervals.append((start, time.perf_counter()))
        waits.append(timings)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(intervals)
    assert a1 <= b0, intervals
    assert sum(WAIT_KEY in w for w in waits) == 1 and max(w.get(WAIT_KEY, 0) for w in waits) > 0.2


def test_busy_holders_share_the_lock_and_timing_excludes_them(tmp_path):
    """Workers hold the lock shared (side by side); a worker's timing converts its hold to exclusive and waits
    for the others to finish their work, without waiting for its own shared hold."""
    path = str(tmp_path / "timing.lock")
    spans: dict[str, tuple[float, float]] = {}
    both = threading.Barrier(2)

    def other() -> None:
        with busy_lock(path):
            both.wait()
            t = time.perf_counter()
            time.sleep(0.5)
            spans["other busy"] = (t, time.perf_counter())

    def worker() -> None:
        with busy_lock(path):
            both.wait()
            spans["worker busy"] = (time.perf_counter(), 0.0)
            with timing_lock(path=path):
                t = time.perf_counter()
                time.sleep(0.2)
                spans["worker timing"] = (t, time.perf_counter())

    threads = [threading.Thread(target=f) for f in (other, worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert spans["worker busy"][0] < spans["other busy"][1]  # the two shared holds overlapped
    assert spans["worker timing"][0] >= spans["other busy"][1]  # timing began only once the other was done


def test_measuring_waits_for_the_lock_outside_its_budget(tmp_path, monkeypatch):
    """optimize measures only once another holder lets go; the wait is reported, and not spent from the
    measuring budget (its clock starts inside the lock)."""
    import onnxfuse.pipeline as pipeline

    arrived, held = threading.Event(), threading.Event()
    released: list[float] = []
    real = pipeline.timing_lock

    def spy(*a, **k):
        arrived.set()  # optimize is about to wait for the lock
        return real(*a, **k)

    def hold() -> None:
        with timing_lock(path=lock_path()):
            held.set()
            arrived.wait(30)
            time.sleep(1.0)
            released.append(time.perf_counter())

    monkeypatch.setattr(pipeline, "timing_lock", spy)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        r = onnxfuse.optimize(os.path.join(MODELS, "cnn_small.onnx"), tmp_path / "o.onnx",
                              onnxfuse.OptimizeOptions(measure_budget_s=0.2, cache=False))
        end = time.perf_counter()
    finally:
        holder.join()
    waited = r.timings[WAIT_KEY]
    assert 0.9 < waited < 5, r.timings
    assert r.measure is not None and r.measure.budget_s == 0.2
    assert r.measure.seconds <= end - released[0]  # the budget clock started after the lock was released
    assert r.timings["measure"] <= end - released[0]  # and so did the measure phase's time


def _session_size(sid: int) -> int:
    """Processes in session `sid` (the command, its forkserver and resource tracker, the workers)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            n += fields[3] == str(sid) and fields[0] != "Z"
    return n


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_ctrl_c_stops_the_workers_and_writes_nothing_partial(tmp_path):
    """Workers waiting for the lock (someone else is timing) when Ctrl-C comes: the command stops them and
    exits 130 at once, with one line; nothing is written and no worker is left running."""
    import signal
    import subprocess
    import sys

    src = _folder(tmp_path, ["cnn_small.onnx", "if_subgraph.onnx"])
    out = tmp_path / "out"
    with timing_lock(path=lock_path()):  # the workers' shared hold waits behind this
        p = subprocess.Popen([sys.executable, "-m", "onnxfuse.cli", "optimize", str(src), str(out), "--jobs", "2"],
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 30
        while _session_size(p.pid) < 5 and time.time() < deadline and p.poll() is None:
            time.sleep(0.1)
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGINT)
        try:
            stdout, stderr = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise
    assert p.returncode == 130, stderr
    assert stderr.strip() == "onnxfuse: interrupted after 0 of 2 model(s); the models finished by then are " \
                             "written, nothing partial", stderr
    assert os.listdir(out) == []
    time.sleep(0.5)
    assert _session_size(p.pid) == 0
