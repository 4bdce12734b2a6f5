"""Tests for unitrain.callbacks: Keras 3 semantics of the monitors, file loggers, dispatch.

Early stopping and plateau LR reduction are checked against small re-implementations of the
Keras 3 rules written here from /work/shared/anchors/keras3.md (keras 3.16.0,
``keras/src/callbacks/early_stopping.py`` and ``reduce_lr_on_plateau.py``), driven by
scripted metric sequences through a fake trainer. Everything that trains uses the numpy
reference backend and a few dozen examples, so the file runs in seconds.
"""

from __future__ import annotations

import copy
import io
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitrain import ConfigError, NonFiniteError, Trainer, TrainerConfig, TrainState, models
from unitrain.backends.state import pack_tensors, unpack_tensors
from unitrain.callbacks import (
    HOOKS,
    Callback,
    CallbackList,
    CSVLogger,
    EarlyStopping,
    JSONLLogger,
    LRMonitor,
    ModelCheckpoint,
    ProgressBar,
    ReduceLROnPlateau,
    TerminateOnNaN,
)
from unitrain.callbacks._monitor import Monitor
from unitrain.checkpoint import list_checkpoints, load_checkpoint
from unitrain.schedules import Constant, StepDecay

# -- helpers ------------------------------------------------------------------------------------


class FakeBackend:
    """Holds named arrays; ``state_dict`` returns copies like a real backend."""

    def __init__(self) -> None:
        self.weights: dict[str, np.ndarray] = {
            "model.layers.0.weight": np.zeros((2, 2)),
            "model.layers.0.bias": np.zeros(2),
            "optimizer.step": np.array(0),
        }

    def set_epoch(self, epoch: int) -> None:
        """Make the parameters recognisably those of ``epoch``."""
        self.weights = {k: np.full_like(v, epoch) for k, v in self.weights.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.weights.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        assert set(state) == set(self.weights)
        self.weights = {k: np.array(v) for k, v in state.items()}


class FakeTrainer:
    """The parts of a Trainer that the monitoring callbacks touch."""

    def __init__(self, *, has_validation: bool = True, base_lr: float = 0.1) -> None:
        self.state = TrainState()
        self.backend = FakeBackend()
        self.has_validation = has_validation
        self.base_lr = base_lr
        self.lr_factor = 1.0
        self.strategy = SimpleNamespace(is_main=True)  # one process: rank 0

    @property
    def lr(self) -> float:
        return self.base_lr * self.lr_factor

    def stop(self, reason: str) -> None:
        self.state.stop_training = True
        self.stop_reason = reason


def drive(
    callback: Any,
    values: list[float],
    *,
    key: str = "score",
    trainer: FakeTrainer | None = None,
    first_epoch: int = 0,
    begin: bool = True,
    end: bool = True,
) -> tuple[FakeTrainer, int | None]:
    """Feed ``values`` as the metric of consecutive epochs; return the epoch that stopped."""
    trainer = trainer or FakeTrainer()
    if begin:
        callback.on_train_begin(trainer)
    stopped = None
    for offset, value in enumerate(values):
        epoch = first_epoch + offset
        trainer.backend.set_epoch(epoch)
        callback.on_epoch_end(trainer, epoch, {"epoch": epoch, "loss": 0.5, key: value})
        if trainer.state.stop_training:
            stopped = epoch
            break
    if end:
        callback.on_train_end(trainer)
    return trainer, stopped


def keras_early_stopping(
    values: list[float],
    *,
    patience: int,
    min_delta: float,
    mode: str,
    baseline: float | None,
    start_from_epoch: int,
) -> tuple[int | None, int | None]:
    """Keras 3 ``EarlyStopping.on_epoch_end``, written out; returns (stop epoch, best epoch).

    Keras stores ``min_delta = abs(min_delta)`` negated in min mode and tests
    ``monitor_op(current - min_delta, reference)``; ``best=None`` improves on anything.
    Keras starts ``best_epoch`` at 0; None here means "no epoch was ever the best".
    """
    delta = abs(min_delta)

    def is_improvement(current: float, reference: float | None) -> bool:
        if reference is None:
            return True
        if mode == "min":
            return current + delta < reference
        return current - delta > reference

    wait, best, best_epoch = 0, None, None
    for epoch, current in enumerate(values):
        if epoch < start_from_epoch:
            continue
        wait += 1
        if is_improvement(current, best):
            best, best_epoch = current, epoch
            if baseline is None or is_improvement(current, baseline):
                wait = 0
            continue
        if wait >= patience and epoch > 0:
            return epoch, best_epoch
    return None, best_epoch


def keras_reduce_lr(
    values: list[float],
    *,
    lr: float,
    factor: float,
    patience: int,
    min_delta: float,
    cooldown: int,
    min_lr: float,
    mode: str,
) -> list[float]:
    """Keras 3 ``ReduceLROnPlateau.on_epoch_end``, written out; the LR after each epoch."""
    better = (lambda a, b: a < b - min_delta) if mode == "min" else (lambda a, b: a > b + min_delta)
    best = math.inf if mode == "min" else -math.inf
    wait = cooldown_counter = 0
    lrs = []
    for current in values:
        if cooldown_counter > 0:
            cooldown_counter -= 1
            wait = 0
        if better(current, best):
            best, wait = current, 0
        elif not cooldown_counter > 0:
            wait += 1
            if wait >= patience and lr > min_lr:
                lr = max(lr * factor, min_lr)
                cooldown_counter, wait = cooldown, 0
        lrs.append(lr)
    return lrs


def tiny_data(n: int = 16, features: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, features)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def make_trainer(callbacks: list[Any], schedule: Any = None, **config: Any) -> Trainer:
    settings_ = {"epochs": 2, "batch_size": 4, **config}
    return Trainer(
        models.MLP((3, 4, 2)),
        backend="numpy",
        schedule=schedule,
        callbacks=callbacks,
        config=TrainerConfig(**settings_),
    )


class Scripted(Callback):
    """Adds a scripted metric to each epoch's logs (before callbacks listed after it)."""

    def __init__(self, name: str, values: list[float]) -> None:
        self.name, self.values = name, values

    @property
    def state_key(self) -> str:
        return f"Scripted[{self.name}]"

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        logs[self.name] = self.values[epoch]


# Metric values on a grid of quarters with quarter deltas: every sum and difference is exact
# in binary floating point, so Keras's `current + d < best` and unitrain's `current < best - d`
# agree bit for bit and the equality boundaries are really exercised.
quarters = st.integers(-8, 8).map(lambda k: k / 4)


# -- EarlyStopping ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(quarters, min_size=1, max_size=12),
    patience=st.integers(0, 4),
    min_delta=st.sampled_from([-0.5, -0.25, 0.0, 0.25, 0.5]),
    mode=st.sampled_from(["min", "max"]),
    baseline=st.none() | quarters,
    start_from_epoch=st.integers(0, 4),
)
def test_early_stopping_matches_keras3_rules(
    values, patience, min_delta, mode, baseline, start_from_epoch
):
    rules = dict(
        patience=patience,
        min_delta=min_delta,
        mode=mode,
        baseline=baseline,
        start_from_epoch=start_from_epoch,
    )
    expected_stop, expected_best = keras_early_stopping(values, **rules)
    callback = EarlyStopping(monitor="score", **rules)
    trainer, stopped = drive(callback, values)
    assert stopped == expected_stop
    assert callback.stopped_epoch == expected_stop
    assert callback.best_epoch == expected_best
    assert trainer.state.stop_training is (expected_stop is not None)


