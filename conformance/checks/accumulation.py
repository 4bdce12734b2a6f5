"""accumulation and clipping: micro-batches add up like one batch; clipping is torch's.

Accumulating k micro-batches of n examples (``backward(n / total)`` each) must give the
update of one batch of k x n; uneven micro-batches are weighted by size. Clipping to a
global norm must match the reference's ``max_norm / (norm + 1e-6)`` rule, alone and with
accumulation (clipping the sum, not each micro-batch).
"""

from __future__ import annotations

from typing import Any

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import upcast
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


@check("accumulation", "two_micro_batches")
def two_micro_batches(ctx: Context) -> None:
    """2 micro-batches of 8 equal one batch of 16."""
    _accumulated(ctx, 2)


@check("accumulation", "four_micro_batches")
def four_micro_batches(ctx: Context) -> None:
    """4 micro-batches of 4 equal one batch of 16."""
    _accumulated(ctx, 4, sizes=(4, 4, 4, 4))


@check("accumulation", "uneven_micro_batches")
def uneven_micro_batches(ctx: Context) -> None:
    """Micro-batches of 10 and 6 weighted by size equal one batch of 16."""
    _accumulated(ctx, 2, sizes=(10, 6))


@check("accumulation", "trainer_matches_reference")
def trainer_matches_reference(ctx: Context) -> None:
    """A Trainer run with grad_accum_steps=4 (short last group) matches the reference."""
    _trainer_vs_reference(ctx, optim.Adam(), grad_accum_steps=4)


def _trainer_vs_reference(
    ctx: Context, optimizer: optim.Optimizer, grad_clip_norm: float | None = None, **config: Any
) -> None:
    clip = {} if grad_clip_norm is None else {"grad_clip_norm": grad_clip_norm}
    backend = ctx.make(classifier(), optimizer=optimizer, **clip)
    reference = ctx.reference(classifier(), optimizer=optimizer, **clip)
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


@check("clipping", "active")
def active(ctx: Context) -> None:
    """Clipping to a small global norm (active at every update) matches the reference."""
    _trainer_vs_reference(ctx, optim.SGD(momentum=0.9), grad_clip_norm=0.05)


@check("clipping", "inactive")
def inactive(ctx: Context) -> None:
    """A global norm above every gradient's leaves updates as without clipping."""
    _trainer_vs_reference(ctx, optim.SGD(momentum=0.9), grad_clip_norm=1e3)


@check("clipping", "with_accumulation")
def with_accumulation(ctx: Context) -> None:
    """Clipping applies to the accumulated gradient, not to each micro-batch."""
    _trainer_vs_reference(ctx, optim.Adam(), grad_clip_norm=0.05, grad_accum_steps=3)


@check("clipping", "single_update")
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
