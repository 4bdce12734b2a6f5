"""fused: the fast paths equal the plain path.

``train_step(batch, lr)`` must equal ``forward(batch); backward(); step(lr)`` (dropout masks
included), a multi-step call ``train_steps(batches, lrs)`` - the kit's name for Keras's
``steps_per_execution`` - must equal that many single steps, and so must
``train_steps_on_device(indices, lrs)`` on the batches its indices pick from the training set
``set_device_data`` put on the device (``TrainerConfig.data_on_device``). Compared within ``step``:
compiled fused code may round differently from separately compiled pieces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.backends.protocol import DeviceData, FusedStep, MultiStep
from unitrain.conformance._context import Context
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, classifier_data

LRS = (0.05, 0.02, 0.08, 0.01, 0.03)


def _fused(ctx: Context, model: Any, **options: Any) -> Any:
    """A backend built with ``options`` that has ``train_step``; else the check is skipped."""
    backend = ctx.make(model, **options)
    if not isinstance(backend, FusedStep):
        ctx.skip("the backend offers no train_step(batch, lr) (the optional FusedStep protocol)")
    return backend


def _fused_vs_plain(ctx: Context, optimizer: optim.Optimizer) -> None:
    model = classifier(dropout=0.25)
    fused = _fused(ctx, model, optimizer=optimizer)
    plain = ctx.make(model, optimizer=optimizer)
    x, y = classifier_data(ctx)
    fused_losses, plain_losses = [], []
    for i, lr in enumerate(LRS):
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        fused_losses.append(float(fused.train_step(batch, lr)))
        plain_losses.append(ctx.update(plain, batch, lr, fused=False))
    ctx.compare("losses returned", fused_losses, plain_losses, "step")
    ctx.compare(f"state after {len(LRS)} updates", fused.state_dict(), plain.state_dict(), "step")


@check(
    "fused",
    "train_step_sgd_momentum",
    guards="a fused step that differs from forward + backward + step (dropout masks included)",
)
def train_step_sgd_momentum(ctx: Context) -> None:
    """train_step equals forward + backward + step (SGD momentum, dropout)."""
    _fused_vs_plain(ctx, optim.SGD(momentum=0.9, nesterov=True))


@check(
    "fused",
    "train_step_adamw",
    guards="a fused AdamW step that differs from the three calls",
)
def train_step_adamw(ctx: Context) -> None:
    """train_step equals forward + backward + step (AdamW, dropout)."""
    _fused_vs_plain(ctx, optim.AdamW())


@check(
    "fused",
    "train_step_clipped",
    guards="clipping skipped or done differently in the fused step",
)
def train_step_clipped(ctx: Context) -> None:
    """train_step clips like step does."""
    model = classifier()
    fused = _fused(ctx, model, optimizer=optim.Adam(), grad_clip_norm=0.05)
    plain = ctx.make(model, optimizer=optim.Adam(), grad_clip_norm=0.05)
    x, y = classifier_data(ctx)
    for i, lr in enumerate(LRS):
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        fused.train_step(batch, lr)
        ctx.update(plain, batch, lr, fused=False)
    ctx.compare(f"state after {len(LRS)} updates", fused.state_dict(), plain.state_dict(), "step")


def _against_single_steps(ctx: Context, many: Any, rows: np.ndarray, losses: Any) -> None:
    """Compare ``many``'s losses and state after updates on ``rows`` (one row of example
    indices per update, at :data:`LRS`) with single ``train_step`` calls of a fresh backend."""
    x, y = classifier_data(ctx)
    single = ctx.make(classifier(dropout=0.25), optimizer=optim.SGD(momentum=0.9))
    expected = [float(single.train_step((x[r], y[r]), lr)) for r, lr in zip(rows, LRS)]
    losses = np.asarray(losses, np.float64).ravel()
    ctx.compare("losses returned", losses, expected, "step")
    ctx.compare(f"state after {len(LRS)} updates", many.state_dict(), single.state_dict(), "step")


@check(
    "fused",
    "steps_per_call",
    guards="several updates per call that differ from as many single steps",
)
def steps_per_call(ctx: Context) -> None:
    """train_steps(batches, lrs) equals as many single train_step calls."""
    multi = _fused(ctx, classifier(dropout=0.25), optimizer=optim.SGD(momentum=0.9))
    if not isinstance(multi, MultiStep):
        ctx.skip("the backend offers no train_steps(batches, lrs) (the MultiStep protocol)")
    x, y = classifier_data(ctx)
    rows = np.arange(8 * len(LRS)).reshape(len(LRS), 8)
    _against_single_steps(ctx, multi, rows, multi.train_steps((x[rows], y[rows]), np.asarray(LRS)))


@check(
    "fused",
    "steps_on_device",
    guards="batches gathered on the device from the wrong rows (a transposed or flattened "
    "index array, a stale copy of the data), or updates that differ from single steps",
)
def steps_on_device(ctx: Context) -> None:
    """train_steps_on_device(indices, lrs) equals single train_step calls on those rows."""
    on_device = _fused(ctx, classifier(dropout=0.25), optimizer=optim.SGD(momentum=0.9))
    if not isinstance(on_device, DeviceData):
        ctx.skip("the backend keeps no data on the device (the optional DeviceData protocol)")
    x, y = classifier_data(ctx)
    rows = np.random.default_rng(5).permutation(len(x))[: 8 * len(LRS)].reshape(len(LRS), 8)
    on_device.set_device_data(x, y)
    losses = on_device.train_steps_on_device(rows, np.asarray(LRS))
    _against_single_steps(ctx, on_device, rows, losses)
