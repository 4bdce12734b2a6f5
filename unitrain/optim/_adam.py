"""Adam and AdamW with torch's formulas: eps added to sqrt(v_hat), decoupled decay for AdamW.

Both share one update, :class:`AbstractAdam`; they differ only in where the weight decay
goes (``decoupled``), so each is final and neither subclasses the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, final

from unitrain import ops
from unitrain.ops import Array
from unitrain.optim._base import (
    AbstractOptimizer,
    bias_correction,
    check_fraction,
    check_non_negative,
    set_fields,
)
from unitrain.optim._groups import Group, checked_groups

__all__ = ["AbstractAdam", "Adam", "AdamW"]


class AbstractAdam(AbstractOptimizer):
    """The Adam update; subclasses say whether the weight decay is L2 or decoupled.

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``; with ``t`` updates including this one,
    ``u = (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps)`` and ``p -= lr * u``.
    """

    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    #: True: ``p -= lr * (u + wd * p)`` (AdamW); False: ``g += wd * p`` first (Adam's L2).
    decoupled: ClassVar[bool]

    def __post_init__(self) -> None:
        name = type(self).__name__
        set_fields(
            self,
            beta1=check_fraction(name, "beta1", self.beta1),
            beta2=check_fraction(name, "beta2", self.beta2),
            eps=check_non_negative(name, "eps", self.eps),
            weight_decay=check_non_negative(name, "weight_decay", self.weight_decay),
        )
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """The first and second moments, ``("exp_avg", "exp_avg_sq")``."""
        return ("exp_avg", "exp_avg_sq")

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and both moments after one Adam update."""
        b1, b2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        correction1 = bias_correction(b1, step, param)
        sqrt_correction2 = bias_correction(b2, step, param, root=True)
        g = grad + wd * param if wd and not self.decoupled else grad
        m = b1 * slots["exp_avg"] + (1.0 - b1) * g
        v = b2 * slots["exp_avg_sq"] + (1.0 - b2) * (g * g)
        direction = (m / correction1) / (ops.sqrt(v) / sqrt_correction2 + eps)
        if wd and self.decoupled:
            direction = direction + wd * param
        return param - lr * direction, {"exp_avg": m, "exp_avg_sq": v}


@final
@dataclasses.dataclass(frozen=True)
class Adam(AbstractAdam, type_name="adam"):
    """Adam (``torch.optim.Adam``); ``weight_decay`` is an L2 term added to the gradient.

    Use :class:`AdamW` for decoupled decay.

    Args:
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        eps: added to the denominator (torch's default 1e-8; Keras uses 1e-7 elsewhere).
        weight_decay: L2 penalty added to the gradient.
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> Adam().state_slots
        ('exp_avg', 'exp_avg_sq')
    """

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    groups: tuple[Group, ...] = ()
    decoupled: ClassVar[bool] = False


@final
@dataclasses.dataclass(frozen=True)
class AdamW(AbstractAdam, type_name="adamw"):
    """Adam with decoupled weight decay: ``p -= lr * (u + weight_decay * p)``.

    ``u`` is the Adam direction. The decay is applied in the same expression as the update
    (one rounding), which is how torch's fused kernel, optax and Keras all compute it.

    Args:
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        eps: added to the denominator.
        weight_decay: decoupled decay factor (torch's default 0.01).
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> AdamW().weight_decay
        0.01
    """

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    groups: tuple[Group, ...] = ()
    decoupled: ClassVar[bool] = True
