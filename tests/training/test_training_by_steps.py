"""Training by steps: ``max_steps``, validation every N updates on at most M batches, and a
separate evaluation batch size; exact to resume, and understood by recipes and the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from _backends import backend_param
from _faulty_backends import MultiStepNumpy

from unitrain import (
    ArrayLoader,
    ConfigError,
    Trainer,
    TrainerConfig,
    callbacks,
    models,
    optim,
    schedules,
)
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.strategy import SimulatedWorkers
from unitrain.cli import main
from unitrain.cli.plot import epoch_positions
from unitrain.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def small_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (np.abs(x[:, 0] * 2).astype(np.int64)) % 3
    return x, y


TRAIN, VAL = small_data(64), small_data(40, seed=1)


class _CountingEvaluations(NumpyBackend):
    """Records the size of every batch ``evaluate`` is given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.evaluated: list[int] = []

    def evaluate(self, batch):
        self.evaluated.append(len(batch[0]))
        return super().evaluate(batch)


class StopAt(callbacks.Callback):
    """Stops training after update ``step``: the reference a max_steps run must equal."""

    def __init__(self, step):
        self.step = step

    def on_batch_end(self, trainer, batch, logs):
        if trainer.state.step == self.step:
            trainer.stop("reference")


class StepsSeen(callbacks.Callback):
    """The step after every batch hook: where each (multi-step) call ended."""

    def __init__(self):
        self.steps: list[int] = []

    def on_batch_end(self, trainer, batch, logs):
        self.steps.append(trainer.state.step)


class Interrupt(Exception):
    """Raised by a callback to end a run abruptly, as a crash would."""


class InterruptAt(callbacks.Callback):
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, trainer, batch, logs):
        if trainer.state.step == self.step:
            raise Interrupt


def trainer_for(config, *, backend=NumpyBackend, hooks=(), strategy=None, dropout=0.0):
    return Trainer(
        models.MLP((4, 8, 3), dropout=dropout),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.LinearDecay(0.2, 0.01, 40),
        callbacks=list(hooks),
        config=config,
        strategy=strategy,
    )


def loader():
    return ArrayLoader(*TRAIN, batch_size=8, seed=3)  # 8 batches per epoch


# -- max_steps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "strategy", "updates_per_epoch"),
    [
        ({}, None, 8),
        ({"grad_accum_steps": 2}, None, 4),
        ({}, SimulatedWorkers(2), 8),
    ],
    ids=["plain", "accumulation", "two-simulated-workers"],
)
def test_max_steps_stops_mid_epoch_exactly_where_a_stop_at_that_step_does(
    settings, strategy, updates_per_epoch
):
    max_steps = updates_per_epoch + 3  # three updates into the second epoch
    config = TrainerConfig(epochs=5, batch_size=8, dtype="float64", **settings)
    limited = trainer_for(dataclasses.replace(config, max_steps=max_steps), strategy=strategy)
    history = limited.fit(loader())
    reference = trainer_for(config, hooks=[StopAt(max_steps)], strategy=strategy)
    reference.fit(loader())
    assert limited.state.step == reference.state.step == max_steps
    assert [row["step"] for row in history] == [updates_per_epoch, max_steps]
    assert limited.stop_reason is None  # a limit reached, not a stop decided
    for key, value in reference.backend.state_dict().items():
        assert np.array_equal(limited.backend.state_dict()[key], value), key
    assert history[-1]["loss"] == reference.history[-1]["loss"]


