"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): signed momentum."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from unitrain import ops
from unitrain.ops import Array
from unitrain.optim._base import AbstractOptimizer, check_fraction, check_non_negative, set_fields
from unitrain.optim._groups import Group, checked_groups

__all__ = ["Lion"]


@final
@dataclasses.dataclass(frozen=True)
class Lion(AbstractOptimizer, type_name="lion"):
    """Lion as ``optax.lion`` and ``keras.optimizers.Lion`` define it.

    Update at learning rate ``lr``: ``u = sign(beta1 * m + (1-beta1) * g)``;
    ``m = beta2 * m + (1-beta2) * g``; ``p -= lr * (u + weight_decay * p)``. The step is
    interpolated with ``beta1`` but the momentum tracks with ``beta2``; the decay is decoupled
    and applied in the update's expression, as for :class:`~unitrain.optim.AdamW`. Every
    entry moves by ``lr`` exactly (or 0 where the interpolation is 0), so Lion wants a learning
    rate 3-10x smaller than AdamW's.

    Args:
        beta1: weight of the momentum in the step's sign, in [0, 1).
        beta2: decay of the momentum, in [0, 1).
        weight_decay: decoupled decay factor. 0 by default, as in Keras; optax's default is
            1e-3.
        groups: options per group of parameters (:class:`~unitrain.optim.Group`).

    Examples:
        >>> Lion().state_slots
        ('exp_avg',)
    """

    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    groups: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        set_fields(
            self,
            beta1=check_fraction("Lion", "beta1", self.beta1),
            beta2=check_fraction("Lion", "beta2", self.beta2),
            weight_decay=check_non_negative("Lion", "weight_decay", self.weight_decay),
        )
        set_fields(self, groups=checked_groups(self, self.groups))

    @property
    def state_slots(self) -> tuple[str, ...]:
        """The momentum, ``("exp_avg",)``."""
        return ("exp_avg",)

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Return the parameter and its momentum after one Lion update."""
        b1, b2, wd = self.beta1, self.beta2, self.weight_decay
        m = slots["exp_avg"]
        direction = ops.sign(b1 * m + (1.0 - b1) * grad)
        if wd:
            direction = direction + wd * param
        return param - lr * direction, {"exp_avg": b2 * m + (1.0 - b2) * grad}
