"""Stopping a command (signals.py): SIGTERM unwinds like Ctrl-C (exit 143, one line, nothing partial left beside
OUT or in the temporary folder), a batch's workers die with it (even with a parent killed outright), and Ctrl-C
during the imports of the first second is one line, exit 130, never a traceback.

Real processes and real signals. Nothing sleeps and hopes: each signal is sent once the child shows the state it
is meant to hit, read from /proc: a process waiting for the timing lock (which the test holds) is listed in
/proc/locks; the entry point's SIGTERM handler (installed before the heavy imports) shows in /proc/PID/status."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import MODELS

from onnxfuse.measure.lock import busy_lock, lock_path, timing_lock

pytestmark = pytest.mark.skipif(not os.path.isfile("/proc/locks"), reason="reads /proc (Linux)")

CNN = os.path.join(MODELS, "cnn_small.onnx")
TIMEOUT = 90  # seconds: generous, the machine is shared


def _lock_waiters(mode: str) -> set[int]:
    """Processes blocked in flock on the timing lock file, waiting for a `mode` (READ: shared, WRITE: exclusive)
    lock. A /proc/locks line: `1: -> FLOCK  ADVISORY  WRITE 4242 fe:00:2149282 0 EOF` (the last number of the
    device:inode field is the file's inode)."""
    inode = os.stat(lock_path()).st_ino
    pids = set()
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" not in fields:
                continue
            i = fields.index("->")
            kind, lock_mode, pid, where = fields[i + 1], fields[i + 3], fields[i + 4], fields[i + 5]
            if kind == "FLOCK" and lock_mode == mode and int(where.rsplit(":", 1)[1]) == inode:
                pids.add(int(pid))
    return pids


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _catches(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (signum - 1) & 1)


def _wait_for(what: str, check, p: subprocess.Popen | None) -> None:
    """Until check(); an error if `p` (where given) exits first."""
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if p is not None and p.poll() is not None:
            raise AssertionError(f"exited ({p.returncode}) before {what}: {p.communicate()[1]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _start(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """`python -m onnxfuse.cli ARGS` with a private TMPDIR (returned); the test's cache folder, so its lock. The
    TMPDIR is short, as a user's is: the forkserver's socket path must fit sun_path (batch.SOCKET_PATH_MAX; a
    longer one makes a batch use spawn, which the test of that case checks)."""
    tmp = tempfile.mkdtemp(prefix="of-", dir="/tmp" if os.path.isdir("/tmp") else None)
    atexit.register(shutil.rmtree, tmp, True)
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.Popen([sys.executable, "-m", "onnxfuse.cli", *args], env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    return p, str(tmp)


def _default_sigint() -> None:
    """The child starts with SIGINT at its default, as from a terminal: a process started with SIGINT ignored (a
    background job of a shell script, or a parent that ignores it) keeps it ignored, as every Python program does,
    and the suite's own process may have come to ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ours(folder: str) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(("onnxfuse-", ".onnxfuse-"))]


def _reap(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_sigterm_while_measuring_exits_143_and_leaves_nothing(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with busy_lock(lock_path()):  # the child loads, rewrites and validates; its measuring waits for this
        p, tmp = _start(tmp_path, "optimize", CNN, str(out_dir / "o.onnx"), "--no-cache")
        try:
            _wait_for("measuring", lambda: p.pid in _lock_waiters("WRITE"), p)
            assert _ours(tmp), "the pipeline's temporary folder should exist while measuring"
            os.kill(p.pid, signal.SIGTERM)
            _, stderr = p.communicate(timeout=TIMEOUT)
        finally:
            _reap(p)
    assert p.returncode == 143, stderr
    assert stderr.strip() == "onnxfuse: terminated; nothing written"
    assert os.listdir(out_dir) == [] and _ours(tmp) == []


def test_sigterm_while_writing_removes_the_temporary_file(cli, tmp_path, monkeypatch):
    """In this process (the write is too short to hit from outside): a real SIGTERM once the whole model is in
    the temporary file beside OUT, before it is renamed into place."""
    import onnxfuse.load.write as W

    out_dir, tmp = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    real, seen = W.write_streamed, []

    def write_then_sigterm(f, *a, **k):
        real(f, *a, **k)
        name = getattr(f, "name", None)
        if not isinstance(name, str) or os.path.dirname(name) != str(out_dir):  # a validation candidate
            return
        f.flush()
        seen.extend(_ours(str(out_dir)))
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # unhandled, it would kill the test run
            raise AssertionError("no SIGTERM handler while optimize runs")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(TIMEOUT)  # the signal's handler interrupts this at once

    monkeypatch.setattr(W, "write_streamed", write_then_sigterm)
    code, _, stderr = cli("optimize", CNN, out_dir / "o.onnx")
    assert seen and seen[0].endswith(".onnx.tmp"), seen
    assert code == 143, stderr
    assert stderr.strip() == "onnxfuse: terminated; nothing written"
    assert os.listdir(out_dir) == [] and _ours(str(tmp)) == []


def _batch_waiting(tmp_path) -> tuple[subprocess.Popen, set[int], str]:
    """A `--jobs 2` batch of two models whose workers are both busy, waiting for the lock the caller holds."""
    src = tmp_path / "in"
    src.mkdir()
    for n in ("cnn_small.onnx", "if_subgraph.onnx"):
        (src / n).write_bytes(open(os.path.join(MODELS, n), "rb").read())
    p, _ = _start(tmp_path, "optimize", str(src), str(tmp_path / "out"), "--jobs", "2")
    workers: set[int] = set()

    def both_waiting() -> bool:
        workers.update(_lock_waiters("READ") - {p.pid})
        return len(workers) >= 2

    try:
        _wait_for("both workers", both_waiting, p)
    except BaseException:
        _reap(p)
        raise
    return p, workers, str(tmp_path / "out")


def _nothing_left_after_release(p: subprocess.Popen, workers: set[int], out: str) -> str:
    """Once the caller's lock is released, any surviving worker would optimize and write: the pipes must close
    (every process holding them gone), no worker run, no output appear."""
    try:
        _, stderr = p.communicate(timeout=TIMEOUT)  # EOF on stdout and stderr
    finally:
        _reap(p)
    assert not [w for w in workers if _running(w)], "a worker outlived the command"
    assert os.listdir(out) == []
    return stderr


@pytest.mark.parametrize("to_group", [False, True])
def test_sigterm_to_a_batch_stops_its_workers(tmp_path, to_group):
    """`kill PID` (the command only), or the whole process group (the workers get it twice: from there and from
    the command stopping them)."""
    with timing_lock(path=lock_path()):
        p, workers, out = _batch_waiting(tmp_path)
        (os.killpg if to_group else os.kill)(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=TIMEOUT)
        finally:
            _reap(p)
    stderr = _nothing_left_after_release(p, workers, out)
    assert p.returncode == 143, stderr
    assert stderr.strip() == ("onnxfuse: terminated after 0 of 2 model(s); the models finished by then are "
                              "written, nothing partial")


def test_workers_die_with_a_batch_killed_outright(tmp_path):
    """The workers die while still waiting for the lock (no release lets them run first), and so does the
    forkserver, even one that could not have noticed on its own: stopped here, as if stuck in its exit (seen
    once in 144 kills on a loaded machine; forkserver_guard.py)."""
    with timing_lock(path=lock_path()):
        p, workers, out = _batch_waiting(tmp_path)
        server = _forkserver_of(workers)
        os.kill(server, signal.SIGSTOP)
        os.kill(p.pid, signal.SIGKILL)  # no chance to stop them: they must notice (PR_SET_PDEATHSIG)
        p.wait(timeout=TIMEOUT)
        _wait_for("the workers and the forkserver to die", lambda: not any(map(_running, workers | {server})), None)
    _nothing_left_after_release(p, workers, out)
    assert p.returncode == -signal.SIGKILL


def _forkserver_of(workers: set[int]) -> int:
    """The workers' common parent, the batch's forkserver."""
    parents = set()
    for w in workers:
        with open(f"/proc/{w}/stat") as f:
            parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
    assert len(parents) == 1, parents
    return parents.pop()


@pytest.mark.parametrize(("signum", "after", "code", "word"), [
    (signal.SIGINT, 0.0, 130, "interrupted"),
    (signal.SIGINT, 0.3, 130, "interrupted"),
    (signal.SIGTERM, 0.0, 143, "terminated"),
])
def test_a_signal_during_the_imports_is_one_line(tmp_path, signum, after, code, word):
    """As soon as onnxfuse's entry point runs (its SIGTERM handler shows), while onnx, onnxruntime and numpy
    are still importing (a second or more), and again a little later."""
    p, _ = _start(tmp_path, "optimize", CNN, str(tmp_path / "o.onnx"))
    try:
        _wait_for("the entry point", lambda: _catches(p.pid, signal.SIGTERM), p)
        if after:
            time.sleep(after)  # a later moment of the imports (or of the command: the answer is the same)
        os.kill(p.pid, signum)
        _, stderr = p.communicate(timeout=TIMEOUT)
    finally:
        _reap(p)
    assert p.returncode == code, stderr
    assert stderr.strip() == f"onnxfuse: {word}; nothing written"
    assert not (tmp_path / "o.onnx").exists()


def test_a_zombie_command_counts_as_gone():
    """A worker that starts after its command was killed but before the command's parent reaped it (its
    forkserver already gone, so no parent-death signal will come) must see that the command has gone."""
    from onnxfuse.batch import _alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait_for("the child to exit", lambda: not _running(child.pid), None)  # exited, not reaped: a zombie
        assert os.path.exists(f"/proc/{child.pid}")
        assert not _alive(child.pid)
    finally:
        child.wait()
    assert _alive(os.getpid())


def test_a_batch_uses_spawn_where_the_temporary_folder_leaves_no_room_for_the_forkservers_socket(monkeypatch):
    from onnxfuse import batch

    monkeypatch.setattr(tempfile, "tempdir", "/tmp/" + "d" * batch.SOCKET_PATH_MAX)
    assert batch._context().get_start_method() == "spawn"
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert batch._context().get_start_method() == "forkserver"
