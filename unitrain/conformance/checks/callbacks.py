"""callbacks: hooks fire in the reference's order and number; logs carry the same keys.

Hook dispatch is the Trainer's, but a backend decides what reaches it: whether an update is
one call or several, what ``evaluate`` reports, when a loss is read. A run with validation
and gradient accumulation (including a short last group) is recorded hook by hook and
compared with the same run on the numpy reference.

Callbacks listed in any order must give the same run: a checkpoint written at an epoch's
end holds every other callback's decision for that epoch, so a run resumed from it (here
with ``ModelCheckpoint`` listed before ``EarlyStopping``) follows the uninterrupted one.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from unitrain import optim, schedules
from unitrain.conformance._context import Context
from unitrain.conformance._probes import model_state, upcast
from unitrain.conformance._registry import check
from unitrain.conformance._training import Interrupt, StopAt, classifier, fit, latest_checkpoint
from unitrain.conformance.checks.early_stopping import MODEL, ScriptedValidation


class HookRecorder:
    """Records every hook call with its position arguments and sorted log keys."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.logs: list[dict[str, Any]] = []
        #: What the LRMonitor of the same run recorded: ``(update, lr)`` pairs.
        self.lr_values: list[tuple[int, float]] = []

    def on_train_begin(self, trainer: Any) -> None:
        self.calls.append(("on_train_begin",))

    def on_train_end(self, trainer: Any) -> None:
        self.calls.append(("on_train_end",))

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
        self.calls.append(("on_epoch_begin", epoch))

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        self.calls.append(("on_epoch_end", epoch, tuple(sorted(logs))))
        self.logs.append(dict(logs))

    def on_batch_begin(self, trainer: Any, batch: int) -> None:
        self.calls.append(("on_batch_begin", batch, trainer.state.step))

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        self.calls.append(("on_batch_end", batch, tuple(sorted(logs)), logs["step"], logs["lr"]))

    def on_validation_begin(self, trainer: Any) -> None:
        self.calls.append(("on_validation_begin",))

    def on_validation_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        self.calls.append(("on_validation_end", tuple(sorted(logs))))


def _recorded(
    ctx: Context, backend: Any, monitor_class: type, **config: Any
) -> tuple[HookRecorder, Any]:
    recorder = HookRecorder()
    monitor = monitor_class(logging_interval="step")
    trainer = fit(
        ctx,
        backend,
        model=classifier(),
        optimizer=optim.SGD(momentum=0.9),
        epochs=2,
        callbacks=[recorder, monitor],
        **config,
    )
    recorder.lr_values = list(monitor.values)
    return recorder, trainer


def _pair(ctx: Context, **config: Any) -> tuple[tuple[HookRecorder, Any], tuple[HookRecorder, Any]]:
    backend = ctx.make(classifier(), optimizer=optim.SGD(momentum=0.9))
    reference = ctx.reference(classifier(), optimizer=optim.SGD(momentum=0.9))
    reference.load_state_dict(upcast(backend.state_dict()))
    from unitrain.callbacks import LRMonitor  # the reference runs the core's callback

    ours = _recorded(ctx, backend, ctx.callback("LRMonitor"), **config)
    theirs = _recorded(ctx, reference, LRMonitor, dtype="float64", **config)
    return ours, theirs


@check(
    "callbacks",
    "hook_order",
    guards="hooks fired in another order (per micro-batch, validation misplaced)",
)
def hook_order(ctx: Context) -> None:
    """Hooks fire in exactly the reference's order with validation and accumulation."""
    (ours, _), (theirs, _) = _pair(ctx, grad_accum_steps=4, log_every_n_steps=2)
    ctx.require_equal("hook sequence", ours.calls, theirs.calls)


@check(
    "callbacks",
    "hook_counts",
    guards="one batch hook per micro-batch instead of per update",
)
def hook_counts(ctx: Context) -> None:
    """Each hook fires the reference's number of times (one batch hook per update)."""
    (ours, trainer), (theirs, _) = _pair(ctx, grad_accum_steps=4)
    count = lambda calls: {h: sum(c[0] == h for c in calls) for h in {c[0] for c in calls}}  # noqa: E731
    ctx.require_equal("hook counts", count(ours.calls), count(theirs.calls))
    ctx.require_equal("updates", trainer.state.step, 4)


