"""losses: every built-in loss and a user's loss equal the float64 reference.

Each check builds a model whose outputs are known, one linear layer loaded with the identity
and a zero bias, so ``evaluate((logits, targets))`` gives the backend's loss of those logits,
and compares it with the loss's own code run by the numpy ops in float64
(:meth:`unitrain.losses.AbstractLoss.reference`): over the batch (the reduction, class
weights and ignored positions included) and, for a loss that averages its examples, over
each example alone (the values per example, which data-parallel weighting relies on). Two
checks make one SGD update through the loss and compare the weights with the reference
backend's, which holds the gradient of the loss to the reference's too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, final

import numpy as np

from unitrain import losses, ops, optim
from unitrain.conformance._context import Context
from unitrain.conformance._registry import add_check
from unitrain.losses import AbstractLoss
from unitrain.models import MLP
from unitrain.ops import Array

__all__ = ["LogCosh"]

#: Examples (and positions of a sequence, classes or outputs) in each check's batch.
_N, _L, _C = 6, 3, 4
#: The label padded positions carry (torch's default ignore_index).
_PAD = -100


@final
@dataclasses.dataclass(frozen=True)
class LogCosh(AbstractLoss, type_name="conformance_log_cosh"):
    """``log(cosh(output - target))`` averaged per example: a user's loss written in ops,
    which every backend must run as it runs its built-in ones."""

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """``|d| + log1p(exp(-2|d|)) - log 2``, the overflow-free ``log(cosh(d))``."""
        d = ops.abs(outputs - losses.targets_like(targets, outputs))
        return losses.mean_per_example(d + ops.log1p(ops.exp(-2.0 * d)) - math.log(2.0))


def _logits(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.normal(scale=2.0, size=shape)


def _labels(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _logits(rng, _N, _C), rng.integers(0, _C, size=_N)


def _padded_sequence(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sequence logits ``(N, L, V)`` and labels with some positions padded."""
    labels = rng.integers(0, _C, size=(_N, _L))
    labels[rng.random((_N, _L)) < 0.3] = _PAD
    labels[0, 0] = _PAD  # at least one padded position
    return _logits(rng, _N, _L, _C), labels


