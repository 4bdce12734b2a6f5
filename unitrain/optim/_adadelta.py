"""Adadelta (Zeiler 2012, "ADADELTA: An Adaptive Learning Rate Method"), as torch defines it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from unitrain import ops
from unitrain.ops import Array
from unitrain.optim._base import AbstractOptimizer, check_fraction, check_non_negative, set_fields
from unitrain.optim._groups import Group, checked_groups

__all__ = ["Adadelta"]


@final
@dataclasses.dataclass(frozen=True)
class Adadelta(AbstractOptimizer, type_name="adadelta"):
    """Adadelta as ``torch.optim.Adadelta`` defines it (same arguments and defaults, but the
    learning rate, which comes from the schedule: torch's default is 1.0).

    Update at learning rate ``lr``: ``g += weight_decay * p``;
    ``s = rho * s + (1-rho) * g^2``; ``d = sqrt(a + eps) / sqrt(s + eps) * g``;
    ``a = rho * a + (1-rho) * d^2``; ``p -= lr * d``. Both averages start at zero, as in
    torch, and eps sits inside both square roots.

    Args:
        rho: decay of both running averages, in [0, 1).
        eps: added inside the square roots (it also sets the size of the first steps).
        weight_decay: L2 penalty added to the gradient (coupled, as in torch).
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> Adadelta().state_slots
        ('square_avg', 'acc_delta')
    """

    rho: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 0.0
    groups: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        set_fields(
            self,
            rho=check_fraction("Adadelta", "rho", self.rho),
            eps=check_non_negative("Adadelta", "eps", self.eps),
            weight_decay=check_non_negative("Adadelta", "weight_decay", self.weight_decay),
        )
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """The squared-gradient and squared-step averages, ``("square_avg", "acc_delta")``."""
        return ("square_avg", "acc_delta")

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and both averages after one Adadelta update."""
        rho, eps, wd = self.rho, self.eps, self.weight_decay
        g = grad + wd * param if wd else grad
        square_avg = rho * slots["square_avg"] + (1.0 - rho) * (g * g)
        delta = ops.sqrt(slots["acc_delta"] + eps) / ops.sqrt(square_avg + eps) * g
        acc_delta = rho * slots["acc_delta"] + (1.0 - rho) * (delta * delta)
        return param - lr * delta, {"square_avg": square_avg, "acc_delta": acc_delta}
