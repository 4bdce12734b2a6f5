"""Tests for the writers of a run folder (unitrain._files and the file loggers).

A run's files are written without following symlinks and only as regular files, a folder
that cannot be written is refused before the first update, and a write that fails while
training is a :class:`RunFolderError` that says what to do, not a raw ``OSError``. The
numpy backend keeps every training here to a fraction of a second.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unitrain import Trainer, TrainerConfig, models
from unitrain._errors import CheckpointError, RunFolderError
from unitrain._files import open_regular, probe_writable, raising_write_errors, write_error
from unitrain.callbacks import CSVLogger, JSONLLogger, ModelCheckpoint, TensorBoardLogger

# -- helpers ------------------------------------------------------------------------------------


def tiny_data(n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(n, 3)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def make_trainer(callbacks: list[Any], **config: Any) -> Trainer:
    return Trainer(
        models.MLP((3, 4, 2)),
        backend="numpy",
        callbacks=callbacks,
        config=TrainerConfig(**{"epochs": 2, "batch_size": 4, **config}),
    )


def refuse_inside(monkeypatch: pytest.MonkeyPatch, folder: Path, code: int) -> None:
    """Make every file creation inside ``folder`` fail with ``code``, as that file system
    would (tests run as root, for whom chmod does not stop writes)."""
    real_open = os.open

    def failing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(os.fsdecode(path)).parent == folder and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)


class FullDisk:
    """A file handle whose writes fail as on a full disk."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- the helpers --------------------------------------------------------------------------------


def test_open_regular_writes_appends_updates_and_creates_new(tmp_path):
    path = tmp_path / "f"
    with open_regular(path, "w") as handle:
        handle.write(b"abc")
    with open_regular(path, "a") as handle:
        handle.write(b"def")
    with open_regular(path, "r+") as handle:
        handle.seek(1)
        handle.write(b"X")
    assert path.read_bytes() == b"aXcdef"
    with open_regular(path, "w") as handle:
        handle.write(b"1")
    assert path.read_bytes() == b"1"
    with pytest.raises(FileExistsError):
        open_regular(path, "x")


@pytest.mark.parametrize("mode", ["w", "a", "r+", "x"])
@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "directory"])
def test_open_regular_refuses_links_and_special_files(tmp_path, mode, kind):
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    if kind == "symlink":
        path.symlink_to(outside)
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    expected = {"symlink": "is a symlink", "dangling symlink": "is a symlink"}.get(
        kind, f"is a {kind.upper() if kind == 'fifo' else kind}, not a regular file"
    )
    error = FileExistsError if mode == "x" else RunFolderError
    with pytest.raises(error) as raised:
        open_regular(path, mode)  # type: ignore[arg-type]
    if error is RunFolderError:
        assert str(raised.value).startswith(f"{path}: {expected}")
    assert outside.read_bytes() == b"precious"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.EROFS, "the file system is read-only"),
        (errno.EACCES, "this user may not write there"),
        (errno.ENOSPC, "the disk is full"),
    ],
)
def test_probe_writable_translates_what_the_file_system_says(tmp_path, monkeypatch, code, advice):
    probe_writable(tmp_path / "new" / "folder")  # creates it
    assert (tmp_path / "new" / "folder").is_dir()
    assert list((tmp_path / "new" / "folder").iterdir()) == []  # leaves nothing behind
    refuse_inside(monkeypatch, tmp_path, code)
    with pytest.raises(RunFolderError) as raised:
        probe_writable(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path}: cannot write files in this folder: [Errno {code}]")
    assert advice in message
    assert isinstance(raised.value, CheckpointError)
    assert isinstance(raised.value.__cause__, OSError)


def test_probe_writable_refuses_a_file_where_the_folder_should_be(tmp_path):
    (tmp_path / "out").write_text("not a folder")
    with pytest.raises(RunFolderError, match="is not a folder"):
        probe_writable(tmp_path / "out")


def test_write_errors_become_run_folder_errors(tmp_path):
    error = write_error(tmp_path / "m", OSError(errno.EDQUOT, "Disk quota exceeded"), "write it")
    assert str(error) == (
        f"{tmp_path / 'm'}: cannot write it: [Errno {errno.EDQUOT}] Disk quota exceeded; "
        "the disk quota is used up: free space, or give the run a folder on another disk"
    )
    with pytest.raises(RunFolderError) as raised, raising_write_errors(tmp_path, "do x"):
        raise OSError(errno.EIO, "Input/output error")
    assert "check the path, free space and permissions" in str(raised.value)
    with pytest.raises(KeyError), raising_write_errors(tmp_path, "do x"):
        raise KeyError("not a write error")  # anything else goes through as it is


