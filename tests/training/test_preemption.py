"""Preemption: SIGTERM/SIGUSR1 save the step reached and exit 143; a restart continues exactly.

In-process tests send the signal from a callback (or from inside a save), so the moment is
exact; the command-line tests send it from outside at a random moment, as Slurm or Kubernetes
would. Every run resumed with ``resume="auto"`` must end with weights bit-identical to an
uninterrupted run (numpy backend: deterministic to the bit).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from unitrain import CheckpointError, Trainer, TrainerConfig, callbacks, models, optim
from unitrain.checkpoint import CheckpointWarning, _write, list_checkpoints, load_checkpoint
from unitrain.training._lock import LOCK_NAME
from unitrain.training._preemption import PREEMPTION_EXIT_STATUS, Preempted

X = np.random.default_rng(0).normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int64")


class SignalAt(callbacks.Callback):
    """Sends ``signals`` to this process when ``hook`` runs at ``step``."""

    def __init__(self, hook: str, step: int, signals=(signal.SIGTERM,)) -> None:
        self.hook, self.step, self.signals = hook, step, signals

    def _send(self, hook: str, trainer) -> None:
        if hook == self.hook and trainer.state.step == self.step:
            for number in self.signals:
                os.kill(os.getpid(), number)

    def on_batch_end(self, trainer, batch, logs) -> None:
        self._send("on_batch_end", trainer)

    def on_validation_begin(self, trainer) -> None:
        self._send("on_validation_begin", trainer)

    def on_epoch_end(self, trainer, epoch, logs) -> None:
        self._send("on_epoch_end", trainer)


def make(folder: Path, *extra, epochs: int = 4, **config) -> Trainer:
    return Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        callbacks=[callbacks.ModelCheckpoint(every_n_epochs=1, keep_last=2), *extra],
        config=TrainerConfig(
            epochs=epochs, batch_size=16, checkpoint_dir=str(folder), log_every_n_steps=4, **config
        ),
    )


def weights(trainer: Trainer) -> dict[str, np.ndarray]:
    return trainer.backend.state_dict()


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, np.ndarray]:
    trainer = make(tmp_path_factory.mktemp("whole"))
    trainer.fit((X, Y), (X[:32], Y[:32]))
    return weights(trainer)


@pytest.mark.parametrize(
    ("hook", "step", "stopped_at"),
    [
        ("on_batch_end", 9, 9),  # mid-epoch (6 batches an epoch)
        ("on_batch_end", 12, 12),  # the last batch of an epoch, before validation
        ("on_validation_begin", 12, 12),  # during validation: answered at the epoch's end
        ("on_epoch_end", 18, 18),  # after the epoch's checkpoint: that one is reused
    ],
)
def test_a_signal_saves_the_step_reached_and_resume_auto_equals_the_whole_run(
    tmp_path, uninterrupted, capsys, hook, step, stopped_at
):
    trainer = make(tmp_path, SignalAt(hook, step))
    with pytest.raises(Preempted) as stopped:
        trainer.fit((X, Y), (X[:32], Y[:32]))
    assert stopped.value.code == PREEMPTION_EXIT_STATUS == 143
    assert trainer.state.step == stopped_at
    assert load_checkpoint(stopped.value.checkpoint).trainer["step"] == stopped_at
    assert list_checkpoints(tmp_path)[-1] == stopped.value.checkpoint
    assert not (tmp_path / LOCK_NAME).exists()  # released
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"unitrain: SIGTERM: stopped at step {stopped_at} ")
    assert str(stopped.value.checkpoint) in line
    resumed = make(tmp_path)
    resumed.fit((X, Y), (X[:32], Y[:32]), resume="auto")
    assert_same(weights(resumed), uninterrupted)


def test_sigusr1_is_a_preemption_signal_and_the_list_is_configurable(tmp_path):
    trainer = make(tmp_path, SignalAt("on_batch_end", 3, (signal.SIGUSR1,)))
    with pytest.raises(Preempted, match="SIGUSR1"):
        trainer.fit((X, Y))
    quiet = make(tmp_path / "b", SignalAt("on_batch_end", 3, (signal.SIGUSR2,)))
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)  # not watched: left alone
    try:
        quiet.fit((X, Y))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert quiet.state.epoch == 4
    watched = make(
        tmp_path / "c",
        SignalAt("on_batch_end", 3, (signal.SIGUSR2,)),
        preemption_signals=["SIGUSR2"],
    )
    with pytest.raises(Preempted, match="SIGUSR2"):
        watched.fit((X, Y))


def test_a_bad_signal_list_is_refused():
    with pytest.raises(Exception, match="preemption_signals: 'SIGNOPE'"):
        TrainerConfig(preemption_signals=["SIGNOPE"])
    with pytest.raises(Exception, match="must be a list of signal names"):
        TrainerConfig(preemption_signals="SIGTERM")


def test_a_second_signal_aborts_without_saving_and_releases_the_lock(tmp_path):
    trainer = make(tmp_path, SignalAt("on_batch_end", 3, (signal.SIGTERM, signal.SIGTERM)))
    with pytest.raises(Preempted) as stopped:
        trainer.fit((X, Y))
    assert stopped.value.checkpoint is None and "aborted without saving" in str(stopped.value)
    assert list_checkpoints(tmp_path) == []
    assert not (tmp_path / LOCK_NAME).exists()


def signal_inside_the_first_save(monkeypatch, number: int):
    """Send ``number`` to this process after the first file of the first save is written;
    return the unpatched pause."""
    pause, sent = _write._pause_for_tests, []

    def signal_once() -> None:
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), number)
        pause()

    monkeypatch.setattr(_write, "_pause_for_tests", signal_once)
    return pause


def test_a_signal_inside_a_save_lets_the_save_finish(tmp_path, uninterrupted, monkeypatch):
    """SIGTERM while a checkpoint's files are written: that save completes, then the run
    checkpoints the step and stops (the save at epoch 1 is the one in progress)."""
    pause = signal_inside_the_first_save(monkeypatch, signal.SIGTERM)
    trainer = make(tmp_path)
    with pytest.raises(Preempted) as stopped:
        trainer.fit((X, Y), (X[:32], Y[:32]))
    assert trainer.state.step == 6
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch=0001-step=000006"]
    assert stopped.value.checkpoint == list_checkpoints(tmp_path)[0]
    monkeypatch.setattr(_write, "_pause_for_tests", pause)
    resumed = make(tmp_path)
    resumed.fit((X, Y), (X[:32], Y[:32]), resume="auto")
    assert_same(weights(resumed), uninterrupted)


def test_ctrl_c_in_the_written_half_of_a_save_keeps_that_checkpoint(tmp_path, monkeypatch):
    """docs/checkpoints.md says Ctrl-C lets the save in progress finish: it used to drop it."""
    signal_inside_the_first_save(monkeypatch, signal.SIGINT)
    trainer = make(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit((X, Y))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch=0001-step=000006"]


def test_without_a_checkpoint_folder_a_signal_still_stops_with_143(tmp_path, capsys):
    trainer = Trainer(
        models.MLP((6, 8, 2)),
        backend="numpy",
        callbacks=[SignalAt("on_batch_end", 2)],
        config=TrainerConfig(epochs=2, batch_size=16),
    )
    with pytest.raises(Preempted) as stopped:
        trainer.fit((X, Y))
    assert stopped.value.checkpoint is None
    assert "nothing saved: set TrainerConfig(checkpoint_dir=...)" in capsys.readouterr().err


def test_restarted_jobs_resume_by_themselves(tmp_path, monkeypatch, uninterrupted):
    """torchrun --max-restarts and a Slurm requeue rerun the same command: resume=None is
    then "auto"; "auto" in an empty folder starts fresh without a warning."""
    trainer = make(tmp_path, SignalAt("on_batch_end", 10))
    with pytest.raises(Preempted):
        trainer.fit((X, Y), (X[:32], Y[:32]), resume="auto")
    for variable in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = make(tmp_path)
    again.fit((X, Y), (X[:32], Y[:32]))
    assert_same(weights(again), uninterrupted)


def test_a_failed_background_save_surfaces_at_the_next_update(tmp_path, monkeypatch):
    """fsync fails (ENOSPC) in the background at the epoch-1 save: the run used to train on
    until the next save. Now it notices at the epoch's end or after the next update (the
    thread may fail after either), saves that step synchronously and says so, or stops."""
    commit, failures, fail_times = _write._Staged.commit, [], [1]

    def failing_commit(self, guard=None) -> None:
        if len(failures) < fail_times[0]:
            failures.append(self.target.name)
            raise CheckpointError(f"{self.target}: could not save the checkpoint: [Errno 28]")
        commit(self, guard)

    monkeypatch.setattr(_write._Staged, "commit", failing_commit)
    trainer = make(tmp_path / "a")
    with pytest.warns(CheckpointWarning, match="synchronously instead") as warned:
        trainer.fit((X, Y))
    assert failures == ["epoch=0001-step=000006"]
    assert re.search(r"saved \S+/epoch=0001-step=00000[67] synchronously", str(warned[0].message))
    assert len(list_checkpoints(tmp_path / "a")) == 2  # keep_last: the run went on to the end

    failures.clear()
    fail_times[0] = 10  # the disk stays full: the run stops with both errors
    trainer = make(tmp_path / "b")
    with pytest.raises(CheckpointError, match="synchronously failed too"):
        trainer.fit((X, Y))
    assert trainer.state.step in (6, 7)


def _cli(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "unitrain.cli",
        "train",
        "--backend",
        "numpy",
        "--quiet",
        "--out",
        str(out),
        "--epochs",
        "6",
        "--set",
        "callbacks.0.patience=100",
        "--set",
        "config.batch_size=8",
        *extra,
    ]


def _final_weights(out: Path) -> dict[str, np.ndarray]:
    return load_checkpoint(list_checkpoints(out / "checkpoints")[-1]).model


def test_sigterm_to_unitrain_train_exits_143_and_resume_auto_finishes_the_same(tmp_path):
    whole = tmp_path / "whole"
    subprocess.run(_cli(whole), check=True, capture_output=True)
    out = tmp_path / "stopped"
    process = subprocess.Popen(_cli(out), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list_checkpoints(out / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("unitrain: SIGTERM: stopped at step ")
    assert not (out / "checkpoints" / LOCK_NAME).exists()
    subprocess.run(_cli(out, "--resume", "auto"), check=True, capture_output=True)
    assert_same(_final_weights(out), _final_weights(whole))
