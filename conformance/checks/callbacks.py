"""callbacks: hooks fire in the reference's order and number; logs carry the same keys.

Hook dispatch is the Trainer's, but a backend decides what reaches it: whether an update is
one call or several, what ``evaluate`` reports, when a loss is read. A run with validation
and gradient accumulation (including a short last group) is recorded hook by hook and
compared with the same run on the numpy reference.
"""

from __future__ import annotations

from typing import Any

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import upcast
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, fit


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


def _recorded(ctx: Context, backend: Any, **config: Any) -> tuple[HookRecorder, Any]:
    recorder = HookRecorder()
    monitor = ctx.callback("LRMonitor")(logging_interval="step")
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
    ours = _recorded(ctx, backend, **config)
    theirs = _recorded(ctx, reference, dtype="float64", **config)
    return ours, theirs


@check("callbacks", "hook_order")
def hook_order(ctx: Context) -> None:
    """Hooks fire in exactly the reference's order with validation and accumulation."""
    (ours, _), (theirs, _) = _pair(ctx, grad_accum_steps=4, log_every_n_steps=2)
    ctx.require_equal("hook sequence", ours.calls, theirs.calls)


@check("callbacks", "hook_counts")
def hook_counts(ctx: Context) -> None:
    """Each hook fires the reference's number of times (one batch hook per update)."""
    (ours, trainer), (theirs, _) = _pair(ctx, grad_accum_steps=4)
    count = lambda calls: {h: sum(c[0] == h for c in calls) for h in {c[0] for c in calls}}  # noqa: E731
    ctx.require_equal("hook counts", count(ours.calls), count(theirs.calls))
    ctx.require_equal("updates", trainer.state.step, 4)


@check("callbacks", "epoch_logs")
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


@check("callbacks", "lr_monitor")
def lr_monitor(ctx: Context) -> None:
    """The learning rates the LRMonitor records equal the reference's, update by update."""
    (ours, _), (theirs, _) = _pair(ctx, grad_accum_steps=2)
    ctx.require_equal("(update, learning rate) pairs", ours.lr_values, theirs.lr_values)


@check("callbacks", "batch_logs")
def batch_logs(ctx: Context) -> None:
    """Batch-end logs carry loss exactly at logging points, like the reference's."""
    (ours, _), (theirs, _) = _pair(ctx, log_every_n_steps=4)
    keys = lambda calls: [c[2] for c in calls if c[0] == "on_batch_end"]  # noqa: E731
    ctx.require_equal("batch log keys per update", keys(ours.calls), keys(theirs.calls))