@check(
    "callbacks",
    "epoch_logs",
    guards="evaluate returning other metric names, or epoch losses that differ",
)
def epoch_logs(ctx: Context) -> None:
    """Epoch logs have the reference's keys, and their losses agree within ``training``."""
    (ours, _), (theirs, _) = _pair(ctx)
    keys = lambda logs: [sorted(row) for row in logs]  # noqa: E731
    ctx.require_equal("epoch log keys", keys(ours.logs), keys(theirs.logs))
    for key in ("loss", "val_loss", "val_accuracy"):
        ctx.compare(
            f"{key} per epoch",
            [r[key] for r in ours.logs],
            [r[key] for r in theirs.logs],
            "training",
        )


@check(
    "callbacks",
    "lr_monitor",
    guards="a backend's own LRMonitor recording another update's learning rate",
)
def lr_monitor(ctx: Context) -> None:
    """The learning rates the LRMonitor records equal the reference's, update by update."""
    (ours, _), (theirs, _) = _pair(ctx, grad_accum_steps=2)
    ctx.require_equal("(update, learning rate) pairs", ours.lr_values, theirs.lr_values)


@check(
    "callbacks",
    "batch_logs",
    guards="the loss read at other steps than the logging points",
)
def batch_logs(ctx: Context) -> None:
    """Batch-end logs carry loss exactly at logging points, like the reference's."""
    (ours, _), (theirs, _) = _pair(ctx, log_every_n_steps=4)
    keys = lambda calls: [c[2] for c in calls if c[0] == "on_batch_end"]  # noqa: E731
    ctx.require_equal("batch log keys per update", keys(ours.calls), keys(theirs.calls))


#: Validation losses that improve, worsen, then plateau: early stopping's state after
#: epoch 1 (best epoch 1, nothing to wait for) differs from its state after epoch 0.
_SCRIPT = (5.0, 3.0, 4.0, 4.0, 4.0, 4.0)


def _scripted_run(ctx: Context, callbacks: list[Any], resume: Any = None) -> Any:
    """Train MODEL with the scripted validation metric; ``callbacks`` as listed."""
    backend = ctx.make(MODEL, loss="mse", optimizer=optim.SGD(momentum=0.5))
    script = ScriptedValidation(_SCRIPT, ctx.host)
    rng = np.random.default_rng(0xC0DE)
    x, y = ctx.host(rng.normal(size=(16, 2))), ctx.host(rng.normal(size=(16, 1)))
    trainer = ctx.trainer(
        MODEL,
        backend,
        loss="mse",
        optimizer=optim.SGD(momentum=0.5),
        schedule=schedules.Constant(0.05),
        callbacks=[script, *callbacks],
        config={"epochs": len(_SCRIPT), "batch_size": 4, "log_every_n_steps": 10**6},
    )
    trainer.fit((x, y), script, resume=resume)
    return trainer


@check(
    "callbacks",
    "checkpoint_listed_first_resume",
    guards="a checkpoint saved before other callbacks decide the epoch (the resume diverges)",
)
def checkpoint_listed_first_resume(ctx: Context) -> None:
    """With ModelCheckpoint listed before EarlyStopping, a resumed run follows the
    uninterrupted one (the checkpoint holds early stopping's decision for its epoch)."""
    stopper = lambda: ctx.callback("EarlyStopping")(  # noqa: E731
        "val_loss", patience=2, restore_best_weights=True
    )
    straight_stopper = stopper()
    straight = _scripted_run(ctx, [straight_stopper])
    directory = ctx.path("listed-first")
    saver = ctx.callback("ModelCheckpoint")(directory, every_n_epochs=1)
    with contextlib.suppress(Interrupt):  # four updates per epoch: crash starting epoch 2
        _scripted_run(ctx, [saver, stopper(), StopAt(8)])
    resumed_stopper = stopper()
    resumed = _scripted_run(ctx, [resumed_stopper], resume=latest_checkpoint(directory))
    ctx.require_equal("epochs trained", len(resumed.history), len(straight.history))
    ctx.require_equal("best epoch", resumed_stopper.best_epoch, straight_stopper.best_epoch)
    ours = model_state(resumed.backend.state_dict())
    theirs = model_state(straight.backend.state_dict())
    if ctx.backend.capabilities.bit_exact_resume:
        ctx.require_identical("final (restored best) weights", ours, theirs)
    else:
        ctx.compare("final (restored best) weights", ours, theirs, "step")