def test_early_stopping_patience_two_stops_at_epoch_three():
    callback = EarlyStopping(monitor="val_loss", patience=2)
    _, stopped = drive(callback, [1.0, 0.9, 0.95, 0.96], key="val_loss")
    assert stopped == 3
    assert callback.best_epoch == 1
    assert callback.best == 0.9


def test_early_stopping_patience_zero_stops_at_first_non_improvement_but_not_at_epoch_0():
    callback = EarlyStopping(monitor="score", mode="min", patience=0)
    _, stopped = drive(callback, [3.0, 2.0, 2.0, 1.0])
    assert stopped == 2


@pytest.mark.parametrize("first", [float("inf"), float("nan")])
def test_early_stopping_never_stops_at_epoch_0(first):
    # A first value that improves on nothing (inf, NaN) with patience 0 still does not stop:
    # Keras checks patience only after the first epoch.
    callback = EarlyStopping(monitor="score", mode="min", patience=0)
    _, stopped = drive(callback, [first, 1.0, 2.0])
    assert stopped == 2
    assert callback.best_epoch == 1


@pytest.mark.parametrize("min_delta", [0.1, -0.1])
def test_early_stopping_ignores_the_sign_of_min_delta(min_delta):
    # 0.95 beats 1.0 by 0.05 < |min_delta|: not an improvement either way round.
    callback = EarlyStopping(monitor="val_loss", patience=1, min_delta=min_delta)
    _, stopped = drive(callback, [1.0, 0.95, 0.5], key="val_loss")
    assert stopped == 1
    assert callback.best_epoch == 0
    assert callback.monitor.min_delta == 0.1


def test_early_stopping_min_delta_boundary_is_strict():
    # 0.75 == 1.0 - 0.25 exactly: Keras needs strictly more than min_delta.
    callback = EarlyStopping(monitor="score", mode="min", patience=1, min_delta=0.25)
    _, stopped = drive(callback, [1.0, 0.75, 0.5])
    assert stopped == 1


@pytest.mark.parametrize(("mode", "values"), [("min", [1.0, 1.0, 0.0]), ("max", [1.0, 1.0, 2.0])])
def test_early_stopping_an_equal_value_is_no_improvement(mode, values):
    callback = EarlyStopping(monitor="score", mode=mode, patience=1)
    _, stopped = drive(callback, values)
    assert stopped == 1
    assert callback.best_epoch == 0


def test_early_stopping_baseline_not_beaten_stops_after_patience_while_improving():
    callback = EarlyStopping(monitor="val_loss", patience=2, baseline=0.5)
    _, stopped = drive(callback, [1.0, 0.9, 0.8, 0.7, 0.6], key="val_loss")
    # Every epoch improves on the best (best_epoch follows) but none beats the baseline, so
    # wait is never reset. Keras 3 returns right after an improvement, so the patience check
    # runs only on non-improving epochs, which never come here: the run ends with wait == 5.
    # (tf.keras 2 checked patience on improving epochs too and would have stopped at epoch 2.)
    expected_stop, expected_best = keras_early_stopping(
        [1.0, 0.9, 0.8, 0.7, 0.6],
        patience=2,
        min_delta=0.0,
        mode="min",
        baseline=0.5,
        start_from_epoch=0,
    )
    assert (stopped, callback.best_epoch) == (expected_stop, expected_best) == (None, 4)
    assert callback.wait == 5


def test_early_stopping_baseline_not_beaten_stops_at_first_non_improvement_after_patience():
    callback = EarlyStopping(monitor="val_loss", patience=2, baseline=0.5)
    _, stopped = drive(callback, [1.0, 0.9, 0.8, 0.8, 0.7], key="val_loss")
    # wait reaches 3 at epoch 2 without resetting; epoch 3 does not improve -> stop.
    assert stopped == 3
    assert callback.best_epoch == 2


def test_early_stopping_beating_the_baseline_resets_wait():
    callback = EarlyStopping(monitor="val_loss", patience=2, baseline=0.95)
    _, stopped = drive(callback, [1.0, 0.9, 0.91, 0.92, 0.93], key="val_loss")
    assert stopped == 3
    assert callback.best_epoch == 1


def test_early_stopping_start_from_epoch_ignores_warmup_epochs():
    callback = EarlyStopping(monitor="score", mode="min", patience=1, start_from_epoch=2)
    _, stopped = drive(callback, [0.1, 0.2, 5.0, 4.0, 4.5])
    assert stopped == 4
    assert callback.best_epoch == 3


def test_early_stopping_skips_epochs_without_validation():
    callback = EarlyStopping(monitor="val_loss", patience=1)
    trainer = FakeTrainer()
    callback.on_train_begin(trainer)
    callback.on_epoch_end(trainer, 0, {"loss": 1.0, "val_loss": 1.0})
    callback.on_epoch_end(trainer, 1, {"loss": 1.0})  # not validated: no wait
    assert callback.wait == 0 and not trainer.state.stop_training
    callback.on_epoch_end(trainer, 2, {"loss": 1.0, "val_loss": 1.0})
    assert trainer.state.stop_training and callback.stopped_epoch == 2


@pytest.mark.parametrize("stop_early", [True, False])
def test_restore_best_weights_restores_exactly_the_best_epoch(stop_early):
    values = [1.0, 0.5, 0.7, 0.8, 0.9] if stop_early else [1.0, 0.5, 0.7, 0.4, 0.6]
    callback = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    trainer, stopped = drive(callback, values, key="val_loss")
    assert stopped == (3 if stop_early else None)
    best = 1 if stop_early else 3
    last = 3 if stop_early else 4
    assert callback.best_epoch == best
    weights = trainer.backend.weights
    np.testing.assert_array_equal(weights["model.layers.0.weight"], np.full((2, 2), best))
    np.testing.assert_array_equal(weights["model.layers.0.bias"], np.full(2, best))
    # Only model parameters are restored; the optimizer state stays where training ended.
    np.testing.assert_array_equal(weights["optimizer.step"], last)


