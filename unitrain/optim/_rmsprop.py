"""RMSprop with torch's definition: eps added after the square root, optional centering."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from unitrain import ops
from unitrain.ops import Array
from unitrain.optim._base import (
    AbstractOptimizer,
    check_bool,
    check_fraction,
    check_non_negative,
    set_fields,
)
from unitrain.optim._groups import Group, checked_groups

__all__ = ["RMSprop"]


@final
@dataclasses.dataclass(frozen=True)
class RMSprop(AbstractOptimizer, type_name="rmsprop"):
    """RMSprop as ``torch.optim.RMSprop`` defines it (same arguments, same defaults).

    Update at learning rate ``lr``: ``g += weight_decay * p``;
    ``s = alpha * s + (1-alpha) * g^2``; if ``centered``, ``a = alpha * a + (1-alpha) * g``
    and ``d = sqrt(s - a^2) + eps``, else ``d = sqrt(s) + eps``; with momentum
    ``b = momentum * b + g / d`` and ``p -= lr * b``, else ``p -= lr * g / d``. Keras's
    RMSprop differs (eps inside the square root, the LR inside the momentum buffer).

    Args:
        alpha: decay of the squared-gradient average, in [0, 1).
        eps: added to the root of the average (after the square root).
        centered: divide by the root of the variance (``s - a^2``) instead of ``s``.
        momentum: momentum factor in [0, 1) applied to the normalised step.
        weight_decay: L2 penalty added to the gradient (coupled, as in torch).
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> RMSprop().state_slots
        ('square_avg',)
        >>> RMSprop(centered=True, momentum=0.9).state_slots
        ('square_avg', 'momentum', 'grad_avg')
    """

    alpha: float = 0.99
    eps: float = 1e-8
    centered: bool = False
    momentum: float = 0.0
    weight_decay: float = 0.0
    groups: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        set_fields(
            self,
            alpha=check_fraction("RMSprop", "alpha", self.alpha),
            eps=check_non_negative("RMSprop", "eps", self.eps),
            centered=check_bool("RMSprop", "centered", self.centered),
            momentum=check_fraction("RMSprop", "momentum", self.momentum),
            weight_decay=check_non_negative("RMSprop", "weight_decay", self.weight_decay),
        )
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """``square_avg``, plus ``momentum`` and ``grad_avg`` when those are in use."""
        return (
            ("square_avg",)
            + (("momentum",) if self.momentum > 0 else ())
            + (("grad_avg",) if self.centered else ())
        )

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and its slots after one RMSprop update."""
        alpha, wd = self.alpha, self.weight_decay
        g = grad + wd * param if wd else grad
        square_avg = alpha * slots["square_avg"] + (1.0 - alpha) * (g * g)
        updated = {"square_avg": square_avg}
        if self.centered:
            grad_avg = alpha * slots["grad_avg"] + (1.0 - alpha) * g
            updated["grad_avg"] = grad_avg
            denominator = ops.sqrt(square_avg - grad_avg * grad_avg) + self.eps
        else:
            denominator = ops.sqrt(square_avg) + self.eps
        if not self.momentum:
            return param - lr * (g / denominator), updated
        buffer = self.momentum * slots["momentum"] + g / denominator
        updated["momentum"] = buffer
        return param - lr * buffer, updated
