"""The run lock's heartbeat, its refusal of odd files, and what a run that loses its lock sees.

- A lock from another host is judged by its heartbeat (the file's mtime): taken over once older
  than the stale limit, refused before that with a message giving its age and when it goes.
- The lock name is never followed or blocked on: a symlink, FIFO or directory there is refused.
- A held lock whose file or folder disappears is put back; one that another run took meanwhile
  makes ``check()`` raise, so the Trainer stops before it writes into that run's folder.

The other lock tests (pid rule, races, read-only folders, the Trainer's use) live in
``tests/checkpoint/test_storage_faults.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from unitrain import ConfigError
from unitrain.checkpoint import CheckpointWarning
from unitrain.training._lock import LOCK_NAME, DirectoryLockedError, RunLock, _process_start, locked


@pytest.fixture(autouse=True)
def default_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the default heartbeat and stale limit (10 s and 60 s)."""
    monkeypatch.delenv("UNITRAIN_LOCK_HEARTBEAT_SECONDS", raising=False)
    monkeypatch.delenv("UNITRAIN_LOCK_STALE_SECONDS", raising=False)


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setenv("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "0.2")
    return 0.2


def write_lock(directory: Path, age: float = 0.0, **owner: Any) -> Path:
    """A lock file as another run would leave it, its heartbeat ``age`` seconds old."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {"pid": 4242, "host": "pod-7f9c-old", "started": time.time() - age, "heartbeat": 10.0}
    record.update(owner)
    lock = directory / LOCK_NAME
    aside = directory / "lock-being-written"
    aside.write_text(json.dumps(record))
    os.utime(aside, (time.time() - age, time.time() - age))
    os.replace(aside, lock)  # appears complete, as RunLock publishes it
    return lock


def wait_for(condition: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# -- the heartbeat decides for locks from other hosts ----------------------------------------------


def test_a_lock_from_another_host_with_an_old_heartbeat_is_taken_over(tmp_path):
    """A pod rescheduled under a new host name after SIGTERM gets its folder back on its own."""
    write_lock(tmp_path, age=61.0)
    with RunLock(tmp_path):
        owner = json.loads((tmp_path / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_from_another_host_with_a_fresh_heartbeat_is_refused_with_its_age(tmp_path):
    lock = write_lock(tmp_path, age=20.0)
    with pytest.raises(DirectoryLockedError) as info:
        RunLock(tmp_path).acquire()
    message = str(info.value)
    assert "pid 4242 on host pod-7f9c-old" in message
    assert "heartbeat is 20 s old" in message
    assert "taken over once its heartbeat is 60 s old" in message
    assert " in 40 s" in message or " in 39 s" in message
    assert f"If that run is dead, delete {lock}" in message
    assert json.loads(lock.read_text())["host"] == "pod-7f9c-old"  # left as it was


def test_a_lock_from_another_host_is_given_three_of_its_own_heartbeats(tmp_path):
    """A host that beats every 30 s (its own setting) is not judged by our 60 s limit."""
    write_lock(tmp_path, age=70.0, heartbeat=30.0)
    with pytest.raises(DirectoryLockedError, match="taken over once its heartbeat is 90 s old"):
        RunLock(tmp_path).acquire()


def test_a_lock_from_another_host_without_a_heartbeat_is_never_taken_over(tmp_path):
    """Written by a unitrain from before the heartbeat: its mtime says nothing about its run."""
    lock = write_lock(tmp_path, age=3600.0, heartbeat=None)
    with pytest.raises(DirectoryLockedError, match="records no heartbeat") as info:
        RunLock(tmp_path).acquire()
    assert f"If that run is dead, delete {lock}" in str(info.value)


def test_the_stale_limit_follows_its_environment_variable(tmp_path, monkeypatch):
    write_lock(tmp_path, age=20.0, heartbeat=1.0)  # three of its beats are 3 s: 15 s decides
    monkeypatch.setenv("UNITRAIN_LOCK_STALE_SECONDS", "15")
    with RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "ten"),
        ("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "0"),
        ("UNITRAIN_LOCK_STALE_SECONDS", "nan"),
        ("UNITRAIN_LOCK_STALE_SECONDS", "-5"),
    ],
)
def test_a_bad_timing_variable_is_refused_by_name(tmp_path, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}={value!r}.* seconds"):
        RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_on_this_host_with_a_live_pid_is_kept_whatever_its_heartbeat(tmp_path):
    """On one host the pid rule decides: a run stuck for minutes is stuck, not dead."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(
            tmp_path,
            age=3600.0,
            pid=sleeper.pid,
            host=socket.gethostname(),
            process_start=_process_start(sleeper.pid),
        )
        with pytest.raises(DirectoryLockedError, match=f"pid {sleeper.pid} on host"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_heartbeat_refreshes_a_held_lock_and_stops_at_release(tmp_path, fast_heartbeat):
    with RunLock(tmp_path) as lock:
        past = time.time() - 3600
        os.utime(lock.path, (past, past))
        assert wait_for(lambda: lock.path.stat().st_mtime > past + 3000)
        beating = [t for t in threading.enumerate() if str(tmp_path) in t.name]
        assert len(beating) == 1 and beating[0].daemon
    assert not beating[0].is_alive()  # joined by release
    assert not lock.path.exists()


# -- odd files at the lock name are refused, never followed or waited on --------------------------


def test_a_fifo_at_the_lock_name_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / LOCK_NAME
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def take() -> None:
        try:
            RunLock(tmp_path).acquire().release()
            outcome.append(None)
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(timeout=2.0)
    if taker.is_alive():  # blocked in open(): a writer end lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        taker.join(timeout=5.0)
        pytest.fail("reading a FIFO at the lock name blocked")
    assert isinstance(outcome[0], DirectoryLockedError)
    assert "is a FIFO" in str(outcome[0]) and f"remove {fifo}" in str(outcome[0])
    assert fifo.exists()  # a user's file is not deleted behind their back


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(lambda p: os.symlink("/dev/zero", p), "symbolic link", id="symlink-dev-zero"),
        pytest.param(lambda p: os.symlink(p.parent / "gone", p), "symbolic link", id="dangling"),
        pytest.param(lambda p: p.mkdir(), "directory", id="directory"),
    ],
)
def test_an_odd_file_at_the_lock_name_is_refused(tmp_path, make, kind):
    make(tmp_path / LOCK_NAME)
    with pytest.raises(DirectoryLockedError) as info:
        RunLock(tmp_path).acquire()
    assert f"is a {kind}" in str(info.value)
    assert f"remove {tmp_path / LOCK_NAME}" in str(info.value)