@pytest.mark.parametrize("start_from_epoch", [0, 2])
def test_restore_best_weights_keeps_the_first_monitored_epoch_when_nothing_improves(
    start_from_epoch,
):
    """A metric that never improves (NaN) restores the weights of the first epoch watched,
    as Keras does: "if best weights were never set, the current weights are the best"."""
    callback = EarlyStopping(
        monitor="val_loss",
        patience=10,
        restore_best_weights=True,
        start_from_epoch=start_from_epoch,
    )
    trainer, stopped = drive(callback, [math.nan] * 5, key="val_loss")
    assert stopped is None and callback.best_epoch is None
    weights = trainer.backend.weights
    np.testing.assert_array_equal(weights["model.layers.0.bias"], np.full(2, start_from_epoch))
    np.testing.assert_array_equal(weights["optimizer.step"], 4)


def test_restore_best_weights_with_no_monitored_epoch_keeps_the_last_weights():
    # Every epoch is before start_from_epoch: no snapshot was taken, so nothing is restored.
    callback = EarlyStopping(monitor="val_loss", restore_best_weights=True, start_from_epoch=5)
    trainer, stopped = drive(callback, [1.0, 0.5, 0.7], key="val_loss")
    assert stopped is None and callback.best_weights is None
    np.testing.assert_array_equal(trainer.backend.weights["model.layers.0.bias"], [2, 2])


def test_without_restore_best_weights_the_last_weights_stay():
    callback = EarlyStopping(monitor="val_loss", patience=1)
    trainer, stopped = drive(callback, [1.0, 0.5, 0.7], key="val_loss")
    assert stopped == 2
    np.testing.assert_array_equal(trainer.backend.weights["model.layers.0.bias"], [2, 2])


def test_restore_best_weights_in_a_real_run_matches_the_weights_of_the_best_epoch():
    snapshots: dict[int, dict[str, np.ndarray]] = {}

    class Snapshot(Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            snapshots[epoch] = trainer.backend.state_dict()

    # Scripted metric: best at epoch 1, training runs to the end (no stop with patience 5).
    stopper = EarlyStopping(monitor="score", mode="max", patience=5, restore_best_weights=True)
    trainer = make_trainer([Scripted("score", [0.1, 0.9, 0.3, 0.2]), Snapshot(), stopper], epochs=4)
    trainer.fit(tiny_data())
    assert stopper.best_epoch == 1 and stopper.stopped_epoch is None
    final = trainer.backend.state_dict()
    assert not np.array_equal(
        snapshots[1]["model.layers.0.weight"], snapshots[3]["model.layers.0.weight"]
    )
    for key, value in final.items():
        expected = snapshots[1][key] if key.startswith("model.") else snapshots[3][key]
        np.testing.assert_array_equal(value, expected, err_msg=key)


@pytest.mark.parametrize(
    ("monitor", "mode"),
    [
        ("val_loss", "min"),
        ("loss", "min"),
        ("val_accuracy", "max"),
        ("val_acc", "max"),
        ("val_mse", "min"),
    ],
)
def test_auto_mode_from_the_metric_name(monitor, mode):
    assert EarlyStopping(monitor=monitor).monitor.mode == mode
    assert ReduceLROnPlateau(monitor=monitor).monitor.mode == mode


def test_auto_mode_refuses_to_guess_an_unknown_name():
    with pytest.raises(ConfigError, match=r"'foo'.*mode='min' or mode='max'"):
        EarlyStopping(monitor="foo")
    assert EarlyStopping(monitor="foo", mode="max").monitor.mode == "max"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"patience": -1}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"start_from_epoch": -2}, "start_from_epoch"),
        ({"mode": "up"}, "mode"),
        ({"min_delta": float("nan")}, "min_delta"),
        ({"monitor": ""}, "monitor"),
    ],
)
def test_early_stopping_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EarlyStopping(**kwargs)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(quarters, min_size=2, max_size=12),
    split=st.integers(1, 11),
    patience=st.integers(0, 3),
    min_delta=st.sampled_from([0.0, 0.25]),
    baseline=st.none() | quarters,
    restore=st.booleans(),
)
def test_early_stopping_state_round_trip_continues_identically(
    values, split, patience, min_delta, baseline, restore
):
    split = min(split, len(values) - 1)

    def make() -> EarlyStopping:
        return EarlyStopping(
            monitor="score",
            mode="min",
            patience=patience,
            min_delta=min_delta,
            baseline=baseline,
            restore_best_weights=restore,
        )

    whole = make()
    whole_trainer, whole_stop = drive(whole, values)

    first = make()
    trainer, stop = drive(first, values[:split], end=False)
    if stop is None:
        # Through a checkpoint: arrays move out, the rest goes through (non-strict) JSON.
        tensors: dict[str, np.ndarray] = {}
        packed = json.loads(json.dumps(pack_tensors(first.state_dict(), "cb", tensors)))
        state = unpack_tensors(packed, copy.deepcopy(tensors))
        second = make()
        resumed = FakeTrainer()
        second.on_train_begin(resumed)  # the Trainer calls on_train_begin before loading
        second.load_state_dict(state)
        resumed_trainer, stop = drive(
            second, values[split:], trainer=resumed, first_epoch=split, begin=False
        )
        finished = second
    else:
        first.on_train_end(trainer)
        resumed_trainer, finished = trainer, first
    assert stop == whole_stop
    assert finished.stopped_epoch == whole.stopped_epoch
    assert finished.best_epoch == whole.best_epoch
    assert finished.best == whole.best
    assert finished.wait == whole.wait
    for key, value in whole_trainer.backend.weights.items():
        np.testing.assert_array_equal(resumed_trainer.backend.weights[key], value, err_msg=key)


def test_early_stopping_on_train_begin_resets_a_previous_run():
    callback = EarlyStopping(monitor="score", mode="min", patience=0)
    drive(callback, [1.0, 2.0])
    assert callback.stopped_epoch == 1
    _, stopped = drive(callback, [5.0, 4.0, 3.0])
    assert stopped is None and callback.best == 3.0 and callback.best_epoch == 2


@pytest.mark.parametrize(
    "resume_at", ["epoch=0001-step=000003", "epoch=0003-step=000009", "epoch=0004-step=000015"]
)
def test_early_stopping_resumed_from_a_checkpoint_stops_like_an_uninterrupted_run(
    tmp_path, resume_at
):
    scores = [0.5, 0.4, 0.45, 0.3, 0.35, 0.36, 0.37, 0.38]

    def run(directory: Path, resume: Path | None = None) -> tuple[Trainer, EarlyStopping]:
        stopper = EarlyStopping(monitor="score", mode="min", patience=2, restore_best_weights=True)
        checkpoint = ModelCheckpoint(directory, every_n_epochs=None, every_n_steps=3)
        trainer = make_trainer([Scripted("score", scores), stopper, checkpoint], epochs=8)
        trainer.fit(tiny_data(), resume=resume)
        return trainer, stopper

    whole, whole_stopper = run(tmp_path / "a")
    assert (whole_stopper.stopped_epoch, whole_stopper.best_epoch) == (5, 3)
    resumed, stopper = run(tmp_path / "b", resume=tmp_path / "a" / resume_at)
    assert (stopper.stopped_epoch, stopper.best_epoch, stopper.best) == (5, 3, 0.3)
    assert resumed.state == whole.state
    expected = whole.backend.state_dict()
    for key, value in resumed.backend.state_dict().items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


