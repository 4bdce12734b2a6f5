"""Optimizers described once, with one float64-capable numpy reference of their update rules.

The reference follows PyTorch's published formulas, because they are the ones most papers
state. Keras and optax differ in places (Keras keeps the LR inside the SGD momentum buffer and
puts Adam's epsilon outside the bias correction; optax evaluates bias corrections in
float32), so each backend implements *this* math, natively where the framework already
agrees and by hand where it does not. The learning rate is never part of an optimizer: it
comes from the schedule, one float per update.

Canonical optimizer state, per parameter ``p`` (names as in the model's state dict):

==========  =======================================================
optimizer    state entries
==========  =======================================================
SGD          ``p.momentum`` (only when ``momentum > 0``)
Adam/AdamW   ``p.exp_avg``, ``p.exp_avg_sq``
all          ``step``: an int64 scalar, updates applied so far
==========  =======================================================

A momentum buffer starts at zero, which gives exactly PyTorch's "buffer = gradient on the
first step", so there is no special first-step state to carry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar

import numpy as np

from unitrain._errors import ConfigError

__all__ = [
    "CLIP_EPSILON",
    "SGD",
    "Adam",
    "AdamW",
    "Optimizer",
    "apply_update",
    "clip_by_global_norm",
    "global_norm",
    "init_state",
    "optimizer_from_dict",
]

#: Added to the global norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does.
CLIP_EPSILON = 1e-6


def _check_real(owner: str, name: str, value: float, low: float, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{owner}: {name} must be a real number, got {name}={value!r}")
    if not (low <= value <= high) or math.isnan(value):
        raise ConfigError(f"{owner}: {name} must be in [{low}, {high}], got {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent with heavy-ball or Nesterov momentum and L2 weight decay.

    Update at learning rate ``lr``: ``g += weight_decay * p``; ``b = momentum * b + g``;
    ``d = g + momentum * b`` if ``nesterov`` else ``b``; ``p -= lr * d`` (``torch.optim.SGD``).

    Args:
        momentum: momentum factor in [0, 1).
        nesterov: use Nesterov momentum (needs ``momentum > 0``).
        weight_decay: L2 penalty added to the gradient (coupled, as in torch, not Keras).

    Examples:
        >>> SGD(momentum=0.9, nesterov=True).state_suffixes
        ('momentum',)
    """

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    kind: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        _check_real("SGD", "momentum", self.momentum, 0.0, 1.0)
        if self.momentum >= 1.0:
            raise ConfigError(f"SGD: momentum must be < 1, got momentum={self.momentum!r}")
        _check_real("SGD", "weight_decay", self.weight_decay, 0.0)
        if not isinstance(self.nesterov, bool):
            raise ConfigError(f"SGD: nesterov must be a bool, got nesterov={self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("SGD: nesterov=True needs momentum > 0, got momentum=0")

    @property
    def state_suffixes(self) -> tuple[str, ...]:
        """Per-parameter state entries this optimizer keeps."""
        return ("momentum",) if self.momentum > 0 else ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; :func:`optimizer_from_dict` inverts it."""
        return {"type": self.kind, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class Adam:
    """Adam with bias corrections in float64 and epsilon added to ``sqrt(v_hat)`` (torch).

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``; with ``t`` updates including this one,
    ``p -= lr * (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps)``. ``weight_decay`` is an L2
    term added to the gradient, as in ``torch.optim.Adam``; use :class:`AdamW` for decoupled
    decay.

    Args:
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        eps: added to the denominator (torch's default 1e-8; Keras uses 1e-7 elsewhere).
        weight_decay: L2 penalty added to the gradient.

    Examples:
        >>> Adam().state_suffixes
        ('exp_avg', 'exp_avg_sq')
    """

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    kind: ClassVar[str] = "adam"

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("beta1", "beta2"):
            value = getattr(self, field)
            _check_real(name, field, value, 0.0, 1.0)
            if value >= 1.0:
                raise ConfigError(f"{name}: {field} must be < 1, got {field}={value!r}")
        _check_real(name, "eps", self.eps, 0.0)
        _check_real(name, "weight_decay", self.weight_decay, 0.0)

    @property
    def state_suffixes(self) -> tuple[str, ...]:
        """Per-parameter state entries this optimizer keeps."""
        return ("exp_avg", "exp_avg_sq")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; :func:`optimizer_from_dict` inverts it."""
        return {"type": self.kind, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay: ``p -= lr * (u + weight_decay * p)``.

    ``u`` is the Adam direction above. The decay is applied in the same expression as the
    update (one rounding), which is how torch's fused kernel, optax and Keras all compute it.

    Examples:
        >>> AdamW().weight_decay
        0.01
    """

    weight_decay: float = 0.01
    kind: ClassVar[str] = "adamw"


Optimizer = SGD | Adam | AdamW

_OPTIMIZERS: dict[str, type[SGD] | type[Adam]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def optimizer_from_dict(data: Mapping[str, Any]) -> Optimizer:
    """Rebuild an optimizer from :meth:`to_dict` output.

    Examples:
        >>> optimizer_from_dict(SGD(momentum=0.5).to_dict())
        SGD(momentum=0.5, nesterov=False, weight_decay=0.0)
    """
    fields = dict(data)
    kind = fields.pop("type", None)
    if kind not in _OPTIMIZERS:
        raise ConfigError(f"unknown optimizer type {kind!r}; known: {sorted(_OPTIMIZERS)}")
    try:
        return _OPTIMIZERS[kind](**fields)
    except TypeError as error:
        raise ConfigError(f"bad fields for optimizer {kind!r}: {error}") from None


def init_state(
    optimizer: Optimizer, params: Mapping[str, np.ndarray], dtype: Any = None
) -> dict[str, np.ndarray]:
    """Return the zero optimizer state for ``params`` under canonical names."""
    state: dict[str, np.ndarray] = {"step": np.zeros((), np.int64)}
    for name, value in params.items():
        for suffix in optimizer.state_suffixes:
            state[f"{name}.{suffix}"] = np.zeros(value.shape, dtype or value.dtype)
    return state


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """L2 norm of all gradients together, in float64."""
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


def clip_by_global_norm(
    grads: MutableMapping[str, np.ndarray], max_norm: float
) -> tuple[MutableMapping[str, np.ndarray], float]:
    """Scale ``grads`` in place so their global norm is at most ``max_norm``.

    The coefficient is ``max_norm / (norm + 1e-6)``, applied only when below one, exactly as
    ``torch.nn.utils.clip_grad_norm_`` computes it. Returns the grads and the norm before
    clipping.
    """
    norm = global_norm(grads)
    coefficient = max_norm / (norm + CLIP_EPSILON)
    if coefficient < 1.0:
        for name, g in grads.items():
            grads[name] = g * g.dtype.type(coefficient)
    return grads, norm


def apply_update(
    optimizer: Optimizer,
    params: MutableMapping[str, np.ndarray],
    grads: Mapping[str, np.ndarray],
    state: MutableMapping[str, np.ndarray],
    lr: float,
) -> None:
    """Apply one update at ``lr`` to ``params`` and ``state`` in place (the reference rule).

    Arithmetic happens in the arrays' own dtype, except the Adam bias corrections, which are
    Python floats (float64), so passing float64 arrays gives the float64 oracle.
    """
    step = int(state["step"]) + 1
    state["step"] = np.asarray(step, np.int64)
    if isinstance(optimizer, Adam):
        _adam_update(optimizer, params, grads, state, lr, step)
    else:
        _sgd_update(optimizer, params, grads, state, lr)


def _sgd_update(
    optimizer: SGD,
    params: MutableMapping[str, np.ndarray],
    grads: Mapping[str, np.ndarray],
    state: MutableMapping[str, np.ndarray],
    lr: float,
) -> None:
    mu, wd = optimizer.momentum, optimizer.weight_decay
    for name, p in params.items():
        g = grads[name]
        if wd:
            g = g + wd * p
        direction = g
        if mu:
            buffer = mu * state[f"{name}.momentum"] + g
            state[f"{name}.momentum"] = buffer
            direction = g + mu * buffer if optimizer.nesterov else buffer
        params[name] = p - lr * direction


def _adam_update(
    optimizer: Adam,
    params: MutableMapping[str, np.ndarray],
    grads: Mapping[str, np.ndarray],
    state: MutableMapping[str, np.ndarray],
    lr: float,
    step: int,
) -> None:
    b1, b2, eps, wd = optimizer.beta1, optimizer.beta2, optimizer.eps, optimizer.weight_decay
    decoupled = isinstance(optimizer, AdamW)
    bias_correction1 = 1.0 - b1**step
    sqrt_bias_correction2 = math.sqrt(1.0 - b2**step)
    for name, p in params.items():
        g = grads[name]
        if wd and not decoupled:
            g = g + wd * p
        m = b1 * state[f"{name}.exp_avg"] + (1.0 - b1) * g
        v = b2 * state[f"{name}.exp_avg_sq"] + (1.0 - b2) * (g * g)
        state[f"{name}.exp_avg"], state[f"{name}.exp_avg_sq"] = m, v
        direction = (m / bias_correction1) / (np.sqrt(v) / sqrt_bias_correction2 + eps)
        if decoupled and wd:
            direction = direction + wd * p
        params[name] = p - lr * direction
