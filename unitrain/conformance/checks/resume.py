"""resume: a run interrupted and resumed in a fresh backend equals the uninterrupted run.

Each check trains the classifier with dropout (so random streams matter) twice: once
straight through, once crashing after a checkpoint and resuming in a freshly built backend,
as a new process would. Final parameters, optimizer state and the per-epoch history must be
bit-identical when the backend declares ``bit_exact_resume``, else within ``step``. Both runs
keep the state after every update, so a failure says where they parted: already at the
resume (the load restores something else) or at a later update (the update depends on
something the state dict does not hold, such as a counter or a random stream).
"""

from __future__ import annotations

import json
from typing import Any

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._diagnosis import first_differing, first_divergence
from unitrain.conformance._registry import check
from unitrain.conformance._training import Snapshots, classifier, fit, run_interrupted

EPOCHS = 3  # six batches per epoch: 18 updates


def _compare_runs(
    ctx: Context, straight: Any, resumed: Any, watched: tuple[Snapshots, Snapshots]
) -> None:
    ours, theirs = resumed.backend.state_dict(), straight.backend.state_dict()
    history = [{k: v for k, v in row.items() if k != "seconds"} for row in resumed.history]
    expected = [{k: v for k, v in row.items() if k != "seconds"} for row in straight.history]
    if ctx.backend.capabilities.bit_exact_resume:
        where = ""
        if first_differing(ours, theirs)[0] is not None:
            after, before = watched
            where = first_divergence(after.states, before.states, after.start, ctx.models)
        ctx.require_identical("final state, resumed vs uninterrupted", ours, theirs, where)
        ctx.require_equal("history", history, expected)
    else:
        ctx.compare("final state, resumed vs uninterrupted", ours, theirs, "step")
        ctx.require_equal("epochs trained", len(history), len(expected))


def _resume(
    ctx: Context,
    optimizer: optim.Optimizer,
    stop_step: int,
    checkpoint: dict[str, Any],
    callbacks: Any = lambda: [],
    **config: Any,
) -> tuple[Any, Any]:
    model = classifier(dropout=0.25)
    watched = (Snapshots(), Snapshots())
    straight = fit(
        ctx,
        ctx.make(model, optimizer=optimizer),
        model=model,
        optimizer=optimizer,
        epochs=EPOCHS,
        callbacks=[*callbacks(), watched[1]],
        **config,
    )
    resumed = run_interrupted(
        ctx,
        lambda: ctx.make(model, optimizer=optimizer),
        model=model,
        optimizer=optimizer,
        epochs=EPOCHS,
        stop_step=stop_step,
        checkpoint=checkpoint,
        callbacks=callbacks,
        watch=[watched[0]],
        **config,
    )
    _compare_runs(ctx, straight, resumed, watched)
    return straight, resumed


@check(
    "resume",
    "epoch_boundary",
    guards="state or data position lost at an epoch boundary",
)
def epoch_boundary(ctx: Context) -> None:
    """Crash at the start of epoch 2, resume from the epoch-1 checkpoint: same result."""
    _resume(ctx, optim.SGD(momentum=0.9), 6, {"every_n_epochs": 1})


@check(
    "resume",
    "mid_epoch",
    guards="dropout streams or the data position not restored mid-epoch",
)
def mid_epoch(ctx: Context) -> None:
    """Crash mid-epoch (update 9 of 18), resume from the step checkpoint: same result."""
    _resume(
        ctx, optim.SGD(momentum=0.9, nesterov=True), 9, {"every_n_epochs": None, "every_n_steps": 9}
    )


@check(
    "resume",
    "mid_epoch_adam",
    guards="Adam's moments or bias-correction step not restored",
)
def mid_epoch_adam(ctx: Context) -> None:
    """Mid-epoch resume with Adam: moments and the bias-correction step survive."""
    _resume(ctx, optim.Adam(), 8, {"every_n_epochs": None, "every_n_steps": 8})


@check(
    "resume",
    "mid_epoch_accumulation",
    guards="a resume inside an accumulated group",
)
def mid_epoch_accumulation(ctx: Context) -> None:
    """Mid-epoch resume with gradient accumulation over two micro-batches."""
    _resume(ctx, optim.AdamW(), 4, {"every_n_epochs": None, "every_n_steps": 4}, grad_accum_steps=2)


@check(
    "resume",
    "early_stopping_state",
    guards="early stopping's counters lost in a checkpoint",
)
def early_stopping_state(ctx: Context) -> None:
    """Early stopping's state survives a resume: the resumed run stops at the same epoch."""
    stopper = ctx.callback("EarlyStopping")

    def callbacks() -> list[Any]:
        return [stopper("val_loss", patience=1, min_delta=0.05, restore_best_weights=True)]

    straight, resumed = _resume(ctx, optim.SGD(momentum=0.9), 6, {"every_n_epochs": 1}, callbacks)
    ctx.require_equal("epochs trained", resumed.state.epoch, straight.state.epoch)


@check(
    "resume",
    "rng_state_roundtrip",
    guards="rng_state() not JSON data, or set_rng_state not restoring it",
)
def rng_state_roundtrip(ctx: Context) -> None:
    """rng_state() is JSON data, and set_rng_state restores it in a fresh backend."""
    model = classifier(dropout=0.25)
    backend = ctx.make(model, optimizer=optim.SGD())
    state = backend.rng_state()
    text = json.dumps(state)
    other = ctx.make(model, optimizer=optim.SGD(), seed=11)
    other.set_rng_state(json.loads(text))
    ctx.require_equal(
        "rng_state after set_rng_state", json.loads(json.dumps(other.rng_state())), json.loads(text)
    )
