"""Dropout keys numbered by the caller: ``step`` and ``micro_batch`` passed to the backend.

The Trainer passes each update's numbers (``state.step``, skipped updates included, and the
forward's place in the update), so a backend keys dropout without a counter of its own; a
direct caller that passes none gets the backend's own count of ``step`` calls; a backend of
the old form (no ``step`` keyword) is still driven, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from _backends import backends

from unitrain import Trainer, TrainerConfig, models, optim
from unitrain.backends.numbering import NumberedCalls, UpdateNumbers
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.backends.strategy import SimulatedWorkers

DROPOUT = models.MLP((6, 32, 3), dropout=0.5)


def _backend(name: str, step: int = 0) -> Any:
    """A fresh dropout MLP on ``name`` whose own count starts at update ``step``."""
    backend = get_backend(name)(DROPOUT, BackendOptions(device="cpu", seed=3))
    if step:
        state = backend.state_dict()
        state["optimizer.step"] = np.asarray(step, np.int64)
        backend.load_state_dict(state)
    return backend


def _batch(nan: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    if nan:
        x[0, 0] = np.nan
    return x, np.arange(8) % 3


def _loss(value: Any) -> float:
    return float(np.asarray(value))


@pytest.mark.parametrize("name", backends())
def test_a_forward_is_keyed_by_the_numbers_passed_not_the_own_count(name):
    """The same weights give the loss of update ``step``'s micro-batch ``m`` whether the
    backend counted its way there or was told, and other numbers give other masks."""
    for step, micro_batch in [(0, 1), (4, 0), (4, 1)]:
        counted = _backend(name, step)
        if micro_batch:
            counted.forward(_batch())
        expected = _loss(counted.forward(_batch()))
        told = _backend(name, step=9)  # its own count points elsewhere
        got = _loss(told.forward(_batch(), step=step, micro_batch=micro_batch))
        assert got == expected, (step, micro_batch)
    losses = {_loss(_backend(name).forward(_batch(), step=s, micro_batch=0)) for s in range(4)}
    assert len(losses) == 4  # four updates, four masks


@pytest.mark.parametrize("name", backends())
def test_a_skipped_update_advances_the_own_count_as_the_trainer_counts(name):
    """A direct caller's own count includes a skipped update, as the Trainer's ``state.step``
    does, and the fused step is micro-batch 0 of the update it is given."""
    backend = _backend(name)
    backend.forward(_batch(nan=True))
    backend.backward()
    backend.step(0.1)
    assert backend.skipped_steps == 1
    after_skip = _loss(backend.forward(_batch()))
    assert after_skip == _loss(_backend(name).forward(_batch(), step=1, micro_batch=0))
    if hasattr(backend, "train_step"):
        fused = _loss(_backend(name).train_step(_batch(), 0.0, step=5))
        assert fused == _loss(_backend(name).forward(_batch(), step=5, micro_batch=0))


class _Recording(NumpyBackend):
    """The reference, recording the numbers each forward is given."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self.given: list[tuple[int | None, int | None]] = []

    def forward(
        self, batch: Any, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        self.given.append((step, micro_batch))
        return super().forward(batch, step=step, micro_batch=micro_batch)


def _fit(backend: Any, strategy: Any = None, **config: Any) -> Trainer:
    x, y = _batch()
    x = np.concatenate([x] * 4)
    trainer = Trainer(
        DROPOUT,
        backend=backend,
        optimizer=optim.SGD(),
        strategy=strategy,
        config=TrainerConfig(epochs=1, batch_size=8, seed=3, device="cpu", **config),
    )
    trainer.fit((x, np.concatenate([y] * 4)))
    return trainer


def test_the_trainer_numbers_every_forward_of_an_update():
    """Two micro-batches on two simulated workers: four forwards per update, numbered 0-3
    (micro-batch k of worker r is ``k * 2 + r``, as ``dropout_index`` has it), each given
    the update's step."""
    trainer = _fit(_Recording, SimulatedWorkers(2), grad_accum_steps=2)
    given = trainer.backend.given
    assert given == [(step, m) for step in range(2) for m in range(4)]


class _OldForm(NumpyBackend):
    """A backend written before the numbers were passed: its forward takes the batch only."""

    def forward(self, batch: Any) -> Any:  # type: ignore[override]
        return super().forward(batch)


def test_a_backend_of_the_old_form_is_driven_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"'_OldForm': forward\(\) take no step"):
        old = _fit(_OldForm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = _fit(NumpyBackend)
    # Nothing skipped: the own count and the numbers passed agree, and so do the runs.
    for key, value in new.backend.state_dict().items():
        np.testing.assert_array_equal(old.backend.state_dict()[key], value, err_msg=key)


def test_numbered_calls_lists_the_old_methods_and_leaves_missing_ones_none():
    class OldFused(NumpyBackend):
        def train_step(self, batch: Any, lr: float) -> Any:
            return self.forward(batch)

    with pytest.warns(DeprecationWarning, match=r"train_step\(\)"):
        calls = NumberedCalls(OldFused(DROPOUT, BackendOptions()))
    assert calls.old_form == ("train_step",) and calls.train_steps is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert NumberedCalls(NumpyBackend(DROPOUT, BackendOptions())).old_form == ()


def test_update_numbers_follow_the_caller_and_count_on():
    numbers = UpdateNumbers()
    assert numbers.forward(3, None) == (3, 0)
    assert numbers.forward(None, None) == (3, 1)
    numbers.updated()
    assert numbers.at(None) == 4 and numbers.at(8) == 8
    assert numbers.fused(None, 2) == 4 and numbers.forward(None, None) == (6, 0)
    numbers.loaded(11)
    assert numbers.forward(None, 2) == (11, 2)
