"""optimizers: 100 updates with a changing learning rate match the float64 reference.

Halfway through, the run continues on a fresh backend loaded with the first one's state
dict, and the final state dict must hold exactly the reference's keys: optimizer state that
is not saved, not restored, or saved under another name than its declared slots fails.
(The slots' values are not compared: near tiny gradients they carry the targets' float32
rounding, while the parameters they move are what the trajectory bar was measured on.)

Gradients are injected through the linear probe (see :mod:`unitrain.conformance._probes`),
so the backend and the reference see the same gradient at every update, and the comparison
isolates the optimizer's arithmetic: parameters and optimizer state, normwise, against the
``trajectory`` tolerance (1e-6 in float32). hypothesis draws hyperparameters, gradient
scales and seeds from bounded, realistic ranges; explicit examples cover the known traps
(a learning rate that changes every step, which separates ``w -= lr * b`` from Keras's
``b = mu * b - lr * g``; tiny gradients, where Adam's epsilon placement matters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._hypothesis import explore
from unitrain.conformance._probes import model_state, optimizer_trajectory
from unitrain.conformance._registry import add_check

__all__ = ["OPTIMIZER_CHECKS"]

STEPS = 100


def _lrs(seed: int, low: float, high: float) -> list[float]:
    rng = np.random.default_rng([seed, 0x1A])
    return [float(v) for v in 10.0 ** rng.uniform(np.log10(low), np.log10(high), STEPS)]


def _run_example(ctx: Context, build: Callable[[dict[str, Any]], optim.Optimizer]) -> Any:
    def run(example: dict[str, Any]) -> None:
        optimizer = build(example)
        got, want = optimizer_trajectory(
            ctx,
            optimizer,
            seed=example["seed"],
            lrs=_lrs(example["seed"], example["lr_low"], example["lr_high"]),
            grad_scale=example["grad_scale"],
            handoff_at=STEPS // 2,
        )
        what = f"parameters after {STEPS} updates"
        ctx.compare(what, model_state(got), model_state(want), "trajectory")
        ctx.require_equal("optimizer.step", int(got["optimizer.step"]), STEPS)
        ctx.require_equal("state dict keys", sorted(got), sorted(want))

    return run


def _floats(low: float, high: float, log: bool = False) -> Any:
    from hypothesis import strategies as st

    if log:
        return st.floats(np.log10(low), np.log10(high)).map(lambda e: float(10.0**e))
    return st.floats(low, high)


def _strategy(lr: tuple[float, float], grad: tuple[float, float], **extra: Any) -> Any:
    def make() -> Any:
        from hypothesis import strategies as st

        fields = {
            "seed": st.integers(0, 2**16),
            "lr_low": _floats(lr[0], lr[0] * 10, log=True),
            "lr_high": _floats(lr[1] / 10, lr[1], log=True),
            "grad_scale": _floats(grad[0], grad[1], log=True),
        }
        for name, value in extra.items():
            fields[name] = value() if callable(value) else st.just(value)
        return st.fixed_dictionaries(fields)

    return make


def _example(seed: int, lr: tuple[float, float], grad: float, **extra: Any) -> dict[str, Any]:
    return {"seed": seed, "lr_low": lr[0], "lr_high": lr[1], "grad_scale": grad, **extra}


def _sgd(example: dict[str, Any]) -> optim.Optimizer:
    return optim.SGD(
        momentum=example.get("momentum", 0.0),
        nesterov=example.get("nesterov", False),
        weight_decay=example.get("weight_decay", 0.0),
    )


def _adam(kind: Callable[..., optim.Optimizer]) -> Callable[[dict[str, Any]], optim.Optimizer]:
    def build(example: dict[str, Any]) -> optim.Optimizer:
        return kind(
            beta1=example.get("beta1", 0.9),
            beta2=example.get("beta2", 0.999),
            eps=example.get("eps", 1e-8),
            weight_decay=example.get("weight_decay", 0.0),
        )

    return build


def _rmsprop(example: dict[str, Any]) -> optim.Optimizer:
    return optim.RMSprop(
        alpha=example.get("alpha", 0.99),
        eps=example.get("eps", 1e-8),
        centered=example.get("centered", False),
        momentum=example.get("momentum", 0.0),
        weight_decay=example.get("weight_decay", 0.0),
    )


def _lion(example: dict[str, Any]) -> optim.Optimizer:
    return optim.Lion(
        beta1=example.get("beta1", 0.9),
        beta2=example.get("beta2", 0.99),
        weight_decay=example.get("weight_decay", 0.0),
    )


_SGD_LR, _SGD_GRAD = (1e-3, 0.3), (1e-2, 10.0)
_ADAM_LR, _ADAM_GRAD = (1e-4, 1e-2), (1e-2, 1.0)
_SMALL_LR = (1e-4, 1e-3)
# Lion moves every entry by exactly lr, so with an LR held constant the float32 roundings of
# p - lr * sign repeat instead of averaging out, and a correct float32 Lion drifts past the
# 1e-6 bar (1.1e-6 measured over 100 updates at lr 1e-4). These ranges keep the LR of each
# update spread over at least a decade, as the other optimizers' checks have by their steps.
_LION_LR = (1e-5, 1e-2)
_MOMENTUM = lambda: _floats(0.5, 0.99)  # noqa: E731
_DECAY = lambda: _floats(1e-5, 1e-2, log=True)  # noqa: E731
_BETAS = {"beta1": lambda: _floats(0.8, 0.95), "beta2": lambda: _floats(0.9, 0.9999)}
_EPS = lambda: _floats(1e-8, 1e-6, log=True)  # noqa: E731
_ALPHA = lambda: _floats(0.9, 0.999)  # noqa: E731


def _booleans() -> Any:
    from hypothesis import strategies as st

    return st.booleans()


#: name -> (build, strategy, explicit examples, description)
OPTIMIZER_CHECKS: dict[str, tuple[Any, Any, list[dict[str, Any]], str]] = {
    "sgd": (
        _sgd,
        _strategy(_SGD_LR, _SGD_GRAD),
        [_example(1, _SGD_LR, 1.0)],
        "plain SGD",
    ),
    "sgd_momentum": (
        _sgd,
        _strategy(_SGD_LR, _SGD_GRAD, momentum=_MOMENTUM),
        [_example(2, _SGD_LR, 1.0, momentum=0.9)],
        "SGD with heavy-ball momentum (w -= lr * b, the LR outside the buffer)",
    ),
    "sgd_nesterov": (
        _sgd,
        _strategy(_SGD_LR, _SGD_GRAD, momentum=_MOMENTUM, nesterov=True),
        [_example(3, _SGD_LR, 1.0, momentum=0.9, nesterov=True)],
        "SGD with Nesterov momentum",
    ),
    "sgd_weight_decay": (
        _sgd,
        _strategy(_SGD_LR, _SGD_GRAD, weight_decay=_DECAY),
        [_example(4, _SGD_LR, 0.1, weight_decay=1e-2)],
        "SGD with coupled L2 weight decay",
    ),
    "sgd_momentum_weight_decay": (
        _sgd,
        _strategy(_SGD_LR, _SGD_GRAD, momentum=_MOMENTUM, weight_decay=_DECAY),
        [_example(5, _SGD_LR, 0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)],
        "SGD with momentum and L2 weight decay",
    ),
    "adam": (
        _adam(optim.Adam),
        _strategy(_ADAM_LR, _ADAM_GRAD, eps=_EPS, **_BETAS),
        [_example(6, _ADAM_LR, 0.1)],
        "Adam (bias corrections in float64, eps added to sqrt(v_hat))",
    ),
    "adam_small_gradients": (
        _adam(optim.Adam),
        None,
        [_example(7, _SMALL_LR, 1e-3, eps=1e-6), _example(8, _SMALL_LR, 3e-3, eps=1e-7)],
        "Adam with gradients near eps (separates the two epsilon placements)",
    ),
    "adam_weight_decay": (
        _adam(optim.Adam),
        _strategy(_ADAM_LR, _ADAM_GRAD, weight_decay=_DECAY, **_BETAS),
        [_example(9, _ADAM_LR, 0.1, weight_decay=1e-2)],
        "Adam with coupled L2 weight decay",
    ),
    "adamw": (
        _adam(optim.AdamW),
        _strategy(
            _ADAM_LR, _ADAM_GRAD, eps=_EPS, weight_decay=lambda: _floats(1e-3, 0.1), **_BETAS
        ),
        [_example(10, _ADAM_LR, 0.1, weight_decay=0.01)],
        "AdamW (decoupled decay in the update expression)",
    ),
    "adamw_small_gradients": (
        _adam(optim.AdamW),
        None,
        [_example(11, _SMALL_LR, 1e-3, eps=1e-6, weight_decay=0.05)],
        "AdamW with gradients near eps",
    ),
    "rmsprop": (
        _rmsprop,
        _strategy(_ADAM_LR, _ADAM_GRAD, alpha=_ALPHA, eps=_EPS, weight_decay=_DECAY),
        [_example(12, _ADAM_LR, 0.1), _example(13, _SMALL_LR, 1e-3, eps=1e-6)],
        "RMSprop (eps added after the square root, torch's definition)",
    ),
    "rmsprop_centered": (
        _rmsprop,
        _strategy(_ADAM_LR, _ADAM_GRAD, alpha=_ALPHA, eps=_EPS, centered=True),
        [_example(14, _ADAM_LR, 0.1, centered=True)],
        "centered RMSprop (divides by the root of the running variance)",
    ),
    "rmsprop_momentum": (
        _rmsprop,
        _strategy(_ADAM_LR, _ADAM_GRAD, alpha=_ALPHA, momentum=_MOMENTUM, centered=_booleans),
        [
            _example(15, _ADAM_LR, 0.1, momentum=0.9),
            _example(16, _ADAM_LR, 0.1, momentum=0.9, centered=True, weight_decay=1e-3),
        ],
        "RMSprop with momentum on the normalised step (the LR outside the buffer)",
    ),
    "lion": (
        _lion,
        _strategy(_LION_LR, _ADAM_GRAD, beta1=lambda: _floats(0.8, 0.95), beta2=_ALPHA),
        [_example(17, _LION_LR, 0.1), _example(18, _LION_LR, 1.0, beta1=0.95, beta2=0.98)],
        "Lion (the sign of the beta1 interpolation, the momentum tracked with beta2)",
    ),
    "lion_weight_decay": (
        _lion,
        _strategy(_LION_LR, _ADAM_GRAD, weight_decay=lambda: _floats(1e-2, 1.0, log=True)),
        [_example(19, _LION_LR, 0.1, weight_decay=0.1)],
        "Lion with decoupled weight decay in the update expression",
    ),
}


#: name -> the formula slips each optimizer check fails on.
GUARDS = {
    "sgd": "a learning rate or gradient applied with another rounding or sign",
    "sgd_momentum": "Keras-style momentum (the LR inside the buffer: m = mu*m - lr*g)",
    "sgd_nesterov": "nesterov=True ignored or applied as Keras/TF does",
    "sgd_weight_decay": "weight decay dropped, or decoupled instead of added to the gradient",
    "sgd_momentum_weight_decay": "decay added after the momentum buffer instead of before",
    "adam": "bias corrections missing or in float32, betas swapped",
    "adam_small_gradients": "epsilon added to sqrt(v) before the bias correction (Keras, TF)",
    "adam_weight_decay": "Adam's L2 decay decoupled (AdamW) or dropped",
    "adamw": "AdamW's decay coupled into the gradient, or applied in another expression",
    "adamw_small_gradients": "AdamW's epsilon placement near tiny gradients",
    "rmsprop": "eps inside the square root, or alpha and 1 - alpha swapped",
    "rmsprop_centered": "centered ignored, or the mean subtracted outside the square root",
    "rmsprop_momentum": "Keras-style momentum (the LR inside the buffer), or eps dropped there",
    "lion": "the step's sign taken of the beta2 interpolation, or the momentum updated first",
    "lion_weight_decay": "Lion's decay coupled into the gradient, or scaled without the LR",
}


def _register(
    name: str, build: Any, strategy: Any, explicit: list[dict[str, Any]], doc: str
) -> None:
    def run(ctx: Context) -> None:
        explore(ctx, _run_example(ctx, build), strategy=strategy, explicit=explicit)

    add_check(
        "optimizers",
        name,
        run,
        description=f"{doc}: {STEPS} updates vs float64",
        guards=GUARDS[name],
    )


for _name, (_build, _strat, _explicit, _doc) in OPTIMIZER_CHECKS.items():
    _register(_name, _build, _strat, _explicit, _doc)
