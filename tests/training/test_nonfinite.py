"""NaN or infinite losses and gradients, under each policy, on every installed backend.

Through the public API only: a batch source that poisons one batch with NaN or Inf inputs
(so its loss and gradients are not finite), a Trainer with ``log_every_n_steps=1`` and a
JSONLLogger. Under every policy the bad update is skipped, so the weights equal those of a run
that never saw the bad batch; ``raise`` then raises a NonFiniteError naming the step,
``stop`` ends the run with a warning, and ``skip_batch`` trains on. Every epoch line in
``metrics.jsonl`` carries the running count in its ``skipped_steps`` column. Both update
paths are covered: the fused step (``grad_accum_steps=1`` on JAX and TensorFlow) and
forward/backward/step (gradient accumulation, and numpy and torch always).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _backends import backends

from unitrain import NonFiniteError, Trainer, TrainerConfig, callbacks, models, optim

BATCH = 8


class Poisoned:
    """A BatchSource of fixed batches; batch ``bad`` of epoch 0 gets a NaN or Inf input."""

    exact_resume = True

    def __init__(self, batches: int, bad: int | None, value: float) -> None:
        rng = np.random.default_rng(0)  # the same examples whatever the number of batches
        self.x = rng.normal(size=(64, 4)).astype(np.float32)[: batches * BATCH]
        self.y = rng.integers(0, 3, 64)[: batches * BATCH]
        self.bad, self.value = bad, value

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def batches(self, epoch, start=0):
        for index in range(start, len(self)):
            x = self.x[index * BATCH : (index + 1) * BATCH].copy()
            if epoch == 0 and index == self.bad:
                x[0, 0] = self.value
            yield x, self.y[index * BATCH : (index + 1) * BATCH]


def train(backend, tmp_path: Path, policy="skip_batch", accumulate=1, epochs=1):
    trainer = Trainer(
        models.MLP((4, 8, 3)),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        callbacks=[callbacks.JSONLLogger(tmp_path / "metrics.jsonl")],
        config=TrainerConfig(
            epochs=epochs,
            nonfinite=policy,
            log_every_n_steps=1,
            grad_accum_steps=accumulate,
            device="cpu",
        ),
    )
    return trainer


def weights(trainer) -> dict[str, np.ndarray]:
    # The update counter may or may not count a skipped update; weights and moments may not move.
    return {k: v for k, v in trainer.backend.state_dict().items() if k != "optimizer.step"}


def logged(tmp_path: Path) -> list[dict]:
    file = tmp_path / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def assert_same_weights(got, expected):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.fixture
def clean_weights(tmp_path):
    """Weights after the good updates that precede the bad batch (batches 0 and 1)."""

    def make(backend, accumulate):
        trainer = train(backend, tmp_path / "clean", accumulate=accumulate)
        trainer.fit(Poisoned(2, None, 0.0))
        return weights(trainer)

    return make


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("accumulate", [1, 2], ids=["fused-or-plain", "accumulated"])
@pytest.mark.parametrize("backend", backends())
def test_skip_batch_skips_the_bad_update_and_logs_it(
    backend, accumulate, value, tmp_path, clean_weights
):
    expected = clean_weights(backend, accumulate)
    # With accumulation, batches 2 (bad) and 3 make one update, skipped as a whole.
    trainer = train(backend, tmp_path, accumulate=accumulate)
    trainer.fit(Poisoned(3 if accumulate == 1 else 4, 2, value))
    assert trainer.skipped_steps == 1
    assert_same_weights(weights(trainer), expected)
    assert [row["skipped_steps"] for row in logged(tmp_path)] == [1]
    assert all(np.isfinite(v).all() for v in trainer.backend.state_dict().values())
    # Training goes on after the skip, and the count stays in the log of later epochs.
    later = train(backend, tmp_path / "later", accumulate=accumulate, epochs=3)
    later.fit(Poisoned(4, 2, value))
    assert [row["skipped_steps"] for row in logged(tmp_path / "later")] == [1, 1, 1]
    assert all(np.isfinite(v).all() for v in later.backend.state_dict().values())


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("backend", backends())
def test_raise_stops_at_the_bad_step_with_the_weights_before_it(
    backend, value, tmp_path, clean_weights
):
    expected = clean_weights(backend, 1)
    trainer = train(backend, tmp_path, policy="raise", epochs=2)
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient in 1 update.* step 3"):
        trainer.fit(Poisoned(4, 2, value))
    assert trainer.state.step == 3
    assert_same_weights(weights(trainer), expected)
    assert logged(tmp_path) == []  # raised inside epoch 0, before its line


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("backend", backends())
def test_stop_ends_the_run_after_the_bad_step_and_logs_it(backend, value, tmp_path, clean_weights):
    expected = clean_weights(backend, 1)
    trainer = train(backend, tmp_path, policy="stop", epochs=2)
    with pytest.warns(UserWarning, match="stopping: non-finite loss or gradient in 1 update"):
        history = trainer.fit(Poisoned(4, 2, value))
    assert trainer.state.stop_training and trainer.state.step == 3 and len(history) == 1
    assert_same_weights(weights(trainer), expected)
    rows = logged(tmp_path)
    assert [row["skipped_steps"] for row in rows] == [1] and rows[0]["step"] == 3