def test_a_multi_step_call_is_shrunk_so_that_max_steps_is_not_overshot():
    """8 batches per epoch, 4 updates per call, max_steps=11: calls end at 4 and 8, then the
    three updates left go one by one; the weights equal single updates'."""
    seen = StepsSeen()
    config = TrainerConfig(epochs=5, batch_size=8, dtype="float64", max_steps=11)
    multi = trainer_for(
        dataclasses.replace(config, steps_per_call=4),
        backend=MultiStepNumpy,
        hooks=[seen],
    )
    multi.fit(loader())
    single = trainer_for(config)
    single.fit(loader())
    assert seen.steps == [4, 8, 9, 10, 11]
    assert multi.state.step == single.state.step == 11
    for key, value in single.backend.state_dict().items():
        np.testing.assert_allclose(multi.backend.state_dict()[key], value, rtol=1e-12, atol=1e-15)


def test_epochs_end_the_run_when_they_come_before_max_steps():
    trainer = trainer_for(TrainerConfig(epochs=2, batch_size=8, max_steps=1000))
    trainer.fit(loader())
    assert trainer.state.step == 16 and trainer.state.epoch == 2


# -- validation by steps -----------------------------------------------------------------------


def test_validation_every_n_steps_makes_rows_at_those_steps_and_validates_the_last():
    trainer = trainer_for(
        TrainerConfig(epochs=5, batch_size=8, max_steps=20, val_every_n_steps=3),
        hooks=[StepsSeen()],
    )
    history = trainer.fit(loader(), VAL)
    assert [row["step"] for row in trainer.step_history] == [3, 6, 9, 12, 15, 18]
    assert [row["epoch"] for row in trainer.step_history] == [1, 1, 2, 2, 2, 3]
    assert all("val_loss" in row and "loss" in row for row in trainer.step_history)
    # Epoch ends are not validated, except the run's last update (20 is not a multiple of 3).
    assert ["val_loss" in row for row in history] == [False, False, True]
    assert history[-1]["step"] == 20


def test_the_last_update_is_not_validated_twice():
    trainer = trainer_for(TrainerConfig(epochs=5, batch_size=8, max_steps=12, val_every_n_steps=6))
    history = trainer.fit(loader(), VAL)
    assert [row["step"] for row in trainer.step_history] == [6, 12]
    assert not any("val_loss" in row for row in history)


def test_two_simulated_workers_validate_by_steps_as_one_worker_does():
    config = TrainerConfig(
        epochs=5, batch_size=8, dtype="float64", max_steps=7, val_every_n_steps=3, val_batches=2
    )
    runs = [trainer_for(config, strategy=strategy) for strategy in (None, SimulatedWorkers(2))]
    for trainer in runs:
        trainer.fit(loader(), VAL)
    one, two = ([(row["step"], row["val_loss"]) for row in t.step_history] for t in runs)
    assert [step for step, _ in two] == [step for step, _ in one] == [3, 6]
    assert [loss for _, loss in two] == pytest.approx([loss for _, loss in one], rel=1e-12)


def test_validation_by_steps_under_multi_step_calls_happens_at_the_call_that_crosses_n():
    trainer = trainer_for(
        TrainerConfig(epochs=1, batch_size=8, steps_per_call=4, val_every_n_steps=3),
        backend=MultiStepNumpy,
    )
    trainer.fit(loader(), VAL)
    assert [row["step"] for row in trainer.step_history] == [4, 8]  # 3 and 6 crossed


def test_val_batches_limits_each_validation_and_eval_batch_size_sets_its_batches():
    config = TrainerConfig(
        epochs=1, batch_size=8, val_every_n_steps=4, val_batches=2, eval_batch_size=5
    )
    trainer = trainer_for(config, backend=_CountingEvaluations)
    trainer.fit(loader(), VAL)
    assert [row["step"] for row in trainer.step_history] == [4, 8]
    # Two validations of two batches of 5 (monitors' name check reads none: no monitors).
    assert trainer.backend.evaluated == [5, 5, 5, 5]
    # The limit is the first batches: the same numbers as validating on those examples.
    whole = trainer_for(TrainerConfig(batch_size=8, eval_batch_size=10))
    whole.backend.load_state_dict(trainer.backend.state_dict())
    first_ten = whole.validate((VAL[0][:10], VAL[1][:10]))
    assert trainer.step_history[-1]["val_loss"] == pytest.approx(first_ten["val_loss"], rel=1e-6)


