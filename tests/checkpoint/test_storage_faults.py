"""A full disk during a save, and two runs pointed at one checkpoint directory.

- A write that fails (ENOSPC) in the middle of a checkpoint save, through the Trainer and
  ModelCheckpoint, raises a CheckpointError that names the checkpoint and the OS error, and
  leaves the previous checkpoints intact and resumable (bit-exact).
- A second run on a directory that a live run holds is refused with a DirectoryLockedError
  naming the other run's pid and host and what to do; a lock left by a dead run (SIGKILL, a
  power cut, a restarted container reusing the pid) is taken over; when several processes
  race for one lock, exactly one gets it.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import CheckpointError, Trainer, TrainerConfig, callbacks, models, optim
from unitrain.checkpoint import (
    _write,
    list_checkpoints,
    load_checkpoint,
    remove_leftovers,
    save_checkpoint,
    verify_checkpoint,
)
from unitrain.training._lock import LOCK_NAME, DirectoryLockedError, RunLock, _process_start


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(48, 4)).astype(np.float32), rng.integers(0, 3, 48)


def make_trainer(directory: Path, *extra: Any, epochs: int = 4) -> Trainer:
    return Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        callbacks=[
            callbacks.ModelCheckpoint(directory, every_n_epochs=1, monitor="loss"),
            *extra,
        ],
        config=TrainerConfig(epochs=epochs, batch_size=16, checkpoint_dir=str(directory)),
    )


# -- a full disk ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failing_file", [0, 2, 4])  # first, middle and last file of a save
def test_full_disk_in_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failing_file):
    directory = tmp_path / "ckpt"
    uninterrupted = make_trainer(tmp_path / "full")
    uninterrupted.fit(data())
    real_write = _write._write_file
    calls = []

    def write_until_the_disk_is_full(file: Path, payload: Any, **options: Any) -> Any:
        calls.append(file)
        # epoch 1 writes "epoch=0001-..." and "best" (10 files); epoch 2's save then fails
        # (files 0-3 while the hook runs; 4, the manifest, on the background commit).
        if len(calls) == 10 + failing_file + 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_write(file, payload, **options)

    monkeypatch.setattr(_write, "_write_file", write_until_the_disk_is_full)
    trainer = make_trainer(directory)
    with pytest.raises(CheckpointError, match="No space left on device") as info:
        trainer.fit(data())
    message = str(info.value)
    assert "epoch=0002-step=000006" in message and "is unchanged" in message
    assert "check free disk space" in message
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(directory)] == ["best", "epoch=0001-step=000003"]
    for checkpoint in list_checkpoints(directory):
        verify_checkpoint(checkpoint)
    assert sorted(os.listdir(directory)) == ["best", "epoch=0001-step=000003"]  # no leftovers
    resumed = make_trainer(directory)
    resumed.fit(data(), resume="latest")
    for key, value in uninterrupted.backend.state_dict().items():
        np.testing.assert_array_equal(resumed.backend.state_dict()[key], value)


def test_full_disk_while_replacing_best_keeps_the_old_best(tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    make_trainer(directory, epochs=1).fit(data())
    before = load_checkpoint(directory / "best")
    real_replace = os.replace

    def replace_failing_for_staging(source: Any, target: Any) -> None:
        if ".best.tmp-" in os.fspath(source):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_failing_for_staging)
    trainer = make_trainer(directory)
    with pytest.raises(CheckpointError, match="No space left on device"):
        trainer.fit(data(), resume="latest")
    monkeypatch.undo()
    after = load_checkpoint(directory / "best")
    assert after.trainer["step"] == before.trainer["step"]
    assert not [name for name in os.listdir(directory) if name.startswith(".")]


class _SlowDisk(io.FileIO):
    """A file whose unbuffered writes take at most 3 bytes each, on a disk with ``room`` left."""

    room = 2**62

    def write(self, data: Any) -> int:
        if _SlowDisk.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = super().write(memoryview(data)[: min(3, _SlowDisk.room)])
        _SlowDisk.room -= written
        return written


@pytest.mark.parametrize("room", [None, 100, 5000])  # never full; full in a header; in a tensor
def test_partial_writes_and_a_disk_filling_mid_file(tmp_path, monkeypatch, room):
    """Unbuffered writes may take part of a chunk; ENOSPC may come halfway through a file."""
    model = {"w": np.arange(2000, dtype=np.float32).reshape(40, 50), "b": np.ones(3)}
    path = tmp_path / "last"
    save_checkpoint(path, model={}, optimizer={}, trainer={"epoch": 0, "step": 1})
    monkeypatch.setattr(_SlowDisk, "room", 2**62 if room is None else room)
    monkeypatch.setattr(
        _write, "open", lambda file, *args, **kwargs: _SlowDisk(file, "xb"), raising=False
    )
    try:
        save_checkpoint(path, model=model, optimizer={}, trainer={"epoch": 0, "step": 2})
    except CheckpointError as error:
        assert room is not None
        assert re.search(r"No space left on device.*is unchanged", str(error))
    monkeypatch.undo()
    loaded = load_checkpoint(path)
    assert os.listdir(tmp_path) == ["last"]
    assert loaded.trainer["step"] == (2 if room is None else 1)
    if room is None:
        for name, array in model.items():
            np.testing.assert_array_equal(loaded.model[name], array)


# -- the run lock ----------------------------------------------------------------------------------


def write_lock(directory: Path, **owner: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    record.update(owner)
    (directory / LOCK_NAME).write_text(json.dumps(record))
    return directory / LOCK_NAME


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_lock_is_taken_for_fit_and_released_after(tmp_path):
    seen = []

    class Look(callbacks.Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            seen.append(json.loads((tmp_path / LOCK_NAME).read_text()))

    make_trainer(tmp_path, Look(), epochs=1).fit(data())
    assert seen[0]["pid"] == os.getpid() and seen[0]["host"] == socket.gethostname()
    assert not (tmp_path / LOCK_NAME).exists()
    assert list_checkpoints(tmp_path)  # readers ignore the hidden lock file


def test_the_directories_a_callback_writes_to_are_locked_for_fit(tmp_path):
    """Any callback, not only ModelCheckpoint, gets its declared directories locked."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / ".epoch=0001-step=000003.tmp-999999999-abcd1234").mkdir()  # a dead run's save
    seen = []

    class Writer(callbacks.Callback):
        writes_to = (other,)

        def on_epoch_end(self, trainer, epoch, logs):
            seen.append(sorted(os.listdir(other)))

    make_trainer(tmp_path / "run", Writer(), epochs=1).fit(data())
    assert seen == [[LOCK_NAME]]  # held during fit, the dead run's leftover cleared
    assert os.listdir(other) == []
    assert callbacks.ModelCheckpoint(tmp_path / "c").writes_to == (tmp_path / "c",)
    assert callbacks.ModelCheckpoint().writes_to == ()  # checkpoint_dir is locked anyway


