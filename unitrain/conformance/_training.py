"""Small whole training runs through the Trainer, shared by several check families.

The classifier is ``MLP((6, 16, 3), tanh)`` with cross-entropy on 48 separable points (six
batches of eight), small enough that a run of a few epochs takes milliseconds on the
reference, smooth (tanh) so float32 and float64 runs stay close, and with optional dropout
so that random streams are exercised.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import optim, schedules
from unitrain.checkpoint import list_checkpoints
from unitrain.conformance._context import Context
from unitrain.conformance._probes import blobs, copy_state
from unitrain.models import MLP
from unitrain.training.trainer import Trainer

__all__ = [
    "Interrupt",
    "Snapshots",
    "StopAt",
    "classifier",
    "classifier_data",
    "fit",
    "latest_checkpoint",
    "run_interrupted",
    "schedule",
]


def classifier(dropout: float = 0.0) -> MLP:
    """The shared classifier model."""
    return MLP((6, 16, 3), activation="tanh", dropout=dropout)


def classifier_data(ctx: Context, seed: int = 0, n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Training (or, with another seed, validation) arrays for :func:`classifier`."""
    return blobs(ctx, n, 6, 3, seed)


def schedule() -> schedules.AbstractSchedule:
    """Warmup into cosine decay: the LR changes at every update of these short runs."""
    return schedules.Warmup(schedules.CosineDecay(0.2, 30, 1e-3), warmup_steps=4)


class Interrupt(Exception):
    """Raised by :class:`StopAt` to simulate a crash."""


class StopAt:
    """Raises :class:`Interrupt` before update number ``step`` (after earlier checkpoints)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_begin(self, trainer: Trainer, batch: int) -> None:
        if trainer.state.step == self.step:
            raise Interrupt(f"simulated crash before update {self.step}")


class Snapshots:
    """Copies of the backend's state dict when training begins (a resumed run: right after
    loading) and after every update, by update count: where two runs that should be
    bit-identical parted (see :func:`unitrain.conformance._diagnosis.first_divergence`)."""

    def __init__(self) -> None:
        self.states: dict[int, dict[str, np.ndarray]] = {}
        self.start = 0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.start = trainer.state.step
        self.states[self.start] = copy_state(trainer.backend.state_dict())

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        self.states[trainer.state.step] = copy_state(trainer.backend.state_dict())


def fit(
    ctx: Context,
    backend: Any,
    *,
    model: MLP,
    optimizer: optim.Optimizer,
    epochs: int,
    callbacks: Sequence[Any] = (),
    resume: str | Path | None = None,
    train: Any = None,
    val: Any = None,
    **config: Any,
) -> Trainer:
    """Fit ``backend`` on the classifier data (or ``train``/``val``); return the Trainer."""
    trainer = ctx.trainer(
        model,
        backend,
        optimizer=optimizer,
        schedule=config.pop("schedule", schedule()),
        callbacks=list(callbacks),
        config={"epochs": epochs, "batch_size": 8, "seed": 0, "log_every_n_steps": 1, **config},
    )
    train = train if train is not None else classifier_data(ctx, 0)
    val = val if val is not None else classifier_data(ctx, 1, 16)
    trainer.fit(train, val, resume=resume)
    return trainer


def latest_checkpoint(directory: Path) -> Path:
    """The newest checkpoint in ``directory``."""
    found = list_checkpoints(directory)
    if not found:
        raise AssertionError(f"no checkpoint was written in {directory}")
    return found[-1]


def run_interrupted(
    ctx: Context,
    make_backend: Any,
    *,
    model: MLP,
    optimizer: optim.Optimizer,
    epochs: int,
    stop_step: int,
    checkpoint: dict[str, Any],
    callbacks: Any = lambda: [],
    watch: Sequence[Any] = (),
    **config: Any,
) -> Trainer:
    """Train until a crash before ``stop_step``, then resume in a fresh backend.

    Args:
        ctx: the check's context.
        make_backend: builds a fresh backend (as a new process would).
        model: the model.
        optimizer: the optimizer.
        epochs: epochs of the whole run.
        stop_step: the crash happens before this update.
        checkpoint: arguments of the ``ModelCheckpoint`` that saves where the crash resumes.
        callbacks: builds the other callbacks (fresh objects for each run).
        watch: callbacks of the resumed run only (:class:`Snapshots`).
        config: more ``TrainerConfig`` fields.

    Returns:
        The resumed trainer, after the whole run.
    """
    directory = ctx.path(f"resume-{stop_step}")
    saver = ctx.callback("ModelCheckpoint")
    try:
        fit(
            ctx,
            make_backend(),
            model=model,
            optimizer=optimizer,
            epochs=epochs,
            callbacks=[*callbacks(), saver(directory, **checkpoint), StopAt(stop_step)],
            **config,
        )
    except Interrupt:
        pass
    else:
        raise AssertionError(f"the run ended before update {stop_step}")
    resumed = fit(
        ctx,
        make_backend(),
        model=model,
        optimizer=optimizer,
        epochs=epochs,
        callbacks=[*callbacks(), *watch],
        resume=latest_checkpoint(directory),
        **config,
    )
    return resumed
