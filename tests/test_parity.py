"""Cross-backend parity: the same recipe gives the same numbers on every backend.

The oracle is the numpy reference backend. With no dropout, the same initial weights, the
same batches and the same update rule, the backends differ only by float32 rounding, so the
per-epoch losses agree to 1e-4 relative and discrete decisions (the early-stopping epoch)
agree exactly.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _backends import FRAMEWORKS, backends

from unitrain import Trainer, TrainerConfig, callbacks, models, optim, schedules
from unitrain.recipes import default_trainer, load_digits

OTHERS = backends("torch", "jax", "tensorflow")


@pytest.fixture(scope="module")
def reference_history():
    trainer, train, val = default_trainer(backend="numpy", epochs=5, progress=False, patience=2)
    return trainer.fit(train, val)


@pytest.mark.parametrize("backend", OTHERS)
def test_default_recipe_matches_the_reference_epoch_by_epoch(backend, reference_history):
    trainer, train, val = default_trainer(backend=backend, epochs=5, progress=False, patience=2)
    history = trainer.fit(train, val)
    assert len(history) == len(reference_history)  # early stopping: same stop epoch
    for ours, expected in zip(history, reference_history):
        for key in ("loss", "val_loss"):
            assert ours[key] == pytest.approx(expected[key], rel=1e-4), (ours["epoch"], key)
        assert ours["lr"] == expected["lr"]  # host float64 schedule: identical


def early_stopping_run(backend):
    split = load_digits()
    hooks = [callbacks.EarlyStopping("val_loss", patience=2, min_delta=0.02)]
    schedule = schedules.Warmup(schedules.CosineDecay(0.2, 400, 1e-3), warmup_steps=45)
    trainer = Trainer(
        models.MLP((64, 32, 10)),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedule,
        callbacks=hooks,
        config=TrainerConfig(epochs=12, device="cpu"),
    )
    trainer.fit((split.x_train, split.y_train), (split.x_val, split.y_val))
    return hooks[0].stopped_epoch, hooks[0].best_epoch


@pytest.mark.parametrize("backend", OTHERS)
def test_early_stopping_stops_at_the_same_epoch(backend):
    expected = early_stopping_run("numpy")
    assert expected[0] is not None  # the recipe does stop early
    assert early_stopping_run(backend) == expected


PAIRS = [pytest.param(a, b, id=f"{a}-to-{b}") for a, b in itertools.permutations(FRAMEWORKS, 2)]


@pytest.fixture(scope="module")
def switch_data():
    split = load_digits()
    return split.x_train[:320], split.y_train[:320]


def switch_trainer(backend, checkpoint_dir):
    return Trainer(
        models.MLP((64, 32, 10)),
        backend=backend,
        optimizer=optim.Adam(),
        schedule=schedules.Constant(1e-3),
        callbacks=[callbacks.ModelCheckpoint(checkpoint_dir, every_n_epochs=1)],
        config=TrainerConfig(epochs=4, device="cpu", checkpoint_dir=str(checkpoint_dir)),
    )


@pytest.fixture(scope="module")
def unswitched(switch_data, tmp_path_factory):
    """Every backend's own 4-epoch run, and its checkpoint after epoch 2."""
    runs = {}
    for name in FRAMEWORKS:
        try:
            __import__(name)
        except ImportError:
            continue
        directory = tmp_path_factory.mktemp(name)
        trainer = switch_trainer(name, directory)
        trainer.fit(switch_data)
        runs[name] = (trainer.backend.state_dict(), directory / "epoch=0002-step=000020")
    return runs


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_a_checkpoint_moves_between_backends_and_training_continues(
    source, target, switch_data, unswitched, tmp_path
):
    """Written by one backend, loaded by another, 2 more epochs: within 1e-4 of no switch."""
    for name in (source, target):
        if name not in unswitched:
            pytest.skip(f"{name} is not installed")
    expected, checkpoint = unswitched[source]
    trainer = switch_trainer(target, tmp_path)
    trainer.fit(switch_data, resume=checkpoint)
    actual = trainer.backend.state_dict()
    assert actual.keys() == expected.keys()
    for key in expected:
        assert actual[key].dtype == expected[key].dtype and actual[key].shape == expected[key].shape
    params = [k for k in expected if k.startswith("model.")]
    diff = np.sqrt(sum(np.sum((actual[k] - expected[k]) ** 2) for k in params))
    norm = np.sqrt(sum(np.sum(expected[k].astype(np.float64) ** 2) for k in params))
    assert diff / norm <= 1e-4
