"""The optimizer configurations every backend is held to: one table for the kit and the tests.

Each row of :data:`OPTIMIZER_CASES` is one check ``optimizers::<name>``: an optimizer
configuration, the ranges of learning rates and gradient scales its trajectories draw from,
the hyperparameters hypothesis varies around it, explicit examples for the known traps, and
the formula slips the check fails on. The project's tests read the same rows (the
configurations, under the same names), so a new optimizer is one file in
:mod:`unitrain.optim` and a row here.

Ranges are plain data: ``(low, high)`` draws floats uniformly, :func:`log_range` draws them
log-uniformly, :data:`EITHER` draws a bool, and any other value is fixed.

Rows with parameter groups select parameters by name patterns that every MLP matches (the kit's
linear probe, ``layers.0.weight`` and ``layers.0.bias``, and the tests' deeper ones), so every
path an adapter has (a native form with groups of its own, or the rule in ops run per group)
meets the reference. Layer types are resolved in the core, before an adapter sees a group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from unitrain import optim

__all__ = ["EITHER", "OPTIMIZER_CASES", "LogRange", "OptimizerCase", "example", "log_range"]

#: A hyperparameter hypothesis draws as a bool.
EITHER = "either"


@dataclasses.dataclass(frozen=True)
class LogRange:
    """Floats drawn log-uniformly in ``[low, high]``."""

    low: float
    high: float


def log_range(low: float, high: float) -> LogRange:
    """A range hypothesis draws log-uniformly (decays, epsilons)."""
    return LogRange(low, high)


def example(seed: int, lr: tuple[float, float], grad: float, **fields: Any) -> dict[str, Any]:
    """An explicit example: its seed, LR range, gradient scale and hyperparameter overrides."""
    return {"seed": seed, "lr_low": lr[0], "lr_high": lr[1], "grad_scale": grad, **fields}


@dataclasses.dataclass(frozen=True)
class OptimizerCase:
    """One optimizer configuration, how the kit explores around it, and what it catches.

    Attributes:
        optimizer: the configuration; examples override its fields.
        description: what the check holds the backend to.
        guards: the formula slips the check fails on (``unitrain conformance --list``).
        lr: the learning rates of a trajectory are log-uniform in this range, one per update.
        grad: gradient scales hypothesis draws from (log-uniform).
        explore: hyperparameters hypothesis varies: ``(low, high)``, :func:`log_range`,
            :data:`EITHER`, or a fixed value.
        examples: explicit examples (:func:`example`), always run.
    """

    optimizer: optim.AbstractOptimizer
    description: str
    guards: str
    lr: tuple[float, float]
    grad: tuple[float, float]
    explore: Mapping[str, Any] | None
    examples: tuple[dict[str, Any], ...]

    def build(self, drawn: Mapping[str, Any]) -> optim.AbstractOptimizer:
        """The optimizer of an example: :attr:`optimizer` with the example's fields."""
        names = {field.name for field in dataclasses.fields(self.optimizer)}  # type: ignore[arg-type]
        return dataclasses.replace(  # type: ignore[type-var]
            self.optimizer, **{k: v for k, v in drawn.items() if k in names}
        )


_SGD_LR, _SGD_GRAD = (1e-3, 0.3), (1e-2, 10.0)
_ADAM_LR, _ADAM_GRAD = (1e-4, 1e-2), (1e-2, 1.0)
_SMALL_LR = (1e-4, 1e-3)
# Lion moves every entry by exactly lr, so with an LR held constant the float32 roundings of
# p - lr * sign repeat instead of averaging out, and a correct float32 Lion drifts past the
# 1e-6 bar (1.1e-6 measured over 100 updates at lr 1e-4). These ranges keep the LR of each
# update spread over at least a decade, as the other optimizers' checks have by their steps.
_LION_LR = (1e-5, 1e-2)
_MOMENTUM = (0.5, 0.99)
_DECAY = log_range(1e-5, 1e-2)
_BETAS = {"beta1": (0.8, 0.95), "beta2": (0.9, 0.9999)}
_EPS = log_range(1e-8, 1e-6)
_ALPHA = (0.9, 0.999)
# Adadelta's step is sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g, about sqrt(eps) at
# first whatever the gradient, so its LR is of order one (torch's default is 1.0). Two decades:
# hypothesis draws a trajectory's lowest LR from the first and its highest from the last.
_ADADELTA_LR = (1e-2, 1.0)
_ADAGRAD_LR = (1e-3, 1e-1)


