"""model_state: non-trainable state (BatchNorm statistics) moves like the reference's.

A small conv net with BatchNorm trains a few updates. Its running statistics must equal the
float64 reference's; ``evaluate`` must use them (its loss equals the reference's) and change
nothing; the state must survive a state-dict round trip bit for bit, and a run resumed from
a state dict in a fresh backend must equal the uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._diagnosis import first_differing, first_divergence
from unitrain.conformance._probes import copy_state, upcast
from unitrain.conformance._registry import check
from unitrain.models import BatchNorm, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

MODEL = Sequential(
    (Conv2d(1, 3, 3, padding=1), BatchNorm(3), ReLU(), MaxPool2d(2), Flatten(), Linear(27, 3))
)
OPTIMIZER = optim.SGD(momentum=0.9)
STEPS = 4
#: BatchNorm and convolutions are layers beyond the MLP.
REQUIRES = ("portable_layers",)


def _batches(ctx: Context) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [
        (ctx.host(rng.standard_normal((8, 6, 6, 1))), rng.integers(0, 3, 8)) for _ in range(STEPS)
    ]


def _statistics(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [f"model.{k}" for k in MODEL.state_shapes()]
    return {k: state[k] for k in names}


def _trained(ctx: Context, steps: int = STEPS) -> Any:
    backend = ctx.make(MODEL, optimizer=OPTIMIZER)
    for batch in _batches(ctx)[:steps]:
        ctx.update(backend, batch, 0.1)
    return backend


def _reference_trained(ctx: Context, start: dict[str, np.ndarray]) -> Any:
    reference = ctx.reference(MODEL, optimizer=OPTIMIZER)
    reference.load_state_dict(upcast(start))
    for batch in _batches(ctx):
        ctx.update(reference, batch, 0.1)
    return reference


@check(
    "model_state",
    "statistics_after_steps",
    requires=REQUIRES,
    guards=(
        "running statistics missing from the state dict, a biased running variance, the "
        "momentum read the Keras way (0.9 for 0.1), statistics not updated in train mode"
    ),
)
def statistics_after_steps(ctx: Context) -> None:
    """BatchNorm running mean and unbiased variance after k updates equal the reference's."""
    start = ctx.make(MODEL, optimizer=OPTIMIZER).state_dict()
    ctx.require_equal(
        "state names", sorted(_statistics(start)), ["model.1.running_mean", "model.1.running_var"]
    )
    ctx.require_equal("initial running_var", start["model.1.running_var"].tolist(), [1.0, 1.0, 1.0])
    ours = _trained(ctx).state_dict()
    theirs = _reference_trained(ctx, start).state_dict()
    ctx.compare("running statistics", _statistics(ours), _statistics(theirs), "training")


@check(
    "model_state",
    "evaluate_uses_and_keeps_state",
    requires=REQUIRES,
    guards=(
        "evaluate that updates the running statistics, or normalises with the batch's own "
        "statistics instead of the running ones"
    ),
)
def evaluate_uses_and_keeps_state(ctx: Context) -> None:
    """evaluate normalises with the running statistics and leaves every tensor unchanged."""
    backend = _trained(ctx)
    before = copy_state(backend.state_dict())
    batch = _batches(ctx)[0]
    ours = float(backend.evaluate(batch)["loss"])
    ctx.require_identical("state after evaluate", backend.state_dict(), before)
    reference = ctx.reference(MODEL, optimizer=OPTIMIZER)
    reference.load_state_dict(upcast(before))
    ctx.compare("evaluate loss", ours, float(reference.evaluate(batch)["loss"]), "evaluate")


@check(
    "model_state",
    "checkpoint_round_trip",
    requires=REQUIRES,
    guards="statistics left out of load_state_dict, or restored rounded or in another dtype",
)
def checkpoint_round_trip(ctx: Context) -> None:
    """The state dict, statistics included, loads into a fresh backend bit for bit."""
    saved = copy_state(_trained(ctx).state_dict())
    fresh = ctx.make(MODEL, optimizer=OPTIMIZER)
    fresh.load_state_dict(saved)
    ctx.require_identical("state after load", fresh.state_dict(), saved)


@check(
    "model_state",
    "resume_exact",
    requires=REQUIRES,
    guards="statistics not restored on resume, so a resumed run drifts from the uninterrupted one",
)
def resume_exact(ctx: Context) -> None:
    """Stopping after half the updates and resuming in a fresh backend equals not stopping."""
    half = STEPS // 2
    straight = ctx.make(MODEL, optimizer=OPTIMIZER)
    expected = {0: copy_state(straight.state_dict())}
    for step, batch in enumerate(_batches(ctx), start=1):
        ctx.update(straight, batch, 0.1)
        expected[step] = copy_state(straight.state_dict())
    resumed = ctx.make(MODEL, optimizer=OPTIMIZER)
    resumed.load_state_dict(copy_state(_trained(ctx, half).state_dict()))
    states = {half: copy_state(resumed.state_dict())}
    for step, batch in enumerate(_batches(ctx)[half:], start=half + 1):
        ctx.update(resumed, batch, 0.1)
        states[step] = copy_state(resumed.state_dict())
    ours, theirs = states[STEPS], expected[STEPS]
    if ctx.backend.capabilities.bit_exact_resume:
        where = ""
        if first_differing(ours, theirs)[0] is not None:
            where = first_divergence(states, expected, half, ctx.models)
        ctx.require_identical("resumed vs uninterrupted", ours, theirs, where)
    else:
        ctx.compare("resumed vs uninterrupted", ours, theirs, "step")
