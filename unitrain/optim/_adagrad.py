"""Adagrad (Duchi et al. 2011), as torch defines it: eps added after the square root."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any, final

from unitrain import ops
from unitrain.ops import Array
from unitrain.optim._base import AbstractOptimizer, check_non_negative, set_fields
from unitrain.optim._groups import Group, checked_groups

__all__ = ["Adagrad"]


@final
@dataclasses.dataclass(frozen=True)
class Adagrad(AbstractOptimizer, type_name="adagrad"):
    """Adagrad as ``torch.optim.Adagrad`` defines it (same arguments and defaults, but the
    learning rate, which comes from the schedule).

    Update ``t`` (1 for the first) at learning rate ``lr``: ``g += weight_decay * p``;
    ``s += g^2``; ``p -= lr / (1 + (t-1) * lr_decay) * g / (sqrt(s) + eps)``. optax and Keras
    put eps inside the square root instead and start the sum at 0.1.

    The sum starts at ``initial_accumulator_value`` in torch. Here every slot starts at zero,
    so the first update adds that value to it: from then on the saved ``sum`` is torch's.

    Args:
        lr_decay: the learning rate is divided by ``1 + (t-1) * lr_decay``.
        weight_decay: L2 penalty added to the gradient (coupled, as in torch).
        initial_accumulator_value: what the sum of squares starts from.
        eps: added to the square root of the sum.
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> Adagrad().state_slots
        ('sum',)
    """

    lr_decay: float = 0.0
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    groups: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        name = "Adagrad"
        set_fields(
            self,
            lr_decay=check_non_negative(name, "lr_decay", self.lr_decay),
            weight_decay=check_non_negative(name, "weight_decay", self.weight_decay),
            initial_accumulator_value=check_non_negative(
                name, "initial_accumulator_value", self.initial_accumulator_value
            ),
            eps=check_non_negative(name, "eps", self.eps),
        )
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """The running sum of squared gradients, ``("sum",)``."""
        return ("sum",)

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and the sum of squares after one Adagrad update."""
        wd, initial = self.weight_decay, self.initial_accumulator_value
        g = grad + wd * param if wd else grad
        total = slots["sum"] + g * g
        if initial:
            total = total + initial * _on_first(step, param)
        if self.lr_decay:
            lr = lr / (1.0 + _since_first(step, param) * self.lr_decay)
        return param - lr * (g / (ops.sqrt(total) + self.eps)), {"sum": total}


def _since_first(step: Any, like: Array) -> Any:
    """``step - 1``: a Python float for a host step, else a scalar in ``like``'s dtype."""
    if isinstance(step, numbers.Integral):
        return float(int(step) - 1)
    return ops.cast(step - 1, ops.dtype(like))


def _on_first(step: Any, like: Array) -> Any:
    """1 on the first update and 0 after it, as :func:`_since_first` gives its types."""
    if isinstance(step, numbers.Integral):
        return 1.0 if int(step) == 1 else 0.0
    return ops.cast(ops.equal(step, 1), ops.dtype(like))