def test_lock_is_released_when_fit_raises(tmp_path):
    class Crash(callbacks.Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(tmp_path, Crash()).fit(data())
    assert not (tmp_path / LOCK_NAME).exists()
    make_trainer(tmp_path, epochs=1).fit(data())  # the directory is free again


def test_a_second_trainer_of_the_same_process_is_refused(tmp_path):
    inner: list[BaseException] = []

    class StartAnother(callbacks.Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            try:
                make_trainer(tmp_path, epochs=1).fit(data())
            except DirectoryLockedError as error:
                inner.append(error)

    make_trainer(tmp_path, StartAnother(), epochs=1).fit(data())
    assert f"another Trainer of this process (pid {os.getpid()})" in str(inner[0])
    assert "another checkpoint_dir" in str(inner[0])


def test_both_the_config_and_the_model_checkpoint_directories_are_locked(tmp_path):
    held = RunLock(tmp_path / "own").acquire()
    trainer = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        callbacks=[callbacks.ModelCheckpoint(tmp_path / "own")],
        config=TrainerConfig(epochs=1, checkpoint_dir=str(tmp_path / "config")),
    )
    with pytest.raises(DirectoryLockedError, match="own"):
        trainer.fit(data())
    assert not (tmp_path / "config" / LOCK_NAME).exists()  # given back on the way out
    held.release()
    trainer.fit(data())


@pytest.mark.parametrize(
    "owner",
    [
        pytest.param({"pid": "dead"}, id="dead-pid"),
        pytest.param({"process_start": "reused"}, id="pid-reused-by-another-process"),
        pytest.param({}, id="own-pid-of-an-earlier-process"),  # a restarted container
    ],
)
def test_a_stale_lock_is_taken_over(tmp_path, owner):
    if owner.get("pid") == "dead":
        owner = {"pid": dead_pid()}
    if owner.get("process_start") == "reused":
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        owner = {"pid": sleeper.pid, "process_start": "1"}  # not when that pid started
    try:
        write_lock(tmp_path, **owner)
        make_trainer(tmp_path, epochs=1).fit(data())
        assert not (tmp_path / LOCK_NAME).exists()
    finally:
        if "process_start" in owner:
            sleeper.kill()
            sleeper.wait()


def test_a_live_run_on_this_host_is_named_in_the_refusal(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = write_lock(tmp_path, pid=sleeper.pid, process_start=_process_start(sleeper.pid))
        with pytest.raises(DirectoryLockedError) as info:
            make_trainer(tmp_path, epochs=1).fit(data())
        message = str(info.value)
        assert f"in use by another unitrain run (pid {sleeper.pid} on host" in message
        assert "wait for that run to finish" in message and f"delete {lock}" in message
        assert lock.exists() and not list_checkpoints(tmp_path)  # nothing written, nothing taken
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    lock = write_lock(tmp_path, pid=dead_pid(), host="some-other-host")
    with pytest.raises(DirectoryLockedError, match="on host some-other-host") as info:
        make_trainer(tmp_path, epochs=1).fit(data())
    assert f"If that run is dead, delete {lock}" in str(info.value)


def test_an_unreadable_lock_is_refused_while_young_and_taken_over_when_old(tmp_path):
    tmp_path.joinpath(LOCK_NAME).write_bytes(b"")  # a run killed between create and write
    with pytest.raises(DirectoryLockedError, match=r"taking the lock .* right now"):
        make_trainer(tmp_path, epochs=1).fit(data())
    old = time.time() - 60
    os.utime(tmp_path / LOCK_NAME, (old, old))
    make_trainer(tmp_path, epochs=1).fit(data())


def test_release_leaves_a_lock_that_is_no_longer_its_own(tmp_path):
    lock = RunLock(tmp_path).acquire()
    other = write_lock(tmp_path, pid=12345, host="elsewhere")  # e.g. a user broke and retook it
    lock.release()
    assert json.loads(other.read_text())["host"] == "elsewhere"


def test_a_read_only_directory_is_not_locked(tmp_path, monkeypatch):
    """Resuming from someone else's read-only checkpoints needs no lock: nobody can write."""
    make_trainer(tmp_path, epochs=1).fit(data())
    real_open = os.open

    def read_only(file: Any, flags: int, *args: Any) -> int:
        if LOCK_NAME in str(file) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    resumed = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        config=TrainerConfig(epochs=1, batch_size=16, checkpoint_dir=str(tmp_path)),
    )
    with pytest.warns(UserWarning, match="already finished"):
        resumed.fit(data(), resume="latest")
    assert resumed.state.epoch == 1 and not (tmp_path / LOCK_NAME).exists()


def test_the_lock_appears_complete_or_not_at_all(tmp_path, monkeypatch):
    """Written under a temporary name and hard-linked into place: never an empty lock file."""
    seen = []
    real_link = os.link

    def link(source: Any, target: Any) -> None:
        seen.append(Path(source).read_text())  # complete before it gets the lock's name
        real_link(source, target)

    monkeypatch.setattr(os, "link", link)
    with RunLock(tmp_path):
        assert json.loads(seen[0])["pid"] == os.getpid()
        assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # the temporary name is gone


def test_without_hard_links_the_lock_file_is_created_in_place(tmp_path, monkeypatch):
    def no_links(source: Any, target: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    with RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert RunLock(tmp_path)._publish(b"{}") is False  # O_EXCL still refuses a second one
    assert sorted(os.listdir(tmp_path)) == []


def test_leftovers_of_killed_lock_takers_are_cleaned_up(tmp_path):
    old = time.time() - 60
    for name in (f"{LOCK_NAME}.tmp-1-ab", f"{LOCK_NAME}.stale-2-cd", "keep.txt"):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (old, old))
    (tmp_path / f"{LOCK_NAME}.tmp-3-ef").write_text("x")  # young: maybe being written now
    with RunLock(tmp_path):
        pass
    assert sorted(os.listdir(tmp_path)) == [f"{LOCK_NAME}.tmp-3-ef", "keep.txt"]


def test_fit_deletes_what_killed_saves_left_and_keeps_the_rest(tmp_path):
    make_trainer(tmp_path, epochs=1).fit(data())
    installed = list_checkpoints(tmp_path)[0].name  # its replacement was installed
    gone = [f".a.tmp-{dead_pid()}-0bad", f".b.del-{dead_pid()}-0bad"]
    gone.append(f".{installed}.old-{dead_pid()}-0bad")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    kept = [f".c.tmp-{sleeper.pid}-0bad", f".d.old-{dead_pid()}-0bad", "notes"]  # d: only copy
    try:
        for name in gone + kept:
            (tmp_path / name).mkdir()
            (tmp_path / name / "model.safetensors").write_bytes(b"partial")
        make_trainer(tmp_path, epochs=2).fit(data(), resume="latest")
    finally:
        sleeper.kill()
        sleeper.wait()
    left = set(os.listdir(tmp_path))
    assert not left & set(gone) and set(kept) <= left


def test_an_unwritable_directory_is_a_checkpoint_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot create the checkpoint directory"):
        RunLock(tmp_path / "file" / "ckpt").acquire()


RACER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from unitrain.training._lock import DirectoryLockedError, RunLock
    directory, start = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))
    try:
        lock = RunLock(directory).acquire()
    except DirectoryLockedError:
        print("refused", flush=True)
    else:
        print("acquired", flush=True)
        while not Path(directory, "release").exists():  # hold it until every racer has tried
            time.sleep(0.01)
        lock.release()
    """
)


@pytest.mark.parametrize("stale", [False, True])
def test_exactly_one_of_many_racing_processes_gets_the_lock(tmp_path, stale):
    if stale:
        write_lock(tmp_path, pid=dead_pid())
    start = time.time() + 2.0  # all start together, after their imports
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    results = [racer.stdout.readline().strip() for racer in racers]  # type: ignore[union-attr]
    (tmp_path / "release").touch()
    for racer in racers:
        racer.communicate(timeout=60)
    assert sorted(results) == ["acquired"] + ["refused"] * 5, results
    assert not (tmp_path / LOCK_NAME).exists()


def test_two_cli_runs_on_one_directory(tmp_path):
    """The second ``unitrain train`` exits with status 2 and the first finishes unharmed.

    The first run's one checkpoint write takes 7.5 s (a pause after each of its five files),
    so it still holds the lock when the second run reaches it.
    """
    env = {**os.environ, "UNITRAIN_CHECKPOINT_WRITE_DELAY": "1.5", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", "numpy"]
    command += ["--epochs", "1", "--out", str(tmp_path)]
    first = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.time() + 60
        while not (tmp_path / "checkpoints" / LOCK_NAME).exists() and time.time() < deadline:
            time.sleep(0.01)
        second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"in use by another unitrain run (pid {first.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        err = first.communicate(timeout=120)[1]
    assert first.returncode == 0, err
    for checkpoint in list_checkpoints(tmp_path / "checkpoints"):
        verify_checkpoint(checkpoint)
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1]


def test_sigkill_leaves_a_lock_that_the_next_run_takes_over(tmp_path):
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_storage_faults import data, make_trainer
        from unitrain import callbacks
        class Die(callbacks.Callback):
            def on_epoch_end(self, trainer, epoch, logs):
                if epoch == 1:  # epoch 0's checkpoint is written (checkpointing runs last)
                    os.kill(os.getpid(), signal.SIGKILL)
        make_trainer(__import__("pathlib").Path({str(tmp_path)!r}), Die()).fit(data())
        """
    )
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / LOCK_NAME).exists()
    make_trainer(tmp_path).fit(data(), resume="latest")
    assert not (tmp_path / LOCK_NAME).exists()


def test_leftover_cleanup_leaves_the_run_lock_files_to_the_lock(tmp_path):
    # A contender's lock temporary (perhaps from another host, where its pid means nothing here)
    # belongs to unitrain.training._lock's own rules; an interrupted save's staging is removed.
    lock_temporary = tmp_path / f"{LOCK_NAME}.tmp-999999999-abcd1234"
    lock_temporary.write_text("pid")
    (tmp_path / ".epoch=0001-step=000003.tmp-999999999-abcd1234").mkdir()
    remove_leftovers(tmp_path)
    assert os.listdir(tmp_path) == [lock_temporary.name]
