"""Resume equals uninterrupted: bit-exact weights, optimizer state, metrics and decisions.

Interruptions tested: a clean stop after an epoch, an exception mid-epoch, and a real
SIGKILL of the training process at a random step. Each resumed run must end with parameters
and optimizer state bit-identical to a run that was never stopped, the same metric history,
and the same early-stopping and checkpoint decisions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _backends import FRAMEWORKS, backend_param

from unitrain import (
    CheckpointError,
    ConfigError,
    RunState,
    Trainer,
    TrainerConfig,
    callbacks,
    models,
    optim,
    schedules,
)
from unitrain.checkpoint import list_checkpoints
from unitrain.checkpoint._resume import read_resume_point
from unitrain.recipes import load_digits

BACKENDS = [backend_param(b) for b in FRAMEWORKS]
EPOCHS = 6


class Interrupt(Exception):
    """Raised by a callback to stop a run abruptly, as a crash would."""


class InterruptAt:
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, trainer, batch, logs):
        if trainer.state.step == self.step:
            raise Interrupt


@pytest.fixture(scope="module")
def digits():
    split = load_digits()
    # A quarter of the data keeps the six epochs fast; 360 examples, batch 32: 12 steps/epoch.
    return split.x_train[:360], split.y_train[:360], split.x_val[:120], split.y_val[:120]


def make_trainer(backend, out: Path, extra=(), dropout=0.2, optimizer=None):
    steps = 12 * EPOCHS
    schedule = schedules.Warmup(schedules.CosineDecay(0.3, steps - 12, 1e-4), warmup_steps=12)
    hooks = [
        callbacks.EarlyStopping("val_loss", min_delta=0.05, patience=1, restore_best_weights=True),
        callbacks.ReduceLROnPlateau("val_loss", min_delta=0.1, patience=1, factor=0.5),
        callbacks.JSONLLogger(out / "metrics.jsonl"),
        callbacks.LRMonitor("step"),
        callbacks.ModelCheckpoint(
            out / "ckpt", every_n_epochs=1, every_n_steps=5, keep_last=4, monitor="val_accuracy"
        ),
        *extra,
    ]
    config = TrainerConfig(
        epochs=EPOCHS, seed=7, device="cpu", log_every_n_steps=4, checkpoint_dir=str(out / "ckpt")
    )
    return Trainer(
        models.MLP((64, 32, 10), dropout=dropout),
        backend=backend,
        optimizer=optimizer or optim.SGD(momentum=0.9, nesterov=True, weight_decay=1e-4),
        schedule=schedule,
        callbacks=hooks,
        config=config,
    )


def outcome(trainer, out: Path):
    """Everything that must match between an interrupted and an uninterrupted run."""
    early = trainer.callbacks.callbacks[0]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # One run wrote the file, interrupted or not; two runs' ids differ, so it is not compared.
    assert len({row.pop("run_id") for row in lines}) == 1
    for row in lines:
        row.pop("seconds")
    return {
        "state": trainer.backend.state_dict(),
        "history": [{k: v for k, v in row.items() if k != "seconds"} for row in trainer.history],
        "metrics_file": lines,
        "stopped_epoch": early.stopped_epoch,
        "best_epoch": early.best_epoch,
        "lr_factor": trainer.lr_factor,
        "lrs": trainer.callbacks.callbacks[3].values,
        "checkpoints": [p.name for p in list_checkpoints(out / "ckpt")],
    }


def assert_same(a, b):
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert np.array_equal(a["state"][key], b["state"][key]), key
    for key in (
        "history",
        "metrics_file",
        "stopped_epoch",
        "best_epoch",
        "lr_factor",
        "lrs",
        "checkpoints",
    ):
        assert a[key] == b[key], key


@pytest.fixture(scope="module")
def uninterrupted(digits, tmp_path_factory):
    results = {}
    for backend in FRAMEWORKS:
        if importlib.util.find_spec(FRAMEWORKS[backend]) is None:
            continue  # its tests are skipped with a reason
        out = tmp_path_factory.mktemp(f"full-{backend}")
        trainer = make_trainer(backend, out)
        trainer.fit(digits[:2], digits[2:])
        results[backend] = outcome(trainer, out)
    return results


@pytest.mark.parametrize("backend", BACKENDS)
# Epoch ends and mid-epoch steps; 27 resumes from the checkpoint of step 25, batch 1 of its
# epoch, where the restored running loss already holds one batch.
@pytest.mark.parametrize("stop_step", [12, 24, 27, 31, 43])
def test_resume_after_interruption_is_bit_exact(
    backend, stop_step, digits, tmp_path, uninterrupted
):
    first = make_trainer(backend, tmp_path, extra=[InterruptAt(stop_step)])
    with pytest.raises(Interrupt):
        first.fit(digits[:2], digits[2:])
    resumed = make_trainer(backend, tmp_path)
    resumed.fit(digits[:2], digits[2:], resume="latest")
    assert_same(outcome(resumed, tmp_path), uninterrupted[backend])


def test_early_stopping_decision_survives_resume(uninterrupted):
    # The recipe above does stop early; its decision is part of what the resume tests compare.
    # (Dropout masks differ between frameworks, so the two backends need not stop alike here.)
    for result in uninterrupted.values():
        assert result["stopped_epoch"] is not None
        assert result["lr_factor"] < 1.0
        assert "best" in result["checkpoints"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_from_each_checkpoint_gives_the_same_end(backend, digits, tmp_path, uninterrupted):
    """Any surviving checkpoint, not just the latest, continues to the same final state."""
    full = make_trainer(backend, tmp_path / "run")
    full.fit(digits[:2], digits[2:])
    for checkpoint in list_checkpoints(tmp_path / "run" / "ckpt")[:2]:
        out = tmp_path / checkpoint.name
        (out / "ckpt").mkdir(parents=True)
        resumed = make_trainer(backend, out)
        resumed.fit(digits[:2], digits[2:], resume=checkpoint)
        for key, value in uninterrupted[backend]["state"].items():
            assert np.array_equal(resumed.backend.state_dict()[key], value), key


def test_resume_of_a_finished_run_warns_and_keeps_the_result(digits, tmp_path, uninterrupted):
    trainer = make_trainer("numpy", tmp_path)
    trainer.fit(digits[:2], digits[2:])
    again = make_trainer("numpy", tmp_path)
    with pytest.warns(UserWarning, match="already finished"):
        again.fit(digits[:2], digits[2:], resume="latest")
    for key, value in uninterrupted["numpy"]["state"].items():
        assert np.array_equal(again.backend.state_dict()[key], value)


def test_resume_with_another_model_is_refused(digits, tmp_path):
    with pytest.raises(Interrupt):
        make_trainer("numpy", tmp_path, extra=[InterruptAt(13)]).fit(digits[:2], digits[2:])
    other = Trainer(
        models.MLP((64, 16, 10)),
        backend="numpy",
        config=TrainerConfig(checkpoint_dir=str(tmp_path / "ckpt")),
    )
    with pytest.raises(CheckpointError, match="written for model"):
        other.fit(digits[:2], resume="latest")


def test_resume_with_another_optimizer_is_refused(digits, tmp_path):
    with pytest.raises(Interrupt):
        make_trainer("numpy", tmp_path, extra=[InterruptAt(13)]).fit(digits[:2], digits[2:])
    other = make_trainer("numpy", tmp_path, optimizer=optim.Adam())
    with pytest.raises(CheckpointError, match="optimizer"):
        other.fit(digits[:2], digits[2:], resume="latest")


def test_resume_latest_without_any_checkpoint_starts_fresh(tmp_path):
    """An auto-resuming job's first run finds nothing to resume: it warns and trains."""
    data = (np.zeros((4, 64), np.float32), np.zeros(4, np.int64))
    trainer = Trainer(
        models.MLP((64, 16, 10)),
        backend="numpy",
        config=TrainerConfig(epochs=1, checkpoint_dir=str(tmp_path)),
    )
    with pytest.warns(UserWarning, match="starting from scratch"):
        trainer.fit(data, resume="latest")
    assert trainer.state.epoch == 1
    without_dir = Trainer(models.MLP((64, 16, 10)), backend="numpy")
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        without_dir.fit(data, resume="latest")