def test_eval_batch_size_defaults_to_the_training_batch_size():
    trainer = trainer_for(TrainerConfig(batch_size=16), backend=_CountingEvaluations)
    trainer.validate(VAL)
    trainer.test(VAL)
    assert trainer.backend.evaluated == [16, 16, 8] * 2


def test_early_stopping_and_plateau_judge_each_validation_by_steps(capsys):
    hooks = [
        callbacks.EarlyStopping("val_loss", min_delta=10.0, patience=1),
        callbacks.ReduceLROnPlateau("val_loss", min_delta=10.0, patience=1, factor=0.5),
    ]
    trainer = trainer_for(TrainerConfig(epochs=5, batch_size=8, val_every_n_steps=3), hooks=hooks)
    trainer.fit(loader(), VAL)
    # The first validation (step 3) sets the best; none beats it by 10, so the second stops.
    assert trainer.state.step == 6
    assert trainer.stop_reason.startswith("early stopping: val_loss did not improve for 1 valid")
    assert trainer.lr_factor == 0.5
    assert "ReduceLROnPlateau: step 6: lr" in capsys.readouterr().out


def test_model_checkpoint_keeps_the_best_validated_step(tmp_path):
    saver = callbacks.ModelCheckpoint(tmp_path, every_n_epochs=None, monitor="val_loss")
    trainer = trainer_for(TrainerConfig(epochs=2, batch_size=8, val_every_n_steps=2), hooks=[saver])
    trainer.fit(loader(), VAL)
    best_step = min(trainer.step_history, key=lambda row: row["val_loss"])["step"]
    saved = json.loads((tmp_path / "best" / "trainer.json").read_text())
    assert saved["step"] == best_step and saver.best == pytest.approx(
        min(row["val_loss"] for row in trainer.step_history)
    )


def test_loggers_write_a_row_and_a_line_per_validation_by_steps(tmp_path, capsys):
    hooks = [callbacks.ConsoleLogger(), callbacks.JSONLLogger(tmp_path / "metrics.jsonl")]
    trainer = trainer_for(
        TrainerConfig(epochs=5, batch_size=8, max_steps=10, val_every_n_steps=4), hooks=hooks
    )
    trainer.fit(loader(), VAL)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], "val_loss" in row) for row in rows] == [
        (4, True),
        (8, True),
        (8, False),
        (10, True),
    ]
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("step 4/10 (epoch 1): loss=") and "val_loss=" in printed[1]
    assert printed[-1].startswith("epoch 2/5: loss=") and "val_loss=" in printed[-1]


# -- resume ------------------------------------------------------------------------------------


def resumable(out: Path, extra=()):
    hooks = [
        callbacks.EarlyStopping("val_loss", min_delta=0.02, patience=20),
        callbacks.ReduceLROnPlateau("val_loss", min_delta=0.01, patience=1, factor=0.5),
        callbacks.JSONLLogger(out / "metrics.jsonl"),
        callbacks.ModelCheckpoint(
            out / "ckpt", every_n_epochs=1, every_n_steps=4, monitor="val_loss"
        ),
        *extra,
    ]
    config = TrainerConfig(
        epochs=6,
        batch_size=8,
        max_steps=30,
        val_every_n_steps=3,
        val_batches=3,
        eval_batch_size=6,
        log_every_n_steps=5,
        checkpoint_dir=str(out / "ckpt"),
    )
    return trainer_for(config, hooks=hooks, dropout=0.2)


def outcome(trainer, out: Path):
    def timeless(rows):
        return [{k: v for k, v in row.items() if k not in ("seconds", "run_id")} for row in rows]

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "state": trainer.backend.state_dict(),
        "position": trainer.state,
        "history": timeless(trainer.history),
        "step_history": timeless(trainer.step_history),
        "metrics_file": timeless(lines),
        "lr_factor": trainer.lr_factor,
        "best": trainer.callbacks.callbacks[0].best,
    }