# -- the loggers in a run -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [JSONLLogger, CSVLogger])
def test_a_metrics_file_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path, kind):
    """The audit's case: resume="latest" truncated the link's target and appended to it."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "run" / "metrics.jsonl"
    make_trainer([kind(log), ModelCheckpoint(ckpt)], checkpoint_dir=str(ckpt)).fit(tiny_data())
    outside = tmp_path / "elsewhere.txt"
    outside.write_bytes(bytes(range(256)) * 40)
    before = outside.read_bytes()
    log.unlink()
    log.symlink_to(outside)

    resumed = make_trainer([kind(log), ModelCheckpoint(ckpt)], epochs=3, checkpoint_dir=str(ckpt))
    with pytest.raises(RunFolderError) as raised:
        resumed.fit(tiny_data(), resume="latest")
    assert str(raised.value).startswith(f"{log}: is a symlink; ")
    assert resumed.state.step == 8  # the checkpoint's step: no update ran after resuming
    assert outside.read_bytes() == before
    assert log.is_symlink()


def test_a_fifo_in_place_of_the_metrics_file_is_refused_without_hanging(tmp_path):
    log = tmp_path / "metrics.jsonl"
    os.mkfifo(log)
    trainer = make_trainer([JSONLLogger(log)])
    outcome: list[BaseException | None] = []

    def fit() -> None:
        try:
            trainer.fit(tiny_data())
            outcome.append(None)
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():  # blocked opening the FIFO: a reader lets it go on, then fail
        reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
        thread.join(timeout=60)
        os.close(reader)
        pytest.fail("opening a FIFO as the metrics file blocked until a reader came")
    assert len(outcome) == 1 and isinstance(outcome[0], RunFolderError), outcome
    assert str(outcome[0]).startswith(f"{log}: is a FIFO, not a regular file; ")
    assert trainer.state.step == 0


@pytest.mark.parametrize("kind", [JSONLLogger, CSVLogger, TensorBoardLogger])
@pytest.mark.parametrize(
    ("code", "advice"),
    [(errno.EROFS, "read-only"), (errno.EACCES, "may not write"), (errno.ENOSPC, "disk is full")],
)
def test_a_folder_that_cannot_be_written_is_refused_before_the_first_update(
    tmp_path, monkeypatch, kind, code, advice
):
    if kind is TensorBoardLogger:
        pytest.importorskip("tensorboardX")
    folder = tmp_path / "out"
    folder.mkdir()
    logger = kind(folder if kind is TensorBoardLogger else folder / "metrics.jsonl")
    trainer = make_trainer([logger])
    refuse_inside(monkeypatch, folder, code)
    with pytest.raises(RunFolderError) as raised:
        trainer.fit(tiny_data())
    assert str(raised.value).startswith(f"{folder}: cannot write files in this folder: ")
    assert advice in str(raised.value)
    assert trainer.state.step == 0
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("kind", [JSONLLogger, CSVLogger])
def test_a_full_disk_while_writing_a_line_is_a_run_folder_error(tmp_path, monkeypatch, kind):
    import unitrain.callbacks.loggers as loggers

    log = tmp_path / "metrics.jsonl"
    logger = kind(log)
    trainer = make_trainer([logger], epochs=3)
    real_open = loggers.open_regular
    calls = []

    def open_then_fill(path: Any, mode: str) -> Any:
        calls.append(mode)
        handle = real_open(path, mode)
        return FullDisk(handle) if len(calls) == 2 else handle  # the second epoch's line

    monkeypatch.setattr(loggers, "open_regular", open_then_fill)
    with pytest.raises(RunFolderError) as raised:
        trainer.fit(tiny_data())
    error = raised.value
    assert not isinstance(error, OSError)
    assert str(error).startswith(f"{log}: cannot write the epoch's metrics: [Errno 28] ")
    assert str(error).endswith(
        "the disk is full: free space there, or give the run a folder on another disk"
    )
    assert trainer.state.epoch == 2  # stopped at the second epoch's end, not the third
    lines = log.read_text().splitlines()
    assert len(lines) == (2 if kind is CSVLogger else 1)  # the first epoch's line is intact
    assert logger.state_dict()["offset"] == log.stat().st_size


# -- TensorBoard -------------------------------------------------------------------------------


def read_events(path: Path) -> list[Any]:
    """The Event records of one file, each frame's length and CRCs checked."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header)
        body = data[at + 12 : at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == (
            masked_crc32c(body)
        )
        events.append(Event.FromString(body))
        at += 16 + length
    return events


def test_tensorboard_never_writes_through_a_link_at_its_event_file_name(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    import socket

    import unitrain.callbacks.tensorboard as tensorboard

    monkeypatch.setattr(socket, "gethostname", lambda: "host")
    monkeypatch.setattr(tensorboard.time, "time", lambda: 1700000000.5)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"precious" * 100)
    log_dir = tmp_path / "tb"
    log_dir.mkdir()
    (log_dir / "events.out.tfevents.1700000000.host").symlink_to(outside)

    make_trainer([TensorBoardLogger(log_dir)], log_every_n_steps=2).fit(tiny_data())
    assert outside.read_bytes() == b"precious" * 100
    written = [p for p in log_dir.iterdir() if not p.is_symlink()]
    assert [p.name for p in written] == ["events.out.tfevents.1700000000.host.1"]
    events = read_events(written[0])
    assert events[0].file_version == "brain.Event:2"
    tags = {value.tag for event in events[1:] for value in event.summary.value}
    assert {"train/loss", "train/lr", "epoch/loss", "epoch/lr"} <= tags
    assert max(event.step for event in events) == 8


def test_tensorboard_write_errors_are_run_folder_errors(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    import unitrain.callbacks.tensorboard as tensorboard

    real_open = tensorboard.open_regular
    monkeypatch.setattr(tensorboard, "open_regular", lambda p, m: FullDisk(real_open(p, m)))
    trainer = make_trainer([TensorBoardLogger(tmp_path / "tb")])
    with pytest.raises(RunFolderError) as raised:
        trainer.fit(tiny_data())
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'tb'}/events.out.tfevents.")
    assert ": cannot write TensorBoard events: [Errno 28] " in message
    assert trainer.state.step == 0  # the file's first record is written before training