def test_corrupted_checkpoint_is_refused_and_latest_falls_back(digits, tmp_path):
    with pytest.raises(Interrupt):
        make_trainer("numpy", tmp_path, extra=[InterruptAt(30)]).fit(digits[:2], digits[2:])
    newest = list_checkpoints(tmp_path / "ckpt")[-1]
    with open(newest / "model.safetensors", "r+b") as handle:
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        make_trainer("numpy", tmp_path).fit(digits[:2], digits[2:], resume=newest)
    fallback = make_trainer("numpy", tmp_path)
    with pytest.warns(UserWarning, match="skip"):
        fallback.fit(digits[:2], digits[2:], resume="latest")
    assert fallback.state.epoch > 0


# -- a real SIGKILL ----------------------------------------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {shared!r}]  # this test's folder, and tests/ (_backends)
    from test_resume import make_trainer, digits_arrays
    backend, out, kill_step, resume = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

    class Kill:
        def on_batch_end(self, trainer, batch, logs):
            if trainer.state.step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = make_trainer(backend, out, extra=[Kill()] if kill_step else [])
    x, y, xv, yv = digits_arrays()
    trainer.fit((x, y), (xv, yv), resume=resume if resume != "-" else None)
    from safetensors.numpy import save_file
    save_file(trainer.backend.state_dict(), str(out / "final.safetensors"))
    """
)


def digits_arrays():
    split = load_digits()
    return split.x_train[:360], split.y_train[:360], split.x_val[:120], split.y_val[:120]


def run_script(backend, out, kill_step, resume):
    code = SCRIPT.format(tests=str(Path(__file__).parent), shared=str(Path(__file__).parents[1]))
    return subprocess.run(
        [sys.executable, "-c", code, backend, str(out), str(kill_step), resume],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )


@pytest.mark.harness  # a killed and a resumed training subprocess: 7-18 s per backend, alone
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_at_a_random_step_then_resume_is_bit_exact(backend, tmp_path, uninterrupted):
    kill_step = int(np.random.default_rng().integers(1, 12 * 4))
    killed = run_script(backend, tmp_path, kill_step, "-")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_script(backend, tmp_path, 0, "latest")
    assert resumed.returncode == 0, resumed.stderr
    from safetensors.numpy import load_file

    final = load_file(str(tmp_path / "final.safetensors"))
    for key, value in uninterrupted[backend]["state"].items():
        assert np.array_equal(final[key], value), f"{key} differs after a kill at step {kill_step}"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [
        r["epoch"] for r in uninterrupted[backend]["metrics_file"]
    ]


def test_run_state_is_handed_out_and_taken_back_by_the_trainer():
    """run_state() is a copy of where the run stands; restore_run_state() continues from it,
    including the running loss and the LR factor the next update is computed with."""
    x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    schedule = schedules.StepDecay(0.1, step_size=3, gamma=0.5)
    config = TrainerConfig(epochs=2, batch_size=16)
    first = Trainer(models.MLP((4, 3, 2)), backend="numpy", schedule=schedule, config=config)
    first.fit((x, y))
    first.lr_factor = 0.25
    state = first.run_state()
    assert (state.position.epoch, state.position.step, state.position.batch) == (2, 6, 0)
    assert state.lr_factor == 0.25 and [row["epoch"] for row in state.history] == [1, 2]
    first.history.append({"epoch": 3})  # the value is a copy, not a view
    assert len(state.history) == 2

    second = Trainer(models.MLP((4, 3, 2)), backend="numpy", schedule=schedule, config=config)
    second.restore_run_state(RunState(state.position, 12.5, 40, 0.25, 3, state.history))
    assert second.state == state.position and second.state is not state.position
    assert second.lr == second.lr_at(6) == 0.1 * 0.5**2 * 0.25
    assert second.skipped_steps == 3
    assert second.running_totals() == (12.5, 40)
    assert second.run_state() == RunState(state.position, 12.5, 40, 0.25, 3, state.history)


@pytest.mark.parametrize(
    ("epoch", "numbers", "accepted"),
    [
        (2, [1, 2], True),
        (0, [], True),
        (3, [2, 3], True),  # a history may start later; it ends at the finished epochs
        (1, [0], False),  # an edited row number: the resumed history would read 0, 2, 3
        (2, [1], False),  # the last finished epoch has no row
        (1, [1, 2], False),  # a row for an epoch not yet finished
        (2, [1, 3], False),
        (2, [1, "2"], False),
    ],
)
def test_a_history_that_does_not_end_at_the_checkpoint_epoch_is_refused(epoch, numbers, accepted):
    info = {"epoch": epoch, "step": 4 * epoch, "history": [{"epoch": n} for n in numbers]}
    file = Path("ckpt/trainer.json")
    if accepted:
        assert [row["epoch"] for row in read_resume_point(info, file, 4).history] == numbers
    else:
        with pytest.raises(CheckpointError, match="one row per finished epoch"):
            read_resume_point(info, file, 4)
