"""Probes: small models and data whose gradients the kit knows, and the runs built on them.

The *linear probe* is ``MLP((8, 4))`` (one ``x @ W + b`` layer) with mean squared error over
its 8 x 4 outputs, so ``dL/d out = (out - y) / 16`` exactly. Two uses:

- *Learning-rate probe*: weights are zero and the batch holds small integers, so the
  gradient is a multiple of 1/16 that every float format holds exactly, and the update is
  ``W = -lr * g`` rounded once. ``lr_applied = -<W, g> / <g, g>`` is then the learning rate the
  backend really used, to within one rounding of the dtype: a correct float32 backend is
  within 6e-8 of the schedule, and an error of 1e-6 stands out.
- *Gradient injection*: with the identity matrix as inputs, ``out = W + b`` row by row, so
  targets ``y = W_ref + b_ref - 16 G`` make the gradient with respect to ``W`` equal to ``G``
  (and ``sum_rows G`` for ``b``) at the reference's weights. The kit drives the backend and
  the float64 reference with the same targets and compares the trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain.conformance._context import Context
from unitrain.models import MLP
from unitrain.optim import Optimizer
from unitrain.schedules import AbstractSchedule

__all__ = [
    "LINEAR_PROBE",
    "blobs",
    "copy_state",
    "lr_probe",
    "model_state",
    "optimizer_trajectory",
    "upcast",
    "with_zeros",
]

LINEAR_PROBE = MLP((8, 4))
#: d(mean squared error)/d(output) per unit of (out - y) for 8 x 4 outputs: 2 / 32.
_GRAD_SCALE = 1.0 / 16.0


def copy_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A deep copy of a state dict."""
    return {k: np.array(v, copy=True) for k, v in state.items()}


def upcast(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state`` with floating arrays in float64 (to load into the float64 reference)."""
    return {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in state.items()}


def model_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``model.*`` entries of a state dict."""
    return {k: v for k, v in state.items() if k.startswith("model.")}


def with_zeros(state: dict[str, np.ndarray], step: int = 0) -> dict[str, np.ndarray]:
    """``state`` with every float array zeroed and the update counter set to ``step``."""
    zeroed = {k: np.zeros_like(v) for k, v in state.items()}
    if "optimizer.step" in zeroed:
        zeroed["optimizer.step"] = np.asarray(step, np.int64)
    return zeroed


def blobs(
    ctx: Context, n: int, features: int, classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A separable classification set: Gaussian clusters, inputs rounded to the dtype."""
    rng = np.random.default_rng([seed, 0xB10B])
    centers = rng.normal(0.0, 2.0, (classes, features))
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.normal(0.0, 0.7, (n, features))
    return ctx.host(x), y.astype(np.int64)


# -- the learning-rate probe ----------------------------------------------------------------


def _lr_probe_batch(ctx: Context) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0x5C4ED)
    x = rng.integers(-2, 3, (8, 8)).astype(np.float64)
    y = rng.integers(-3, 4, (8, 4)).astype(np.float64)
    grad_out = -y * _GRAD_SCALE  # at W = 0, b = 0 the output is 0
    gradient = np.concatenate([(x.T @ grad_out).ravel(), grad_out.sum(axis=0)])
    return (ctx.host(x), ctx.host(y)), gradient


class _LrRecorder:
    """Loads the zero state before every update and reads back the learning rate applied."""

    def __init__(self, backend: Any, zero: dict[str, np.ndarray], gradient: np.ndarray) -> None:
        self.backend, self.zero, self.gradient = backend, zero, gradient
        self.applied: list[float] = []

    def on_batch_begin(self, trainer: Any, batch: int) -> None:
        state = dict(self.zero)
        state["optimizer.step"] = np.asarray(trainer.state.step, np.int64)
        self.backend.load_state_dict(state)

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        state = self.backend.state_dict()
        moved = np.concatenate(
            [
                np.asarray(state["model.layers.0.weight"], np.float64).ravel(),
                np.asarray(state["model.layers.0.bias"], np.float64).ravel(),
            ]
        )
        g = self.gradient
        self.applied.append(float(-(moved @ g) / (g @ g)))


def lr_probe(ctx: Context, schedule: AbstractSchedule, steps: int) -> list[float]:
    """Train ``steps`` updates through the Trainer with ``schedule``; return the LRs applied.

    Plain SGD on the linear probe, the zero state loaded before every update, so each
    update reveals the learning rate it used (see the module docstring).
    """
    from unitrain.optim import SGD

    backend = ctx.make(LINEAR_PROBE, loss="mse", optimizer=SGD())
    batch, gradient = _lr_probe_batch(ctx)
    recorder = _LrRecorder(backend, with_zeros(backend.state_dict()), gradient)
    trainer = ctx.trainer(
        LINEAR_PROBE,
        backend,
        loss="mse",
        optimizer=SGD(),
        schedule=schedule,
        callbacks=[recorder],
        config={"epochs": 1, "batch_size": 8, "log_every_n_steps": 10**6},
    )
    trainer.fit([batch] * steps)
    return recorder.applied


# -- gradient injection ---------------------------------------------------------------------


def optimizer_trajectory(
    ctx: Context,
    optimizer: Optimizer,
    *,
    seed: int,
    lrs: Sequence[float],
    grad_scale: float,
    init_scale: float = 0.02,
    handoff_at: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run ``len(lrs)`` updates on the backend and the float64 reference with equal gradients.

    Args:
        ctx: the check's context.
        optimizer: the optimizer under test.
        seed: seeds the initial weights and the gradients.
        lrs: the learning rate of each update (changing every step).
        grad_scale: gradient entries have magnitudes log-uniform in
            ``[grad_scale / 10, grad_scale]``; each column keeps one sign per update, so the
            bias gradient (a column sum) has no cancellation.
        init_scale: scale of the initial weights.
        handoff_at: before this update, continue on a fresh backend loaded with the
            state dict of the first one, so optimizer state that does not round-trip through
            ``state_dict``/``load_state_dict`` shows in the trajectory.

    Returns:
        The final state dicts ``(backend, reference)``.
    """
    rng = np.random.default_rng([seed, 0x0971])
    backend = ctx.make(LINEAR_PROBE, loss="mse", optimizer=optimizer)
    reference = ctx.reference(LINEAR_PROBE, loss="mse", optimizer=optimizer)
    start = with_zeros(backend.state_dict())
    for name, value in model_state(start).items():
        start[name] = ctx.host(rng.normal(0.0, init_scale, value.shape)).astype(value.dtype)
    backend.load_state_dict(start)
    reference.load_state_dict(upcast(start))
    x = ctx.host(np.eye(8))
    for index, lr in enumerate(lrs):
        if index == handoff_at:
            state = backend.state_dict()
            backend = ctx.make(LINEAR_PROBE, loss="mse", optimizer=optimizer)
            backend.load_state_dict(state)
        ref_state = reference.state_dict()
        weight = ref_state["model.layers.0.weight"]
        bias = ref_state["model.layers.0.bias"]
        magnitude = grad_scale * 10.0 ** rng.uniform(-1.0, 0.0, weight.shape)
        signs = rng.choice([-1.0, 1.0], size=(1, weight.shape[1]))
        target = ctx.host(weight + bias - magnitude * signs / _GRAD_SCALE)
        batch = (x, target)
        Context.update(reference, (np.asarray(x, np.float64), np.asarray(target, np.float64)), lr)
        ctx.update(backend, batch, lr)
    return backend.state_dict(), reference.state_dict()