@pytest.mark.parametrize("stop_step", [10, 14, 21])  # mid-epoch, after 12 was validated, ...
def test_a_run_by_steps_resumed_mid_epoch_ends_bit_identical(tmp_path, stop_step):
    full = resumable(tmp_path / "full")
    full.fit(loader(), VAL)
    expected = outcome(full, tmp_path / "full")
    assert expected["position"].step == 30 and len(expected["step_history"]) == 10
    assert expected["lr_factor"] < 1.0  # the plateau's decisions are part of what is compared

    out = tmp_path / "stopped"
    with pytest.raises(Interrupt):
        resumable(out, extra=[InterruptAt(stop_step)]).fit(loader(), VAL)
    resumed = resumable(out)
    resumed.fit(loader(), VAL, resume="latest")
    got = outcome(resumed, out)
    assert got["state"].keys() == expected["state"].keys()
    for key, value in expected["state"].items():
        assert np.array_equal(got["state"][key], value), key
    for key in ("position", "history", "step_history", "metrics_file", "lr_factor", "best"):
        assert got[key] == expected[key], key


def test_resuming_a_run_that_reached_max_steps_warns_and_trains_nothing(tmp_path):
    first = trainer_for(
        TrainerConfig(epochs=5, batch_size=8, max_steps=11, checkpoint_dir=str(tmp_path)),
        hooks=[callbacks.ModelCheckpoint()],
    )
    first.fit(loader())
    again = trainer_for(first.config, hooks=[callbacks.ModelCheckpoint()])
    with pytest.warns(UserWarning, match="already finished .*step 11 of 11"):
        again.fit(loader(), resume="latest")
    assert again.state.step == 11


def test_a_damaged_step_history_in_a_checkpoint_is_refused(tmp_path):
    trainer = trainer_for(
        TrainerConfig(epochs=1, batch_size=8, val_every_n_steps=4, checkpoint_dir=str(tmp_path)),
        hooks=[callbacks.ModelCheckpoint()],
    )
    trainer.fit(loader(), VAL)
    (checkpoint,) = [p for p in tmp_path.iterdir() if p.name.startswith("epoch=")]
    info = json.loads((checkpoint / "trainer.json").read_text())
    info["step_history"][-1]["step"] = 99  # after the checkpoint's step 8
    (checkpoint / "trainer.json").write_text(json.dumps(info))
    from unitrain import CheckpointError
    from unitrain.training._run_state import restore

    with pytest.raises(CheckpointError, match="step_history"):
        restore(trainer_for(trainer.config), checkpoint)


# -- sizing a schedule, recipes and the command line -------------------------------------------


def test_a_warmup_longer_than_max_steps_is_refused_naming_max_steps():
    schedule = schedules.Warmup(schedules.Constant(0.1), warmup_steps=20)
    trainer = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        schedule=schedule,
        config=TrainerConfig(epochs=5, batch_size=8, max_steps=10),
    )
    with pytest.raises(ConfigError, match=r"run of 10 updates \(max_steps=10\)"):
        trainer.fit(loader())


def test_a_toml_schedule_in_epochs_is_sized_to_max_steps():
    recipe = load_recipe(
        str(ROOT / "examples" / "recipes" / "digits.toml"),
        ["config.epochs=3", "config.max_steps=100", "config.val_every_n_steps=20"],
    )
    assert recipe.config.max_steps == 100 and recipe.config.val_every_n_steps == 20
    # 45 updates per epoch: one epoch of warmup, then the cosine until step 100, not 135.
    assert recipe.schedule.warmup_steps == 45 and recipe.schedule.schedule.decay_steps == 55


