"""The timing lock's file is opened safely: a symbolic link, a FIFO or another user's file planted at the lock
path is never followed, blocked on or chmodded (in a shared /tmp any local user could otherwise make onnxfuse
open someone else's file world-writable). The lock's serializing is tested in test_batch.py."""

from __future__ import annotations

import os
import stat
import tempfile
import threading

import pytest
from conftest import MODELS

from onnxfuse.measure import lock as TL

CNN = os.path.join(MODELS, "cnn_small.onnx")
SECRET = b"another user's private data\n"


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SECRET)
    os.chmod(victim, 0o600)
    return victim


def _unchanged(victim, link) -> None:
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o600
    assert victim.read_bytes() == SECRET
    assert os.path.islink(link) and os.readlink(link) == str(victim)


def test_symlink_at_the_cache_lock_is_not_followed_by_optimize_or_bench(cli, tmp_path):
    victim = _victim(tmp_path)
    link = os.path.join(os.environ["ONNXFUSE_CACHE_DIR"], TL.LOCK_FILE)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(victim, link)
    assert TL.lock_path() == link
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--measure-budget", "0.3", "--no-cache",
                          measure=True)
    assert code == 0, stderr
    _unchanged(victim, link)
    code, _, stderr = cli("bench", CNN, tmp_path / "o.onnx", "--runs", "3", "--budget", "0.2")
    assert code == 0, stderr
    _unchanged(victim, link)


@pytest.fixture
def fallback(tmp_path, monkeypatch):
    """The cache folder cannot be created (under a file): the lock is this user's file in a private temp folder."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "file" / "cache"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    path = TL.lock_path()
    assert path == str(tmp / f"onnxfuse-timing-{os.getuid()}.lock")
    return path


def test_symlink_at_the_temp_folder_lock_is_not_followed(cli, tmp_path, fallback):
    victim = _victim(tmp_path)
    os.symlink(victim, fallback)
    with TL.timing_lock() as waited, TL.busy_lock():  # skipped, not followed: both return at once
        assert waited < 1
    code, _, stderr = cli("optimize", CNN, tmp_path / "o.onnx", "--measure-budget", "0.3", "--no-cache",
                          measure=True)
    assert code == 0, stderr
    _unchanged(victim, fallback)


def test_a_created_lock_file_is_not_world_writable(fallback):
    with TL.timing_lock():
        pass
    st = os.lstat(fallback)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644


def test_an_existing_lock_file_keeps_its_mode_and_still_locks(tmp_path):
    path = tmp_path / "timing.lock"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    fd = TL._open(str(path))
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_fifo_at_the_lock_path_does_not_block(tmp_path):
    fifo = tmp_path / "timing.lock"
    os.mkfifo(fifo)
    done = threading.Event()

    def take() -> None:
        with TL.timing_lock(path=str(fifo)), TL.busy_lock(str(fifo)):
            done.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(timeout=10)
    assert done.is_set(), "opening the lock blocked on a FIFO"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_another_users_file_at_the_temp_folder_lock_is_not_used(fallback):
    with open(fallback, "wb"):
        pass
    os.chmod(fallback, 0o666)
    os.chown(fallback, 65534, 65534)
    assert TL._open(fallback) is None
    assert stat.S_IMODE(os.stat(fallback).st_mode) == 0o666 and os.stat(fallback).st_uid == 65534
