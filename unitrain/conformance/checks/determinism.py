"""determinism: same seed, same run; non-finite gradients handled per policy.

Two backends built with the same seed train bit-identically (dropout included); the seed
decides initial weights (those of :meth:`unitrain.models.MLP.init_params`) and dropout
masks. A NaN gradient skips the update (weights and optimizer state untouched, buffers
cleared, ``skipped_steps`` counted), and the Trainer's ``nonfinite`` policies then raise,
stop or go on exactly as they do on the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import NonFiniteError, optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import copy_state, model_state, upcast
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, classifier_data, fit


def _train(ctx: Context, backend: Any, updates: int = 5) -> Any:
    x, y = classifier_data(ctx)
    for i in range(updates):
        ctx.update(backend, (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]), 0.05)
    return backend


@check(
    "determinism",
    "same_seed_identical",
    guards="unseeded randomness (two same-seed runs differ)",
)
def same_seed_identical(ctx: Context) -> None:
    """Two backends built with the same seed train bit-identically (with dropout)."""
    model = classifier(dropout=0.25)
    first = _train(ctx, ctx.make(model, optimizer=optim.Adam(), seed=3))
    second = _train(ctx, ctx.make(model, optimizer=optim.Adam(), seed=3))
    ctx.require_identical("state of two same-seed runs", second.state_dict(), first.state_dict())


@check(
    "determinism",
    "initial_weights",
    guards="initial weights not taken from MLP.init_params(seed)",
)
def initial_weights(ctx: Context) -> None:
    """A fresh backend holds MLP.init_params(seed) in its dtype, like every backend."""
    model = classifier()
    backend = ctx.make(model, optimizer=optim.SGD(), seed=4)
    source_dtype = np.float64 if ctx.dtype == "float64" else np.float32
    expected = {
        f"model.{k}": ctx.host(v).astype(ctx.state_dtype)
        for k, v in model.init_params(4, source_dtype).items()
    }
    ctx.require_identical("initial weights", model_state(backend.state_dict()), expected)


@check(
    "determinism",
    "seed_sets_dropout",
    guards="dropout masks that ignore the seed",
)
def seed_sets_dropout(ctx: Context) -> None:
    """From equal weights, another seed draws other dropout masks (the seed is used)."""
    model = classifier(dropout=0.5)
    first = ctx.make(model, optimizer=optim.SGD(), seed=1)
    second = ctx.make(model, optimizer=optim.SGD(), seed=2)
    second.load_state_dict(first.state_dict())
    _train(ctx, first, 1)
    _train(ctx, second, 1)
    differs = any(
        not np.array_equal(a, b)
        for a, b in zip(
            model_state(first.state_dict()).values(), model_state(second.state_dict()).values()
        )
    )
    ctx.require(differs, "seeds 1 and 2 gave identical dropout masks")


def _nan_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    x, y = classifier_data(ctx, 5, 8)
    x = np.array(x, copy=True)
    x[3, 2] = np.nan
    return x, y


@check(
    "determinism",
    "nonfinite_skips_update",
    guards="an update applied, or buffers kept, after a NaN gradient",
)
def nonfinite_skips_update(ctx: Context) -> None:
    """A NaN gradient leaves state untouched, clears the buffers and counts a skip."""
    backend = _train(ctx, ctx.make(classifier(), optimizer=optim.SGD(momentum=0.9)), 2)
    twin = ctx.make(classifier(), optimizer=optim.SGD(momentum=0.9))
    twin.load_state_dict(backend.state_dict())
    before = copy_state(backend.state_dict())
    ctx.update(backend, _nan_batch(ctx), 0.05)
    ctx.require_identical("state after a NaN update", backend.state_dict(), before)
    ctx.require_equal("skipped_steps", int(backend.skipped_steps), 1)
    x, y = classifier_data(ctx, 6, 8)
    ctx.update(backend, (x, y), 0.05)
    ctx.update(twin, (x, y), 0.05)
    ctx.require_identical("next update (buffers cleared)", backend.state_dict(), twin.state_dict())


def _policy_run(ctx: Context, backend: Any, policy: str, dtype: str) -> Any:
    x, y = classifier_data(ctx)
    batches = [(x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]) for i in range(5)]
    batches.insert(2, _nan_batch(ctx))
    return fit(
        ctx,
        backend,
        model=classifier(),
        optimizer=optim.SGD(momentum=0.9),
        epochs=2,
        train=batches,
        nonfinite=policy,
        dtype=dtype,
    )


def _policy(ctx: Context, policy: str) -> None:
    backend = ctx.make(classifier(), optimizer=optim.SGD(momentum=0.9))
    reference = ctx.reference(classifier(), optimizer=optim.SGD(momentum=0.9))
    reference.load_state_dict(upcast(backend.state_dict()))
    outcomes = []
    for runner, dtype in ((backend, ctx.dtype), (reference, "float64")):
        try:
            trainer = _policy_run(ctx, runner, policy, dtype)
        except NonFiniteError:
            outcomes.append(("raised NonFiniteError", None))
        else:
            outcomes.append(
                (
                    f"{trainer.state.step} updates, {trainer.skipped_steps} skipped",
                    trainer.backend.state_dict(),
                )
            )
    ctx.require_equal(f"outcome of nonfinite={policy!r}", outcomes[0][0], outcomes[1][0])
    if outcomes[1][1] is not None:
        ctx.compare("final state", outcomes[0][1], outcomes[1][1], "training")


@check(
    "determinism",
    "nonfinite_raise",
    guards="nonfinite='raise' not raising at the reference's step",
)
def nonfinite_raise(ctx: Context) -> None:
    """nonfinite='raise' raises NonFiniteError, as on the reference."""
    _policy(ctx, "raise")


@check(
    "determinism",
    "nonfinite_stop",
    guards="nonfinite='stop' ending at another step or with other weights",
)
def nonfinite_stop(ctx: Context) -> None:
    """nonfinite='stop' ends training at the reference's step with its weights."""
    _policy(ctx, "stop")


@check(
    "determinism",
    "nonfinite_skip_batch",
    guards="nonfinite='skip_batch' training on differently after the skip",
)
def nonfinite_skip_batch(ctx: Context) -> None:
    """nonfinite='skip_batch' skips the NaN update and trains on like the reference."""
    _policy(ctx, "skip_batch")