def _values(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _logits(rng, _N, _C), _logits(rng, _N, _C)


def _probabilities(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    targets = rng.dirichlet(np.ones(_C), size=_N)
    targets[0] = [0.0, 0.5, 0.5, 0.0]  # zero probabilities: 0 * log 0 counts as 0
    return _logits(rng, _N, _C), targets


def _unit_interval(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _logits(rng, _N, _C), rng.uniform(size=(_N, _C))


@dataclasses.dataclass(frozen=True)
class _Case:
    """One check: a loss, its batch, and whether its examples are compared one by one."""

    name: str
    loss: AbstractLoss
    batch: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]]
    description: str
    guards: str
    #: Compare each example alone too (a loss whose batch loss is its examples' mean).
    each_example: bool = True


_WEIGHTS = (0.5, 2.0, 1.0, 3.0)

_CASES = (
    _Case(
        "cross_entropy",
        losses.CrossEntropy(),
        _labels,
        "CrossEntropy() of (N, C) logits equals the reference, per example and over the batch.",
        "a cross-entropy off the reference (log-softmax unshifted, a label off by one)",
    ),
    _Case(
        "label_smoothing",
        losses.CrossEntropy(label_smoothing=0.2),
        _labels,
        "CrossEntropy(label_smoothing=0.2) spreads 0.2 over every class, as torch does.",
        "label smoothing ignored or spread over the other classes only (Keras' form)",
    ),
    _Case(
        "class_weights",
        losses.CrossEntropy(class_weights=_WEIGHTS, label_smoothing=0.1),
        _labels,
        "Class weights give torch's weighted mean: divided by the weights of the labels.",
        "class weights ignored, or the weighted sum divided by the count of examples",
        each_example=False,
    ),
    _Case(
        "ignore_index",
        losses.CrossEntropy(ignore_index=_PAD, class_weights=_WEIGHTS),
        _padded_sequence,
        "Sequence logits (N, L, V): padded positions (ignore_index) leave the mean.",
        "padding counted in the mean, or sequence positions averaged per example first",
        each_example=False,
    ),
    _Case(
        "binary_cross_entropy_with_logits",
        losses.BinaryCrossEntropyWithLogits(),
        _unit_interval,
        "BinaryCrossEntropyWithLogits equals softplus(x) - x y, averaged per example.",
        "a sigmoid cross-entropy that overflows, or is summed over outputs",
    ),
    _Case(
        "mse",
        losses.MSE(),
        _values,
        "MSE averages the squared differences of every output of every example.",
        "squared errors summed over outputs, or targets broadcast against the outputs",
    ),
    _Case(
        "huber",
        losses.Huber(delta=1.5),
        _values,
        "Huber(delta=1.5) is torch's HuberLoss on both sides of delta.",
        "smooth L1 (divided by delta) for Huber, or the line not joined at delta",
    ),
    _Case(
        "kl_divergence",
        losses.KLDivergence(),
        _probabilities,
        "KLDivergence of target probabilities from softmax(logits), summed over classes.",
        "torch's elementwise 'mean' (divided by classes too), or NaN from 0 * log 0",
    ),
    _Case(
        "user_loss",
        LogCosh(),
        _values,
        "A user's loss written in ops runs and equals its own float64 reference.",
        "a backend that runs only the built-in losses",
    ),
)


def _identity(ctx: Context, loss: AbstractLoss, classes: int, *, reference: bool = False) -> Any:
    """A backend (or the float64 reference) of one linear layer, ``MLP((C, C))``, holding
    the identity: every backend of portable models builds it, portable layers or not."""
    model = MLP((classes, classes))
    fields: dict[str, Any] = {"loss": loss, "optimizer": optim.SGD()}
    backend = ctx.reference(model, **fields) if reference else ctx.make(model, **fields)
    state = backend.state_dict()
    for key, value in state.items():
        if key.startswith("model."):
            eye = np.eye(classes) if value.ndim == 2 else np.zeros(value.shape)
            state[key] = eye.astype(value.dtype)
    backend.load_state_dict(state)
    return backend


def _batch(ctx: Context, case: _Case) -> tuple[np.ndarray, np.ndarray]:
    logits, targets = case.batch(np.random.default_rng(0x1055))
    logits = ctx.host(logits)
    targets = targets.astype(np.int64) if targets.dtype.kind in "iu" else ctx.host(targets)
    return logits, targets


def _evaluate(ctx: Context, case: _Case) -> None:
    backend = _identity(ctx, case.loss, _C)
    logits, targets = _batch(ctx, case)
    expected = float(case.loss.reference(logits, targets))
    got = float(backend.evaluate((logits, targets))["loss"])
    ctx.compare(f"{case.name} loss of the batch", got, expected, "evaluate")
    if case.each_example:
        per_example = case.loss.reference(logits, targets, per_example=True)
        alone = [
            float(backend.evaluate((logits[i : i + 1], targets[i : i + 1]))["loss"])
            for i in range(_N)
        ]
        ctx.compare(f"{case.name} loss of each example alone", alone, per_example, "evaluate")


def _register(case: _Case) -> None:
    add_check(
        "losses",
        case.name,
        lambda ctx: _evaluate(ctx, case),
        description=case.description,
        guards=case.guards,
    )


for _case in _CASES:
    _register(_case)


def _one_update(ctx: Context, loss: AbstractLoss, batch: tuple[np.ndarray, np.ndarray]) -> None:
    backend = _identity(ctx, loss, _C)
    reference = _identity(ctx, loss, _C, reference=True)
    for trained in (backend, reference):  # a fused train_step where the backend has one
        ctx.update(trained, batch, 0.5)
    state = {k: v for k, v in backend.state_dict().items() if k.startswith("model.")}
    expected = {k: reference.state_dict()[k] for k in state}
    ctx.compare(f"weights after one update through {type(loss).__name__}", state, expected, "step")


def _update_case(name: str, loss: AbstractLoss, batch: Any, description: str, guards: str) -> None:
    def run(ctx: Context) -> None:
        logits, targets = batch(np.random.default_rng(0x6A7))
        targets = targets.astype(np.int64) if targets.dtype.kind in "iu" else ctx.host(targets)
        _one_update(ctx, loss, (ctx.host(logits), targets))

    add_check("losses", name, run, description=description, guards=guards)


_update_case(
    "gradient_cross_entropy",
    losses.CrossEntropy(label_smoothing=0.1, ignore_index=_PAD, class_weights=_WEIGHTS),
    _padded_sequence,
    "One update through a smoothed, weighted, padded cross-entropy equals the reference's.",
    "a gradient that differs from the loss's (a native form held to another definition)",
)
_update_case(
    "gradient_user_loss",
    LogCosh(),
    _values,
    "One update through a user's loss written in ops equals the reference's.",
    "a user's loss trained through something other than its code in ops",
)