# -- ReduceLROnPlateau --------------------------------------------------------------------------


def lr_trajectory(
    callback: ReduceLROnPlateau, values: list[float], base_lr: float = 0.1
) -> list[float]:
    trainer = FakeTrainer(base_lr=base_lr)
    callback.on_train_begin(trainer)
    lrs = []
    for epoch, value in enumerate(values):
        callback.on_epoch_end(trainer, epoch, {"loss": 1.0, "score": value})
        lrs.append(trainer.lr)
    return lrs


@pytest.mark.parametrize(
    ("kwargs", "values", "expected"),
    [
        # patience 2 on a flat metric: reduce every second epoch.
        ({"factor": 0.5, "patience": 2}, [1, 1, 1, 1, 1], [0.1, 0.1, 0.05, 0.05, 0.025]),
        # an improvement resets wait.
        ({"factor": 0.5, "patience": 2}, [1, 1, 0.5, 0.5, 0.5], [0.1, 0.1, 0.1, 0.1, 0.05]),
        # cooldown 2: the epoch after a reduction neither waits nor reduces (Keras counts the
        # cooldown down before testing it, so cooldown=c idles c - 1 epochs).
        (
            {"factor": 0.5, "patience": 1, "cooldown": 2},
            [1, 1, 1, 1, 1, 1],
            [0.1, 0.05, 0.05, 0.025, 0.025, 0.0125],
        ),
        # Keras quirk kept: cooldown=1 is used up in the very epoch that checks it.
        ({"factor": 0.5, "patience": 1, "cooldown": 1}, [1, 1, 1], [0.1, 0.05, 0.025]),
        # min_lr clamps and then stops reductions.
        ({"factor": 0.1, "patience": 1, "min_lr": 0.003}, [1, 1, 1, 1], [0.1, 0.01, 0.003, 0.003]),
        # min_delta: a gain of 0.05 < 0.1 is not an improvement.
        ({"factor": 0.5, "patience": 1, "min_delta": 0.1}, [1, 0.95, 0.8], [0.1, 0.05, 0.05]),
    ],
)
def test_reduce_lr_on_plateau_scripted(kwargs, values, expected):
    callback = ReduceLROnPlateau(monitor="score", mode="min", **{"min_delta": 0.0, **kwargs})
    assert lr_trajectory(callback, [float(v) for v in values]) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(quarters, min_size=1, max_size=15),
    factor=st.sampled_from([0.1, 0.5, 0.25]),
    patience=st.integers(0, 3),
    min_delta=st.sampled_from([0.0, 0.25]),
    cooldown=st.integers(0, 3),
    min_lr=st.sampled_from([0.0, 0.01, 0.03]),
    mode=st.sampled_from(["min", "max"]),
)
def test_reduce_lr_on_plateau_matches_keras3_rules(
    values, factor, patience, min_delta, cooldown, min_lr, mode
):
    rules = dict(
        factor=factor,
        patience=patience,
        min_delta=min_delta,
        cooldown=cooldown,
        min_lr=min_lr,
        mode=mode,
    )
    expected = keras_reduce_lr(values, lr=0.1, **rules)
    got = lr_trajectory(ReduceLROnPlateau(monitor="score", **rules), values)
    assert got == pytest.approx(expected, rel=1e-9)
    assert min(got) >= min_lr * (1 - 1e-12)


def test_reduce_lr_on_plateau_at_min_lr_keeps_waiting_without_cooling_down():
    """At ``min_lr`` a plateau cannot lower the LR, and (as in Keras) it neither resets
    ``wait`` nor starts a cooldown: when the schedule raises the LR again, a plateau that
    has lasted long enough reduces it at once."""
    callback = ReduceLROnPlateau(
        monitor="score", mode="min", factor=0.5, patience=2, cooldown=3, min_lr=0.1
    )
    trainer = FakeTrainer(base_lr=0.1)
    callback.on_train_begin(trainer)
    for epoch in range(4):
        callback.on_epoch_end(trainer, epoch, {"score": 1.0})
    assert trainer.lr == 0.1
    assert (callback.wait, callback.cooldown_counter) == (3, 0)  # epoch 0 was the best
    trainer.base_lr = 0.4  # the schedule's LR rises
    callback.on_epoch_end(trainer, 4, {"score": 1.0})
    assert trainer.lr == pytest.approx(0.2, rel=1e-12)


def test_reduce_lr_on_plateau_state_round_trip():
    values = [1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5]
    rules = dict(monitor="score", mode="min", factor=0.5, patience=1, cooldown=2, min_delta=0.0)
    whole = lr_trajectory(ReduceLROnPlateau(**rules), values)
    first, trainer = ReduceLROnPlateau(**rules), FakeTrainer()
    first.on_train_begin(trainer)
    for epoch, value in enumerate(values[:4]):
        first.on_epoch_end(trainer, epoch, {"score": value})
    state = json.loads(json.dumps(first.state_dict()))
    second = ReduceLROnPlateau(**rules)
    second.on_train_begin(trainer)  # the lr_factor lives in the trainer (and its checkpoint)
    second.load_state_dict(state)
    lrs = []
    for epoch, value in enumerate(values[4:], start=4):
        second.on_epoch_end(trainer, epoch, {"score": value})
        lrs.append(trainer.lr)
    assert lrs == pytest.approx(whole[4:], rel=1e-12)


def test_reduce_lr_on_plateau_prints_one_line_per_reduction(capsys):
    """A reduction is said, as Keras's ``verbose=1`` does: the epoch, the old and new LR,
    the monitored value. Silence made a halved LR in the logs look like a training bug."""
    callback = ReduceLROnPlateau(monitor="score", mode="min", factor=0.5, patience=2)
    lr_trajectory(callback, [1.0, 1.0, 1.0, 0.5])
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "ReduceLROnPlateau: epoch 3: lr 0.1 -> 0.05 (score=1, no improvement on 1 for 2 epochs)"
    ]


