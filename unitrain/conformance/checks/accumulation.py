"""accumulation and clipping: micro-batches add up like one batch; clipping is torch's.

Accumulating k micro-batches of n examples (``backward(n / total)`` each) must give the
update of one batch of k x n; uneven micro-batches are weighted by size. Clipping to a
global norm must match the reference's ``max_norm / (norm + 1e-6)`` rule, alone and with
accumulation (clipping the sum, not each micro-batch). The epsilon in that rule shifts an
update by ``1e-6 / norm`` relative, below the float32 tolerance for gradients of norm 1, so
``small_norm`` injects gradients small enough that it shows in every dtype a backend declares.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import LINEAR_PROBE, model_state, upcast, with_zeros
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, classifier_data, fit


def _accumulated(ctx: Context, k: int, *, sizes: tuple[int, ...] | None = None) -> None:
    optimizer = optim.SGD(momentum=0.9)
    x, y = classifier_data(ctx)
    whole = ctx.make(classifier(), optimizer=optimizer)
    parts = ctx.make(classifier(), optimizer=optimizer)
    sizes = sizes or (8,) * k
    for update in range(3):
        start = update * sum(sizes)
        ctx.update(
            whole, (x[start : start + sum(sizes)], y[start : start + sum(sizes)]), 0.1, fused=False
        )
        offset = start
        for n in sizes:
            parts.forward((x[offset : offset + n], y[offset : offset + n]))
            parts.backward(n / sum(sizes))
            offset += n
        parts.step(0.1)
    ctx.compare(
        f"state after 3 updates of {len(sizes)} micro-batches vs whole batches",
        parts.state_dict(),
        whole.state_dict(),
        "step",
    )


@check(
    "accumulation",
    "two_micro_batches",
    guards="backward ignoring its scale (micro-batch gradients summed, not averaged)",
)
def two_micro_batches(ctx: Context) -> None:
    """2 micro-batches of 8 equal one batch of 16."""
    _accumulated(ctx, 2)


@check(
    "accumulation",
    "four_micro_batches",
    guards="gradient buffers overwritten instead of added to, or the scale applied twice",
)
def four_micro_batches(ctx: Context) -> None:
    """4 micro-batches of 4 equal one batch of 16."""
    _accumulated(ctx, 4, sizes=(4, 4, 4, 4))


@check(
    "accumulation",
    "uneven_micro_batches",
    guards="micro-batches weighted 1/k instead of by their size",
)
def uneven_micro_batches(ctx: Context) -> None:
    """Micro-batches of 10 and 6 weighted by size equal one batch of 16."""
    _accumulated(ctx, 2, sizes=(10, 6))


@check(
    "accumulation",
    "trainer_matches_reference",
    guards="an accumulated run (short last group included) that drifts from the reference",
)
def trainer_matches_reference(ctx: Context) -> None:
    """A Trainer run with grad_accum_steps=4 (short last group) matches the reference."""
    _trainer_vs_reference(ctx, optim.Adam(), grad_accum_steps=4)


def _trainer_vs_reference(
    ctx: Context, optimizer: optim.Optimizer, grad_clip_norm: float | None = None, **config: Any
) -> None:
    clip = {} if grad_clip_norm is None else {"grad_clip_norm": grad_clip_norm}
    backend = ctx.make(classifier(), optimizer=optimizer, **clip)
    reference = ctx.reference(classifier(), "float64", optimizer=optimizer, **clip)
    reference.load_state_dict(upcast(backend.state_dict()))
    common = {"model": classifier(), "optimizer": optimizer, "epochs": 2, **clip, **config}
    ours = fit(ctx, backend, **common)
    theirs = fit(ctx, reference, dtype="float64", **common)
    ctx.compare(
        "loss per epoch",
        [r["loss"] for r in ours.history],
        [r["loss"] for r in theirs.history],
        "training",
    )
    ctx.compare("final state", ours.backend.state_dict(), theirs.backend.state_dict(), "training")


@check(
    "clipping",
    "active",
    guards="a clipping rule other than torch's max_norm / (norm + 1e-6), or clipping per tensor",
)
def active(ctx: Context) -> None:
    """Clipping to a small global norm (active at every update) matches the reference."""
    _trainer_vs_reference(ctx, optim.SGD(momentum=0.9), grad_clip_norm=0.05)


@check(
    "clipping",
    "inactive",
    guards="gradients scaled up when their norm is below max_norm",
)
def inactive(ctx: Context) -> None:
    """A global norm above every gradient's leaves updates as without clipping."""
    _trainer_vs_reference(ctx, optim.SGD(momentum=0.9), grad_clip_norm=1e3)


