"""Stochastic gradient descent with heavy-ball or Nesterov momentum (``torch.optim.SGD``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from unitrain._errors import ConfigError
from unitrain.ops import Array
from unitrain.optim._base import (
    AbstractOptimizer,
    check_bool,
    check_fraction,
    check_non_negative,
    set_fields,
)
from unitrain.optim._groups import Group, checked_groups

__all__ = ["SGD"]


@final
@dataclasses.dataclass(frozen=True)
class SGD(AbstractOptimizer, type_name="sgd"):
    """Stochastic gradient descent with heavy-ball or Nesterov momentum and L2 weight decay.

    Update at learning rate ``lr``: ``g += weight_decay * p``; ``b = momentum * b + g``;
    ``d = g + momentum * b`` if ``nesterov`` else ``b``; ``p -= lr * d`` (``torch.optim.SGD``;
    Keras keeps the LR inside the buffer instead, which differs once the LR changes).

    Args:
        momentum: momentum factor in [0, 1).
        nesterov: use Nesterov momentum (needs ``momentum > 0``).
        weight_decay: L2 penalty added to the gradient (coupled, as in torch, not Keras).
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> SGD(momentum=0.9, nesterov=True).state_slots
        ('momentum',)
        >>> SGD().state_slots
        ()
    """

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    groups: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        set_fields(
            self,
            momentum=check_fraction("SGD", "momentum", self.momentum),
            nesterov=check_bool("SGD", "nesterov", self.nesterov),
            weight_decay=check_non_negative("SGD", "weight_decay", self.weight_decay),
        )
        if self.nesterov and self.momentum == 0:
            raise ConfigError("SGD: nesterov=True needs momentum > 0, got momentum=0")
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """``("momentum",)`` when there is momentum, else nothing."""
        return ("momentum",) if self.momentum > 0 else ()

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and its momentum buffer after one SGD update."""
        mu, wd = self.momentum, self.weight_decay
        g = grad + wd * param if wd else grad
        if not mu:
            return param - lr * g, {}
        buffer = mu * slots["momentum"] + g
        direction = g + mu * buffer if self.nesterov else buffer
        return param - lr * direction, {"momentum": buffer}