def _case(
    optimizer: optim.AbstractOptimizer,
    description: str,
    guards: str,
    lr: tuple[float, float],
    grad: tuple[float, float],
    explore: Mapping[str, Any] | None,
    *examples: dict[str, Any],
) -> OptimizerCase:
    return OptimizerCase(optimizer, description, guards, lr, grad, explore, examples)


#: name -> the case; ``optimizers::<name>`` in the kit, the same name in the tests.
OPTIMIZER_CASES: dict[str, OptimizerCase] = {
    "sgd": _case(
        optim.SGD(),
        "plain SGD",
        "a learning rate or gradient applied with another rounding or sign",
        _SGD_LR,
        _SGD_GRAD,
        {},
        example(1, _SGD_LR, 1.0),
    ),
    "sgd_momentum": _case(
        optim.SGD(momentum=0.9),
        "SGD with heavy-ball momentum (w -= lr * b, the LR outside the buffer)",
        "Keras-style momentum (the LR inside the buffer: m = mu*m - lr*g)",
        _SGD_LR,
        _SGD_GRAD,
        {"momentum": _MOMENTUM},
        example(2, _SGD_LR, 1.0),
    ),
    "sgd_nesterov": _case(
        optim.SGD(momentum=0.9, nesterov=True),
        "SGD with Nesterov momentum",
        "nesterov=True ignored or applied as Keras/TF does",
        _SGD_LR,
        _SGD_GRAD,
        {"momentum": _MOMENTUM, "nesterov": True},
        example(3, _SGD_LR, 1.0),
    ),
    "sgd_weight_decay": _case(
        optim.SGD(weight_decay=1e-2),
        "SGD with coupled L2 weight decay",
        "weight decay dropped, or decoupled instead of added to the gradient",
        _SGD_LR,
        _SGD_GRAD,
        {"weight_decay": _DECAY},
        example(4, _SGD_LR, 0.1),
    ),
    "sgd_momentum_weight_decay": _case(
        optim.SGD(momentum=0.9, weight_decay=1e-3),
        "SGD with momentum and L2 weight decay",
        "decay added after the momentum buffer instead of before",
        _SGD_LR,
        _SGD_GRAD,
        {"momentum": _MOMENTUM, "weight_decay": _DECAY},
        example(5, _SGD_LR, 0.1, nesterov=True),
    ),
    "adam": _case(
        optim.Adam(),
        "Adam (bias corrections from the update count, eps added to sqrt(v_hat))",
        "bias corrections missing or from a float32 beta**t, betas swapped",
        _ADAM_LR,
        _ADAM_GRAD,
        {"eps": _EPS, **_BETAS},
        example(6, _ADAM_LR, 0.1),
    ),
    "adam_small_gradients": _case(
        optim.Adam(eps=1e-6),
        "Adam with gradients near eps (separates the two epsilon placements)",
        "epsilon added to sqrt(v) before the bias correction (Keras, TF)",
        _SMALL_LR,
        _ADAM_GRAD,
        None,
        example(7, _SMALL_LR, 1e-3),
        example(8, _SMALL_LR, 3e-3, eps=1e-7),
    ),
    "adam_weight_decay": _case(
        optim.Adam(weight_decay=1e-2),
        "Adam with coupled L2 weight decay",
        "Adam's L2 decay decoupled (AdamW) or dropped",
        _ADAM_LR,
        _ADAM_GRAD,
        {"weight_decay": _DECAY, **_BETAS},
        example(9, _ADAM_LR, 0.1),
    ),
    "adamw": _case(
        optim.AdamW(weight_decay=0.01),
        "AdamW (decoupled decay in the update expression)",
        "AdamW's decay coupled into the gradient, or applied in another expression",
        _ADAM_LR,
        _ADAM_GRAD,
        {"eps": _EPS, "weight_decay": (1e-3, 0.1), **_BETAS},
        example(10, _ADAM_LR, 0.1),
    ),
    "adamw_small_gradients": _case(
        optim.AdamW(eps=1e-6, weight_decay=0.05),
        "AdamW with gradients near eps",
        "AdamW's epsilon placement near tiny gradients",
        _SMALL_LR,
        _ADAM_GRAD,
        None,
        example(11, _SMALL_LR, 1e-3),
    ),
    "rmsprop": _case(
        optim.RMSprop(),
        "RMSprop (eps added after the square root, torch's definition)",
        "eps inside the square root, or alpha and 1 - alpha swapped",
        _ADAM_LR,
        _ADAM_GRAD,
        {"alpha": _ALPHA, "eps": _EPS, "weight_decay": _DECAY},
        example(12, _ADAM_LR, 0.1),
        example(13, _SMALL_LR, 1e-3, eps=1e-6),
    ),
    "rmsprop_centered": _case(
        optim.RMSprop(centered=True),
        "centered RMSprop (divides by the root of the running variance)",
        "centered ignored, or the mean subtracted outside the square root",
        _ADAM_LR,
        _ADAM_GRAD,
        {"alpha": _ALPHA, "eps": _EPS, "centered": True},
        example(14, _ADAM_LR, 0.1),
    ),
    "rmsprop_momentum": _case(
        optim.RMSprop(momentum=0.9, centered=True),  # every slot RMSprop has
        "RMSprop with momentum on the normalised step (the LR outside the buffer)",
        "Keras-style momentum (the LR inside the buffer), or eps dropped there",
        _ADAM_LR,
        _ADAM_GRAD,
        {"alpha": _ALPHA, "momentum": _MOMENTUM, "centered": EITHER},
        example(15, _ADAM_LR, 0.1, centered=False),
        example(16, _ADAM_LR, 0.1, weight_decay=1e-3),
    ),
    "lion": _case(
        optim.Lion(),
        "Lion (the sign of the beta1 interpolation, the momentum tracked with beta2)",
        "the step's sign taken of the beta2 interpolation, or the momentum updated first",
        _LION_LR,
        _ADAM_GRAD,
        {"beta1": (0.8, 0.95), "beta2": _ALPHA},
        example(17, _LION_LR, 0.1),
        example(18, _LION_LR, 1.0, beta1=0.95, beta2=0.98),
    ),
    "lion_weight_decay": _case(
        optim.Lion(weight_decay=0.1),
        "Lion with decoupled weight decay in the update expression",
        "Lion's decay coupled into the gradient, or scaled without the LR",
        _LION_LR,
        _ADAM_GRAD,
        {"weight_decay": log_range(1e-2, 1.0)},
        example(19, _LION_LR, 0.1),
    ),
    "adadelta": _case(
        optim.Adadelta(),
        "Adadelta (eps inside both square roots, the step's own average updated after it)",
        "eps added outside the roots, or acc_delta updated before the step that reads it",
        _ADADELTA_LR,
        _ADAM_GRAD,
        {"rho": (0.8, 0.99), "eps": log_range(1e-7, 1e-5), "weight_decay": _DECAY},
        example(20, _ADADELTA_LR, 0.1),
        example(21, _ADADELTA_LR, 1.0, rho=0.95, weight_decay=1e-3),
    ),
    "adagrad": _case(
        optim.Adagrad(),
        "Adagrad (eps added after the square root of the sum, torch's definition)",
        "eps inside the square root or the sum started at 0.1 (optax, Keras), lr_decay ignored",
        _ADAGRAD_LR,
        _ADAM_GRAD,
        {
            "lr_decay": log_range(1e-4, 1e-2),
            "initial_accumulator_value": (0.0, 0.5),
            "weight_decay": _DECAY,
        },
        example(22, _ADAGRAD_LR, 0.1),
        example(23, _ADAGRAD_LR, 1e-3, eps=1e-6, lr_decay=0.01, initial_accumulator_value=0.1),
    ),
    "sgd_groups": _case(
        optim.SGD(
            momentum=0.9,
            weight_decay=1e-2,
            groups=(optim.Group("*.bias", lr_scale=3.0, momentum=0.5, weight_decay=0.0),),
        ),
        "SGD with a parameter group (the bias at 3x the LR, its own momentum, no decay)",
        "parameter groups ignored, or a group's LR scale or options applied to every parameter",
        _SGD_LR,
        _SGD_GRAD,
        {"momentum": _MOMENTUM, "nesterov": EITHER},
        example(24, _SGD_LR, 1.0),
    ),
    "adamw_groups": _case(
        optim.AdamW(
            weight_decay=0.1,
            groups=(
                optim.Group("*.bias", weight_decay=0.0),
                optim.Group("layers.0.*", lr_scale=2.0, beta2=0.95),
            ),
        ),
        "AdamW with nanoGPT-style groups (no decay on biases, the first layer's other "
        "parameters at 2x the LR)",
        "groups ignored, or the last matching group taking a parameter instead of the first",
        _ADAM_LR,
        _ADAM_GRAD,
        {"eps": _EPS, "weight_decay": (1e-3, 0.1), **_BETAS},
        example(25, _ADAM_LR, 0.1),
    ),
}