# -- losing the lock mid-run -----------------------------------------------------------------------


def test_a_deleted_directory_gets_its_lock_back(tmp_path, fast_heartbeat):
    folder = tmp_path / "checkpoints"
    with RunLock(folder) as lock:
        mine = lock.path.read_bytes()
        shutil.rmtree(folder)
        assert wait_for(lock.path.exists)
        assert lock.path.read_bytes() == mine
        with pytest.warns(CheckpointWarning, match="re-created") as seen:
            lock.check()
            lock.check()  # warned once
        assert len(seen) == 1 and str(folder) in str(seen[0].message)
        past = time.time() - 3600
        os.utime(lock.path, (past, past))
        assert wait_for(lambda: lock.path.stat().st_mtime > past + 3000)  # and beating again
    assert not lock.path.exists()


def test_a_lock_another_run_took_after_the_directory_was_deleted_fails_check(tmp_path, monkeypatch):
    monkeypatch.setenv("UNITRAIN_LOCK_HEARTBEAT_SECONDS", "1")
    folder = tmp_path / "checkpoints"
    with RunLock(folder) as lock:
        lock.check()
        past = time.time() - 3600
        os.utime(lock.path, (past, past))
        assert wait_for(lambda: lock.path.stat().st_mtime > past)  # a beat: the next is ~1 s off
        shutil.rmtree(folder)
        other = write_lock(folder, pid=777, host="other-node")
        assert wait_for(lambda: lock.lost, seconds=10.0)
        with pytest.raises(DirectoryLockedError) as info:
            lock.check()
        message = str(info.value)
        assert "lost its lock" in message and "pid 777 on host other-node" in message
    assert json.loads(other.read_text())["pid"] == 777  # release leaves the other run's lock


def test_check_passes_while_the_lock_is_held_and_on_an_unheld_lock(tmp_path, fast_heartbeat):
    with RunLock(tmp_path) as lock:
        time.sleep(0.5)
        lock.check()
        assert not lock.lost
    lock.check()


def test_locked_gives_the_locks_it_holds(tmp_path):
    with locked([tmp_path / "a", tmp_path / "b", tmp_path / "a"]) as locks:
        assert [lock.directory.name for lock in locks] == ["a", "b"]
        for lock in locks:
            lock.check()
        assert (tmp_path / "a" / LOCK_NAME).exists()
    assert not (tmp_path / "a" / LOCK_NAME).exists()
