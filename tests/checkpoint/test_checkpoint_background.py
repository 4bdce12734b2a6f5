"""Saves finished on a background thread: CheckpointWriter and ModelCheckpoint(background=True)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from unitrain import CheckpointError, Trainer, TrainerConfig
from unitrain.callbacks import Callback, ModelCheckpoint
from unitrain.checkpoint import (
    CheckpointWriter,
    _write,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from unitrain.models import MLP

STATE = {
    "model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)},
    "optimizer": {"w.momentum": np.ones((3, 4), np.float32)},
    "trainer": {"epoch": 1, "step": 7},
}


def _files(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def test_a_background_save_writes_the_same_files_as_a_durable_one(tmp_path):
    writer = CheckpointWriter()
    writer.save(tmp_path / "background", **STATE)
    writer.wait()
    save_checkpoint(tmp_path / "durable", **STATE)
    assert _files(tmp_path / "background") == _files(tmp_path / "durable")


def test_the_checkpoint_appears_only_when_durable_and_the_arrays_may_change_meanwhile(
    tmp_path, monkeypatch
):
    release = threading.Event()
    install = _write._install

    def held_install(staging, target):  # the commit waits here until the test lets it go
        release.wait(10)
        install(staging, target)

    monkeypatch.setattr(_write, "_install", held_install)
    model = {"w": np.arange(12, dtype=np.float32)}
    writer = CheckpointWriter()
    target = writer.save(tmp_path / "ckpt", model=model, optimizer={}, trainer=STATE["trainer"])
    model["w"][:] = -1.0  # training goes on and changes the parameters
    assert not target.exists() and list_checkpoints(tmp_path) == []
    release.set()
    writer.wait()
    assert np.array_equal(load_checkpoint(target).model["w"], np.arange(12, dtype=np.float32))


def test_a_failed_background_step_is_raised_by_wait_and_leaves_nothing_behind(
    tmp_path, monkeypatch
):
    def failing_install(staging, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_write, "_install", failing_install)
    writer = CheckpointWriter()
    writer.save(tmp_path / "ckpt", **STATE)  # the writing itself succeeds
    with pytest.raises(CheckpointError, match="No space left on device"):
        writer.wait()
    assert os.listdir(tmp_path) == []  # no checkpoint, no staging directory
    writer.wait()  # the error is raised once


def test_the_next_save_waits_for_the_previous_and_raises_its_error(tmp_path, monkeypatch):
    calls = []
    install = _write._install

    def failing_once(staging, target):
        calls.append(target.name)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        install(staging, target)

    monkeypatch.setattr(_write, "_install", failing_once)
    writer = CheckpointWriter()
    writer.save(tmp_path / "first", **STATE)
    with pytest.raises(CheckpointError, match="Input/output error"):
        writer.save(tmp_path / "second", **STATE)
    writer.save(tmp_path / "third", **STATE)
    writer.wait()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["third"]


def _trainer(tmp_path, callbacks, epochs=3):
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64))
    trainer = Trainer(
        MLP((4, 8, 3)),
        backend="numpy",
        callbacks=callbacks,
        config=TrainerConfig(epochs=epochs, batch_size=16, checkpoint_dir=str(tmp_path)),
    )
    return trainer, data


def test_fit_returns_with_every_background_checkpoint_in_place(tmp_path):
    background = ModelCheckpoint(tmp_path / "bg", keep_last=2)
    trainer, data = _trainer(tmp_path, [background])
    trainer.fit(data)
    durable = ModelCheckpoint(tmp_path / "sync", keep_last=2, background=False)
    again, _ = _trainer(tmp_path, [durable])
    again.fit(data)
    names = [p.name for p in list_checkpoints(tmp_path / "bg")]
    assert names == [p.name for p in list_checkpoints(tmp_path / "sync")] and len(names) == 2
    for name in names:
        a, b = load_checkpoint(tmp_path / "bg" / name), load_checkpoint(tmp_path / "sync" / name)
        assert all(np.array_equal(a.model[k], b.model[k]) for k in a.model)
        assert a.trainer["step"] == b.trainer["step"]


def test_fit_raises_a_failed_background_save(tmp_path, monkeypatch):
    def failing_install(staging, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_write, "_install", failing_install)
    trainer, data = _trainer(tmp_path, [ModelCheckpoint(tmp_path)], epochs=1)
    with pytest.raises(CheckpointError, match="No space left on device"):
        trainer.fit(data)


def test_an_error_in_training_notes_a_failed_background_save(tmp_path, monkeypatch):
    def failing_install(staging, target):
        raise OSError(28, "No space left on device")

    class Boom(Callback):
        def on_epoch_begin(self, trainer, epoch):
            if epoch == 1:
                raise RuntimeError("boom")

    monkeypatch.setattr(_write, "_install", failing_install)
    trainer, data = _trainer(tmp_path, [Boom(), ModelCheckpoint(tmp_path)])
    with pytest.raises(RuntimeError, match="boom") as raised:
        trainer.fit(data)
    assert any("No space left on device" in note for note in raised.value.__notes__)


def test_ctrl_c_is_held_back_while_the_save_thread_starts():
    """A KeyboardInterrupt inside Thread.start would leave a save that cannot be joined."""
    import signal

    from unitrain.checkpoint._write import _interrupts_deferred

    reached = []
    with pytest.raises(KeyboardInterrupt), _interrupts_deferred():
        signal.raise_signal(signal.SIGINT)  # pending until the block ends
        reached.append("the block ran to its end")
    assert reached == ["the block ran to its end"]