@pytest.mark.parametrize("verbose, is_main", [(False, True), (True, False)])
def test_reduce_lr_on_plateau_is_silent_when_asked_or_off_rank_0(capsys, verbose, is_main):
    callback = ReduceLROnPlateau(monitor="score", mode="min", patience=0, verbose=verbose)
    trainer = FakeTrainer()
    trainer.strategy.is_main = is_main
    callback.on_train_begin(trainer)
    for epoch in range(3):
        callback.on_epoch_end(trainer, epoch, {"score": 1.0})
    assert trainer.lr < 0.1 and capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"factor": 1.0}, "factor"),
        ({"factor": 0.0}, "factor"),
        ({"patience": -1}, "patience"),
        ({"cooldown": 1.5}, "cooldown"),
        ({"min_lr": -1e-3}, "min_lr"),
    ],
)
def test_reduce_lr_on_plateau_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ReduceLROnPlateau(**kwargs)


def test_reduce_lr_on_plateau_in_a_real_run_lowers_the_lr_after_the_plateau():
    lrs = LRMonitor("step")
    trainer = make_trainer(
        [
            Scripted("plateau", [3.0, 2.0, 2.0, 2.0, 2.0]),
            ReduceLROnPlateau(monitor="plateau", mode="min", factor=0.5, patience=1, min_delta=0.0),
            lrs,
        ],
        schedule=Constant(0.2),
        epochs=5,
    )
    history = trainer.fit(tiny_data())
    # epoch 2 does not improve -> the LR of epoch 3 is halved, and again after epochs 3, 4.
    assert [row["lr"] for row in history] == pytest.approx([0.2, 0.2, 0.2, 0.1, 0.05])
    per_step = [lr for _, lr in lrs.values]
    assert per_step == pytest.approx([0.2] * 12 + [0.1] * 4 + [0.05] * 4)
    assert trainer.lr_factor == pytest.approx(0.125)


# -- ModelCheckpoint (needs save_checkpoint(callbacks=...)) ------------------------------------


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_model_checkpoint_every_n_epochs(tmp_path):
    trainer = make_trainer([ModelCheckpoint(tmp_path, every_n_epochs=2)], epochs=5)
    trainer.fit(tiny_data())  # 4 updates per epoch
    assert _names(tmp_path) == ["epoch=0002-step=000008", "epoch=0004-step=000016"]
    info = load_checkpoint(tmp_path / "epoch=0004-step=000016").trainer
    assert (info["epoch"], info["step"], info["batch"]) == (4, 16, 0)


def test_model_checkpoint_every_n_steps_names_epoch_and_step(tmp_path):
    checkpoint = ModelCheckpoint(tmp_path, every_n_epochs=None, every_n_steps=3)
    trainer = make_trainer([checkpoint], epochs=2)
    trainer.fit(tiny_data())
    # The name counts epochs from 1, as the console and metric files do: step 3 is in epoch 1.
    assert _names(tmp_path) == ["epoch=0001-step=000003", "epoch=0002-step=000006"]
    info = load_checkpoint(tmp_path / "epoch=0002-step=000006").trainer
    assert (info["epoch"], info["step"], info["batch"]) == (1, 6, 2)
    assert checkpoint.last_saved == tmp_path / "epoch=0002-step=000006"


def test_a_step_saved_by_step_and_at_its_epoch_end_has_one_name(tmp_path):
    checkpoint = ModelCheckpoint(tmp_path, every_n_epochs=1, every_n_steps=4)
    trainer = make_trainer([checkpoint], epochs=2)
    trainer.fit(tiny_data())  # 4 updates per epoch: each epoch's last step is saved twice
    assert _names(tmp_path) == ["epoch=0001-step=000004", "epoch=0002-step=000008"]
    # The later save (at the epoch's end, with the epoch counted as done) replaced the first.
    assert load_checkpoint(tmp_path / "epoch=0002-step=000008").trainer["batch"] == 0


def test_early_stopping_says_why_training_stopped():
    stopper = EarlyStopping(monitor="score", mode="min", patience=1)
    trainer, stopped = drive(stopper, [1.0, 2.0, 3.0])
    assert stopped == 1
    assert trainer.stop_reason == (
        "early stopping: score did not improve for 1 epochs (best 1 at epoch 1)"
    )


def test_early_stopping_says_when_no_epoch_was_the_best():
    stopper = EarlyStopping(monitor="score", mode="min", patience=1)
    trainer, stopped = drive(stopper, [math.nan, math.nan])
    assert stopped == 1
    assert trainer.stop_reason == (
        "early stopping: score did not improve for 2 epochs (best inf at none)"
    )


def test_a_fit_that_runs_all_its_epochs_has_no_stop_reason():
    trainer = make_trainer([], epochs=2)
    trainer.fit(tiny_data())
    assert trainer.stop_reason is None and trainer.state.epoch == 2


def test_model_checkpoint_keep_last_prunes_the_oldest(tmp_path):
    trainer = make_trainer([ModelCheckpoint(tmp_path, keep_last=2)], epochs=4)
    trainer.fit(tiny_data())
    assert _names(tmp_path) == ["epoch=0003-step=000012", "epoch=0004-step=000016"]
    assert [p.name for p in list_checkpoints(tmp_path)] == _names(tmp_path)


def test_a_resumed_run_that_saves_nothing_more_still_keeps_only_the_last(tmp_path):
    """A kill between a save and its pruning leaves one checkpoint too many; the resumed run
    (here already at its last epoch, so it saves nothing) prunes it when it begins."""
    make_trainer([ModelCheckpoint(tmp_path)], epochs=3).fit(tiny_data())  # keeps all three
    resumed = make_trainer([ModelCheckpoint(tmp_path, keep_last=2)], epochs=3)
    with pytest.warns(UserWarning, match="already finished"):
        resumed.fit(tiny_data(), resume=list_checkpoints(tmp_path)[-1])
    assert _names(tmp_path) == ["epoch=0002-step=000008", "epoch=0003-step=000012"]


def test_model_checkpoint_best_follows_the_monitor(tmp_path):
    scores = [0.2, 0.5, 0.4, 0.9, 0.1]
    seen: list[int] = []

    class ReadBest(Callback):
        def on_epoch_begin(self, trainer, epoch):
            if epoch > 0:
                seen.append(load_checkpoint(tmp_path / "best").trainer["epoch"])

    # background=False: each checkpoint is in place when the hook returns, so the next
    # epoch's callback can read it (with the default, only once fit returns).
    checkpoint = ModelCheckpoint(
        tmp_path, every_n_epochs=None, monitor="score", mode="max", keep_last=1, background=False
    )
    trainer = make_trainer([Scripted("score", scores), ReadBest(), checkpoint], epochs=5)
    trainer.fit(tiny_data())
    # trainer.json's epoch counts epochs done: the best epoch index + 1.
    assert seen == [1, 2, 2, 4]
    assert load_checkpoint(tmp_path / "best").trainer["epoch"] == 4
    assert _names(tmp_path) == ["best"]
    assert checkpoint.best == 0.9