@check(
    "clipping",
    "with_accumulation",
    guards="each micro-batch clipped instead of the accumulated gradient",
)
def with_accumulation(ctx: Context) -> None:
    """Clipping applies to the accumulated gradient, not to each micro-batch."""
    _trainer_vs_reference(ctx, optim.Adam(), grad_clip_norm=0.05, grad_accum_steps=3)


@check(
    "clipping",
    "single_update",
    guards="one clipped update that differs from the reference's",
)
def single_update(ctx: Context) -> None:
    """One clipped update equals the reference's within ``step``."""
    optimizer = optim.SGD()
    backend = ctx.make(classifier(), optimizer=optimizer, grad_clip_norm=0.01)
    reference = ctx.reference(classifier(), optimizer=optimizer, grad_clip_norm=0.01)
    reference.load_state_dict(upcast(backend.state_dict()))
    x, y = classifier_data(ctx)
    ctx.update(backend, (x[:16], y[:16]), 0.5)
    ctx.update(reference, (x[:16], y[:16]), 0.5)
    ctx.compare(
        "state after one clipped update", backend.state_dict(), reference.state_dict(), "step"
    )


@check(
    "clipping",
    "small_norm",
    guards="a clipping epsilon dropped or changed (below float32 tolerance at ordinary sizes)",
)
def small_norm(ctx: Context) -> None:
    """Clipping a small gradient keeps the 1e-6 epsilon of max_norm / (norm + 1e-6).

    The gradient's norm is chosen so that the epsilon moves the update 100 times the
    ``step`` tolerance of this dtype (norm 1e-2 in float32), so a float32-only backend that
    drops or changes the epsilon fails here although a float64 run would be needed to see it
    at ordinary gradient sizes.
    """
    norm = min(1.0, optim.CLIP_EPSILON / (100 * ctx.tolerance.step))
    rng = np.random.default_rng(0xC11B)
    gradient = rng.choice([-1.0, 1.0], (8, 4)) * rng.uniform(0.5, 1.0, (8, 4))
    # Rows sum into the bias gradient too: scale so the global norm (weights and bias) is norm.
    total = np.sqrt(np.sum(gradient**2) + np.sum(gradient.sum(axis=0) ** 2))
    gradient *= norm / total
    smallest_normal = np.finfo(np.float16 if ctx.dtype == "float16" else np.float32).tiny
    if np.min(np.abs(gradient)) < smallest_normal:
        ctx.skip(f"gradients of norm {norm:.1g} are not representable in {ctx.dtype}")
    # From zero weights with the identity as inputs, the MSE gradient of W is -y / 16.
    batch = (ctx.host(np.eye(8)), ctx.host(-16.0 * gradient))
    results = []
    for backend in (
        ctx.make(LINEAR_PROBE, loss="mse", optimizer=optim.SGD(), grad_clip_norm=norm / 4),
        ctx.reference(LINEAR_PROBE, loss="mse", optimizer=optim.SGD(), grad_clip_norm=norm / 4),
    ):
        backend.load_state_dict(with_zeros(backend.state_dict()))
        ctx.update(backend, batch, 1.0)
        results.append(backend.state_dict())
    ours, theirs = (model_state(state) for state in results)
    ctx.compare(
        f"update clipped from norm {norm:.1g} to {norm / 4:.1g}", upcast(ours), theirs, "step"
    )