def test_the_digits_recipe_with_set_trains_by_steps_and_prints_validation_lines(tmp_path, capsys):
    out = tmp_path / "run"
    settings = ["config.max_steps=7", "config.val_every_n_steps=3", "config.val_batches=2"]
    args = ["train", "--backend", "numpy", "--out", str(out), "--quiet"]
    assert main([*args, *(f"--set={s}" for s in [*settings, "config.eval_batch_size=50"])]) == 0
    printed = capsys.readouterr().out
    assert "10 epochs or 7 steps" in printed
    assert "step 3/7 (epoch 1): loss=" in printed and "step 6/7 (epoch 1): loss=" in printed
    assert "done: max_steps=7 reached in epoch 1" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], "val_loss" in row) for row in rows] == [(3, True), (6, True), (7, True)]
    # unitrain plot puts each validation at its share of the epoch's updates.
    assert epoch_positions(rows) == pytest.approx([3 / 7, 6 / 7, 1.0])


# -- bad values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["max_steps", "val_every_n_steps", "val_batches", "eval_batch_size"]
)
@pytest.mark.parametrize("value", [0, -3, 2.5, True, "10"])
def test_a_bad_count_is_refused_with_what_to_do(name, value):
    with pytest.raises(ConfigError, match=rf"{name} must be an int >= 1 or None, got {name}=.*; "):
        TrainerConfig(**{name: value})


def test_both_validation_cadences_are_refused():
    with pytest.raises(ConfigError, match="set only one of them"):
        TrainerConfig(val_every_n_steps=10, val_every_n_epochs=2)


@pytest.mark.parametrize("name", ["val_every_n_steps", "val_batches"])
def test_validation_settings_without_validation_data_are_refused_before_training(name):
    trainer = trainer_for(TrainerConfig(batch_size=8, **{name: 2}))
    with pytest.raises(ConfigError, match=f"{name}=2 needs validation data; pass val_data"):
        trainer.fit(loader())
    assert trainer.state.step == 0


# -- the same on another backend ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", backend_param("torch")])
def test_max_steps_stops_at_the_same_step_on_torch(backend):
    trainer = trainer_for(
        TrainerConfig(epochs=5, batch_size=8, max_steps=11, val_every_n_steps=4, device="cpu"),
        backend=backend,
    )
    history = trainer.fit(loader(), VAL)
    assert trainer.state.step == 11 and trainer.state.epoch == 2
    assert [row["step"] for row in history] == [8, 11]
    assert [row["step"] for row in trainer.step_history] == [4, 8]
    reference = trainer_for(
        TrainerConfig(epochs=5, batch_size=8, max_steps=11, val_every_n_steps=4, device="cpu")
    )
    reference.fit(loader(), VAL)
    assert history[-1]["val_loss"] == pytest.approx(reference.history[-1]["val_loss"], rel=1e-4)


def test_the_messages_of_these_errors_are_documented_word_for_word():
    documented = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    x, y = np.zeros((64, 4), "float32"), np.zeros(64, "int64")
    warmup = schedules.Warmup(schedules.Constant(0.1), warmup_steps=500)
    mistakes = [
        lambda: TrainerConfig(max_steps=0),
        lambda: TrainerConfig(val_every_n_steps=-1),
        lambda: TrainerConfig(val_batches=0),
        lambda: TrainerConfig(eval_batch_size=0),
        lambda: TrainerConfig(val_every_n_steps=100, val_every_n_epochs=2),
        lambda: trainer_for(TrainerConfig(val_batches=5)).fit((x, y)),
        lambda: Trainer(
            models.MLP((4, 8, 3)),
            backend="numpy",
            schedule=warmup,
            config=TrainerConfig(epochs=3, batch_size=16, max_steps=10),
        ).fit((x, y)),
    ]
    for mistake in mistakes:
        with pytest.raises(ConfigError) as error:
            mistake()
        assert f"| {error.value} |" in documented