def test_model_checkpoint_best_holds_the_weights_of_the_best_epoch(tmp_path):
    snapshots = {}

    class Snapshot(Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            snapshots[epoch] = trainer.backend.state_dict()

    checkpoint = ModelCheckpoint(
        tmp_path, every_n_epochs=1, monitor="score", mode="min", keep_last=1
    )
    trainer = make_trainer([Scripted("score", [3.0, 1.0, 2.0]), Snapshot(), checkpoint], epochs=3)
    trainer.fit(tiny_data())
    best = load_checkpoint(tmp_path / "best")
    for name, value in best.model.items():
        np.testing.assert_array_equal(value, snapshots[1][f"model.{name}"])
    assert _names(tmp_path) == ["best", "epoch=0003-step=000012"]


def test_model_checkpoint_uses_the_config_directory(tmp_path):
    trainer = make_trainer([ModelCheckpoint()], epochs=1, checkpoint_dir=str(tmp_path / "ckpt"))
    trainer.fit(tiny_data())
    assert _names(tmp_path / "ckpt") == ["epoch=0001-step=000004"]


def test_model_checkpoint_without_a_directory_is_a_config_error():
    trainer = make_trainer([ModelCheckpoint()], epochs=1)
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        trainer.fit(tiny_data())


def test_model_checkpoint_with_nothing_to_save_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="nothing would ever be saved"):
        ModelCheckpoint(tmp_path, every_n_epochs=None)


