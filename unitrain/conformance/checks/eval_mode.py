"""eval_mode: evaluate runs without dropout and changes nothing.

``evaluate`` must switch dropout off (so it is deterministic and equals the reference at the
same weights), must not change weights, optimizer state or statistics (state dict
bit-identical before and after), and must not disturb training (a run with evaluations
interleaved equals one without, bit for bit, dropout masks included). Its metrics are means
over the examples of the batch it is given, a short last batch included: a backend that
pads batches to one compiled shape must leave the padding out of the mean.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import copy_state, model_state, upcast
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, classifier_data
from unitrain.models import MLP


def _trained(ctx: Context, model: MLP, optimizer: optim.Optimizer, **fields: Any) -> Any:
    backend = ctx.make(model, optimizer=optimizer, **fields)
    x, y = classifier_data(ctx)
    for i in range(2):
        ctx.update(backend, (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]), 0.05)
    return backend


def _floats(metrics: Any) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def _against_reference(ctx: Context, backend: Any, model: MLP, batch: Any, loss: str) -> None:
    reference = ctx.reference(model, loss=loss, optimizer=optim.Adam())
    ref_state = reference.state_dict()
    ref_state.update(upcast(model_state(backend.state_dict())))
    reference.load_state_dict(ref_state)
    ours, theirs = _floats(backend.evaluate(batch)), _floats(reference.evaluate(batch))
    ctx.require_equal("metric names", sorted(ours), sorted(theirs))
    ctx.compare("evaluate loss", ours["loss"], theirs["loss"], "evaluate")
    if "accuracy" in theirs:
        # Compared as a count of correct examples: 1/3 has no exact float32 value.
        n = len(batch[1])
        count = lambda metrics: round(metrics["accuracy"] * n)  # noqa: E731
        ctx.require_equal(f"examples classified correctly of {n}", count(ours), count(theirs))


@check(
    "eval_mode",
    "dropout_off",
    guards="dropout left on in evaluate",
)
def dropout_off(ctx: Context) -> None:
    """With dropout 0.5, evaluate is deterministic and equals the no-dropout reference."""
    model = classifier(dropout=0.5)
    backend = _trained(ctx, model, optim.Adam())
    batch = classifier_data(ctx, 2, 16)
    first, second = _floats(backend.evaluate(batch)), _floats(backend.evaluate(batch))
    ctx.require_equal("evaluate twice on the same batch", second, first)
    _against_reference(ctx, backend, model, batch, "cross_entropy")


@check(
    "eval_mode",
    "no_state_change",
    guards="evaluate changing weights, optimizer state or statistics",
)
def no_state_change(ctx: Context) -> None:
    """evaluate leaves parameters, optimizer state and statistics bit-identical."""
    backend = _trained(ctx, classifier(dropout=0.25), optim.Adam())
    before = copy_state(backend.state_dict())
    for seed in (2, 3):
        backend.evaluate(classifier_data(ctx, seed, 16))
    ctx.require_identical("state after evaluate", backend.state_dict(), before)


@check(
    "eval_mode",
    "no_effect_on_training",
    guards="evaluate disturbing training (dropout masks, counters)",
)
def no_effect_on_training(ctx: Context) -> None:
    """Training with evaluations in between equals training without, bit for bit."""
    model = classifier(dropout=0.25)
    plain = ctx.make(model, optimizer=optim.SGD(momentum=0.9))
    mixed = ctx.make(model, optimizer=optim.SGD(momentum=0.9))
    x, y = classifier_data(ctx)
    probe = classifier_data(ctx, 2, 16)
    for i in range(4):
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        ctx.update(plain, batch, 0.05)
        mixed.evaluate(probe)
        ctx.update(mixed, batch, 0.05)
        mixed.evaluate(probe)
    ctx.require_identical("state, with vs without evaluate", mixed.state_dict(), plain.state_dict())


@check(
    "eval_mode",
    "matches_reference_cross_entropy",
    guards="a cross-entropy or accuracy that differs from the reference",
)
def matches_reference_cross_entropy(ctx: Context) -> None:
    """evaluate's loss and accuracy at identical weights equal the reference's."""
    model = classifier()
    backend = _trained(ctx, model, optim.Adam())
    _against_reference(ctx, backend, model, classifier_data(ctx, 4, 32), "cross_entropy")


@check(
    "eval_mode",
    "short_final_batch",
    guards="a short last batch padded, so padding enters the mean",
)
def short_final_batch(ctx: Context) -> None:
    """A short last batch (3 or 1 after 8) is averaged over its real examples (no padding)."""
    model = classifier()
    backend = _trained(ctx, model, optim.Adam())
    x, y = classifier_data(ctx, 5, 12)
    for batch in ((x[:8], y[:8]), (x[8:11], y[8:11]), (x[11:], y[11:])):
        _against_reference(ctx, backend, model, batch, "cross_entropy")
    regression = MLP((6, 8, 2), activation="tanh")
    backend = ctx.make(regression, loss="mse", optimizer=optim.Adam())
    rng = np.random.default_rng(0x5407)
    inputs, targets = ctx.host(rng.normal(size=(11, 6))), ctx.host(rng.normal(size=(11, 2)))
    for part in (slice(0, 8), slice(8, 11)):
        _against_reference(ctx, backend, regression, (inputs[part], targets[part]), "mse")


@check(
    "eval_mode",
    "matches_reference_mse",
    guards="mean squared error averaged another way (per example, summed)",
)
def matches_reference_mse(ctx: Context) -> None:
    """evaluate's mean squared error at identical weights equals the reference's."""
    model = MLP((6, 16, 2), activation="gelu")
    backend = ctx.make(model, loss="mse", optimizer=optim.Adam())
    rng = np.random.default_rng(0xE7A1)
    batch = (ctx.host(rng.normal(size=(32, 6))), ctx.host(rng.normal(size=(32, 2))))
    _against_reference(ctx, backend, model, batch, "mse")