@pytest.mark.parametrize("name", ["every_n_epochs", "every_n_steps", "keep_last"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_model_checkpoint_rejects_bad_counts(tmp_path, name, value):
    with pytest.raises(ConfigError, match=name):
        ModelCheckpoint(tmp_path, **{name: value})


def test_model_checkpoint_monitor_needs_validation_data(tmp_path):
    trainer = make_trainer([ModelCheckpoint(tmp_path, monitor="val_loss")], epochs=1)
    with pytest.raises(ConfigError, match="val_data"):
        trainer.fit(tiny_data())
    assert not (tmp_path / "best").exists()


# -- JSONL / CSV loggers ----------------------------------------------------------------------


class ReadFile(Callback):
    """Reads a log file from inside on_epoch_end, proving the line was flushed already."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[list[str]] = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.seen.append(self.path.read_text(encoding="utf-8").splitlines())


def test_jsonl_logger_writes_one_flushed_strict_json_line_per_epoch(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    reader = ReadFile(path)
    trainer = make_trainer([JSONLLogger(path), reader], epochs=3)
    history = trainer.fit(tiny_data(), tiny_data(seed=1))
    assert [len(lines) for lines in reader.seen] == [1, 2, 3]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    run = {"run_id": trainer.lineage.id}  # each row names its run (unitrain.training._lineage)
    assert rows == [json.loads(json.dumps({**row, **run})) for row in history]
    assert {"loss", "val_loss", "val_accuracy", "lr", "step"} <= set(rows[0])


def test_jsonl_logger_writes_nonfinite_values_as_null(tmp_path):
    path = tmp_path / "m.jsonl"
    logger, trainer = JSONLLogger(path), FakeTrainer()
    logger.on_train_begin(trainer)
    logger.on_epoch_end(
        trainer, 0, {"epoch": 0, "loss": float("nan"), "val_loss": float("inf"), "lr": 0.1}
    )
    logger.on_epoch_end(trainer, 1, {"epoch": 1, "loss": -float("inf"), "val_loss": 1.5, "lr": 0.1})
    logger.on_train_end(trainer)
    lines = path.read_text().splitlines()

    def strict(token: str) -> None:
        raise ValueError(f"non-strict JSON token {token}")

    rows = [json.loads(line, parse_constant=strict) for line in lines]
    assert rows == [
        {"epoch": 0, "loss": None, "val_loss": None, "lr": 0.1},
        {"epoch": 1, "loss": None, "val_loss": 1.5, "lr": 0.1},
    ]


def _write_epochs(
    logger: Any, trainer: FakeTrainer, epochs: range, states: dict[int, Any] | None = None
) -> None:
    for epoch in epochs:
        logger.on_epoch_end(trainer, epoch, {"epoch": epoch, "loss": 1.0 / (epoch + 1), "lr": 0.1})
        if states is not None:
            states[epoch] = json.loads(json.dumps(logger.state_dict()))


@pytest.mark.parametrize("kind", [JSONLLogger, CSVLogger])
def test_logger_resume_truncates_to_the_saved_offset(tmp_path, kind):
    path = tmp_path / f"metrics.{kind.__name__}"
    trainer, states = FakeTrainer(), {}
    original = kind(path)
    original.on_train_begin(trainer)
    _write_epochs(original, trainer, range(3), states)
    original.on_train_end(trainer)
    uninterrupted = path.read_text()

    # Resume from the state saved after epoch 1: epoch 2 is re-run and must not appear twice.
    resumed = kind(path)
    resumed.on_train_begin(trainer)
    resumed.load_state_dict(states[1])
    _write_epochs(resumed, trainer, range(2, 3))
    resumed.on_train_end(trainer)
    assert path.read_text() == uninterrupted
    header = 1 if kind is CSVLogger else 0
    assert len(path.read_text().splitlines()) == 3 + header

    # A resume from after epoch 0 that then writes less than the file holds (the resumed run
    # stopped earlier): everything past the saved offset is cut, not left behind.
    shorter = kind(path)
    shorter.on_train_begin(trainer)
    shorter.load_state_dict(states[0])
    shorter.on_epoch_end(trainer, 1, {"epoch": 1, "loss": 7.0, "lr": 0.1})
    lines = path.read_text().splitlines()
    assert len(lines) == 2 + header
    assert lines[: 1 + header] == uninterrupted.splitlines()[: 1 + header]
    assert "7.0" in lines[-1]


@pytest.mark.parametrize("kind", [JSONLLogger, CSVLogger])
def test_logger_resume_from_a_state_before_any_epoch_starts_a_new_file(tmp_path, kind):
    path = tmp_path / "metrics.txt"
    trainer = FakeTrainer()
    original = kind(path)
    original.on_train_begin(trainer)
    state = json.loads(json.dumps(original.state_dict()))
    _write_epochs(original, trainer, range(2))
    original.on_train_end(trainer)
    expected = path.read_text()

    resumed = kind(path)
    resumed.on_train_begin(trainer)
    resumed.load_state_dict(state)
    _write_epochs(resumed, trainer, range(2))
    resumed.on_train_end(trainer)
    assert path.read_text() == expected


def test_csv_logger_writes_header_once_and_empty_cells_for_missing_metrics(tmp_path):
    path = tmp_path / "m.csv"
    reader = ReadFile(path)
    trainer = make_trainer([CSVLogger(path), reader], epochs=3, val_every_n_epochs=2)
    # Validation only after epochs 1 and 2 (the last), so epoch 0 has no val columns.
    trainer.fit(tiny_data(), tiny_data(seed=1))
    assert [len(lines) for lines in reader.seen] == [2, 3, 4]
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    assert header == ["epoch", "step", "lr", "loss", "skipped_steps", "seconds", "run_id"]
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "2", "3"]


def test_logger_resume_in_a_real_run_has_no_duplicate_epochs(tmp_path):
    log = tmp_path / "metrics.jsonl"
    ckpt = tmp_path / "ckpt"
    first = make_trainer([JSONLLogger(log), ModelCheckpoint(ckpt)], epochs=3)
    first.fit(tiny_data())
    full = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["epoch"] for row in full] == [1, 2, 3]

    second = make_trainer([JSONLLogger(log), ModelCheckpoint(ckpt)], epochs=3)
    second.fit(tiny_data(), resume=ckpt / "epoch=0001-step=000004")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert rows[0] == full[0]
    # Resuming an older checkpoint than the newest starts a new run (unitrain.training._lineage):
    # the rows after it name that run, and hold the same numbers.
    assert second.lineage.id != first.lineage.id
    assert [row["run_id"] for row in rows] == [first.lineage.id] + [second.lineage.id] * 2
    for row, reference in zip(rows[1:], full[1:], strict=True):
        assert {k: v for k, v in row.items() if k not in ("seconds", "run_id")} == {
            k: v for k, v in reference.items() if k not in ("seconds", "run_id")
        }


# -- LRMonitor, TerminateOnNaN, ProgressBar ---------------------------------------------------


def test_lr_monitor_step_values_are_the_schedule_values_applied():
    schedule = StepDecay(base_lr=0.1, step_size=3, gamma=0.5)
    monitor = LRMonitor("step")
    make_trainer([monitor], schedule=schedule, epochs=2).fit(tiny_data())
    assert [s for s, _ in monitor.values] == list(range(1, 9))
    # Update number s (1-based) was made with schedule(s - 1).
    assert monitor.values == [(s, schedule(s - 1)) for s in range(1, 9)]
    assert schedule(0) != schedule(7)


def test_lr_monitor_epoch_values_are_the_last_lr_of_each_epoch():
    schedule = StepDecay(base_lr=0.1, step_size=3, gamma=0.5)
    monitor = LRMonitor("epoch")
    make_trainer([monitor], schedule=schedule, epochs=2).fit(tiny_data())
    assert monitor.values == [(4, schedule(3)), (8, schedule(7))]


def test_lr_monitor_state_round_trip_and_bad_interval():
    monitor = LRMonitor("step")
    monitor.values = [(1, 0.1), (2, 0.05)]
    other = LRMonitor("step")
    other.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    assert other.values == monitor.values
    with pytest.raises(ConfigError, match="logging_interval"):
        LRMonitor("batch")


def test_terminate_on_nan_stops_or_raises_on_a_logged_nonfinite_loss():
    trainer = FakeTrainer()
    trainer.state.step = 7
    quiet = TerminateOnNaN()
    quiet.on_batch_end(trainer, 3, {"step": 7, "lr": 0.1})  # no loss at this step: nothing
    quiet.on_batch_end(trainer, 3, {"step": 7, "lr": 0.1, "loss": 0.3})
    assert not trainer.state.stop_training and quiet.stopped_at is None
    quiet.on_batch_end(trainer, 3, {"step": 7, "lr": 0.1, "loss": float("nan")})
    assert trainer.state.stop_training and quiet.stopped_at == 7

    loud, trainer = TerminateOnNaN(raise_error=True), FakeTrainer()
    with pytest.raises(NonFiniteError, match="inf"):
        loud.on_epoch_end(trainer, 0, {"loss": float("inf")})
    assert not trainer.state.stop_training


def _batches_with_nan_in_second() -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = tiny_data()
    x = x.copy()
    x[5, 1] = np.nan
    return [(x[i : i + 4], y[i : i + 4]) for i in range(0, 16, 4)]


def test_terminate_on_nan_in_a_real_run_stops_at_the_bad_step():
    callback = TerminateOnNaN()
    trainer = make_trainer([callback], epochs=3, log_every_n_steps=1, nonfinite="skip_batch")
    history = trainer.fit(_batches_with_nan_in_second())
    assert callback.stopped_at == 2
    assert trainer.state.stop_training and trainer.state.step == 2
    assert len(history) == 1 and math.isnan(history[0]["loss"])


def test_terminate_on_nan_raise_error_in_a_real_run():
    trainer = make_trainer(
        [TerminateOnNaN(raise_error=True)], epochs=3, log_every_n_steps=1, nonfinite="skip_batch"
    )
    with pytest.raises(NonFiniteError, match="step 2"):
        trainer.fit(_batches_with_nan_in_second())


def test_progress_bar_enabled_writes_epoch_counter_to_stderr(capsys):
    make_trainer([ProgressBar(enabled=True)], epochs=2, log_every_n_steps=1).fit(tiny_data())
    captured = capsys.readouterr()
    assert "Epoch 1/2" in captured.err and "Epoch 2/2" in captured.err
    assert "loss" in captured.err
    assert captured.out == ""


def test_progress_bar_is_silent_when_stderr_is_not_a_terminal(capsys):
    bar = ProgressBar()
    assert bar.enabled is False  # capsys's stderr is not a tty
    make_trainer([bar], epochs=2).fit(tiny_data())
    assert capsys.readouterr().err == ""


def test_progress_bar_defaults_to_on_for_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert ProgressBar().enabled is True
    assert ProgressBar(enabled=False).enabled is False


# -- CallbackList -------------------------------------------------------------------------------


class Recorder(Callback):
    """Records every hook call with the arguments that identify it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_train_begin(self, trainer):
        self.calls.append(("on_train_begin",))

    def on_train_end(self, trainer):
        self.calls.append(("on_train_end",))

    def on_epoch_begin(self, trainer, epoch):
        self.calls.append(("on_epoch_begin", epoch))

    def on_epoch_end(self, trainer, epoch, logs):
        self.calls.append(("on_epoch_end", epoch, logs["step"], "val_loss" in logs))

    def on_batch_begin(self, trainer, batch):
        self.calls.append(("on_batch_begin", batch, trainer.state.step))

    def on_batch_end(self, trainer, batch, logs):
        self.calls.append(("on_batch_end", batch, logs["step"]))

    def on_validation_begin(self, trainer):
        self.calls.append(("on_validation_begin", trainer.state.step))

    def on_validation_end(self, trainer, logs):
        self.calls.append(("on_validation_end", sorted(logs), trainer.state.step))


def test_hook_order_of_a_run_with_validation_and_accumulation():
    recorder = Recorder()
    # 6 examples in batches of 2 -> 3 micro-batches -> updates of 2 and 1 micro-batches.
    x, y = tiny_data(n=6)
    trainer = make_trainer([recorder], epochs=2, batch_size=2, grad_accum_steps=2)
    trainer.fit((x, y), (x, y))
    val = ["val_accuracy", "val_loss"]
    expected = [("on_train_begin",)]
    for epoch in range(2):
        step = 2 * epoch
        expected += [
            ("on_epoch_begin", epoch),
            ("on_batch_begin", 0, step),
            ("on_batch_end", 2, step + 1),
            ("on_batch_begin", 2, step + 1),
            ("on_batch_end", 3, step + 2),
            ("on_validation_begin", step + 2),
            ("on_validation_end", val, step + 2),
            ("on_epoch_end", epoch, step + 2, True),
        ]
    expected.append(("on_train_end",))
    assert recorder.calls == expected


class _StopAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer, batch, logs):
        if trainer.state.step == self.step:
            trainer.stop("stopped by the test")


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_a_stop_in_mid_epoch_still_ends_the_epoch(grad_accum_steps):
    """Stopping inside an epoch skips its remaining batches, not its end: the epoch is
    validated, logged in the history and passed to on_epoch_end, on either update path."""
    recorder = Recorder()
    trainer = make_trainer(
        [_StopAtStep(3), recorder], epochs=3, batch_size=2, grad_accum_steps=grad_accum_steps
    )
    history = trainer.fit(tiny_data(n=16), tiny_data(n=4, seed=1))
    assert [(row["epoch"], row["step"], "val_loss" in row) for row in history] == [(1, 3, True)]
    assert recorder.calls[-2:] == [("on_epoch_end", 0, 3, True), ("on_train_end",)]
    assert trainer.state.epoch == 1


class _LossSteps(Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_batch_end(self, trainer, batch, logs):
        if "loss" in logs:
            self.steps.append(logs["step"])


def test_batch_logs_carry_the_loss_every_log_every_n_steps():
    """The running loss is read back (a host sync) only at logging points."""
    seen = _LossSteps()
    make_trainer([seen], epochs=2, batch_size=2, log_every_n_steps=3).fit(tiny_data(n=10))
    assert seen.steps == [3, 6, 9]


def test_validation_runs_every_n_epochs_and_after_the_last():
    trainer = make_trainer([], epochs=4, val_every_n_epochs=3)
    started = time.perf_counter()
    history = trainer.fit(tiny_data(), tiny_data(n=4, seed=1))
    elapsed = time.perf_counter() - started
    assert [row["epoch"] for row in history if "val_loss" in row] == [3, 4]
    assert sum(row["seconds"] for row in history) <= elapsed
    assert all(row["seconds"] > 0 for row in history)


def test_checkpointing_callbacks_run_last_in_each_hook():
    order: list[str] = []

    class Named(Callback):
        def __init__(self, name: str, runs_last: bool = False) -> None:
            self.name, self.runs_last = name, runs_last

        @property
        def state_key(self) -> str:
            return self.name

        def on_epoch_end(self, trainer, epoch, logs):
            order.append(self.name)

    callbacks = CallbackList([Named("a"), Named("last", runs_last=True), Named("b"), Named("c")])
    callbacks.call("on_epoch_end", None, 0, {})
    assert order == ["a", "b", "c", "last"]


def test_duplicate_state_keys_are_a_config_error():
    with pytest.raises(ConfigError, match="EarlyStopping"):
        CallbackList([EarlyStopping(), EarlyStopping(monitor="loss")])
    with pytest.raises(ConfigError, match="state key"):
        make_trainer([LRMonitor(), LRMonitor("step")])


def test_duck_typed_callbacks_take_part():
    class Plain:  # not a Callback subclass
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def on_epoch_end(self, trainer, epoch, logs):
            self.epochs.append(epoch)

    plain = Plain()
    callbacks = CallbackList([plain])
    assert callbacks.hooks["on_epoch_end"] == [plain.on_epoch_end]
    assert all(callbacks.hooks[h] == [] for h in HOOKS if h != "on_epoch_end")
    assert callbacks.state_dict() == {}  # no state_dict method: nothing stored
    make_trainer([plain], epochs=3).fit(tiny_data())
    assert plain.epochs == [0, 1, 2]


def test_no_op_hooks_are_not_dispatched():
    class OnlyEpochEnd(Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            pass

    class Subclass(OnlyEpochEnd):
        def on_batch_end(self, trainer, batch, logs):
            pass

    callbacks = CallbackList([OnlyEpochEnd(), Callback(), Subclass()])
    counts = {hook: len(methods) for hook, methods in callbacks.hooks.items()}
    assert counts == {hook: 0 for hook in HOOKS} | {"on_epoch_end": 2, "on_batch_end": 1}


def test_callback_list_state_round_trip_by_key():
    a, b = LRMonitor("step"), EarlyStopping(monitor="loss")
    a.values = [(1, 0.5)]
    states = CallbackList([a, b]).state_dict()
    assert set(states) == {"LRMonitor", "EarlyStopping"}
    fresh = LRMonitor("step")
    CallbackList([fresh]).load_state_dict(states)  # unknown keys are ignored
    assert fresh.values == [(1, 0.5)]


# -- Monitor ------------------------------------------------------------------------------------


def test_monitor_missing_metric_lists_the_available_ones():
    monitor = Monitor("EarlyStopping", "val_f1", "auto", 0.0)
    with pytest.raises(
        ConfigError, match=r"'val_f1' is not logged; available: \['loss', 'val_loss'\]"
    ):
        monitor.read({"val_loss": 1.0, "loss": 2.0})
    assert monitor.read({"loss": 2.0}) is None  # an epoch without validation
    assert monitor.read({"val_f1": 0.25}) == 0.25


def test_missing_metric_in_a_real_run_is_a_config_error():
    trainer = make_trainer([EarlyStopping(monitor="accuracy")])
    with pytest.raises(ConfigError, match=r"'accuracy' is not logged; available:.*'loss'"):
        trainer.fit(tiny_data())


@pytest.mark.parametrize(
    "callback",
    [
        lambda: EarlyStopping(monitor="val_loss"),
        lambda: ReduceLROnPlateau(monitor="val_loss"),
        lambda: EarlyStopping(monitor="val_accuracy"),
    ],
)
def test_validation_monitor_without_validation_data_fails_at_train_begin(callback):
    seen: list[str] = []

    class Spy(Callback):
        def on_epoch_begin(self, trainer, epoch):
            seen.append("epoch")

    trainer = make_trainer([callback(), Spy()])
    with pytest.raises(ConfigError, match="needs validation data; pass val_data"):
        trainer.fit(tiny_data())
    assert seen == []  # failed before any training
