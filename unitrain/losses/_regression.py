"""Losses over values: mean squared error and Huber (torch's definitions)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import final

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.losses._base import AbstractLoss, mean_per_example, targets_like
from unitrain.ops import Array

__all__ = ["MSE", "Huber"]


@final
@dataclasses.dataclass(frozen=True)
class MSE(AbstractLoss, type_name="mse"):
    """Mean squared error (``torch.nn.MSELoss``): each example's value is the mean of its
    squared differences, the batch's loss their mean, which is the mean over every value.
    Targets need as many values per example as the outputs have (``(N,)`` for ``(N, 1)``).

    Examples:
        >>> import numpy as np
        >>> float(MSE().reference(np.array([[1.0, 3.0]]), np.array([[0.0, 0.0]])))
        5.0
    """

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """The mean squared difference of each example."""
        diff = outputs - targets_like(targets, outputs)
        return mean_per_example(diff * diff)

    def check_targets(self, targets: np.ndarray, outputs: tuple[int, ...], name: str) -> None:
        """As many target values per example as the outputs have."""
        from unitrain.data import check_targets

        check_targets(np.asarray(targets), outputs, "mse", name)


@final
@dataclasses.dataclass(frozen=True)
class Huber(AbstractLoss, type_name="huber"):
    """Huber loss (``torch.nn.HuberLoss``): ``0.5 d^2`` where ``|d| < delta``, else
    ``delta * (|d| - 0.5 delta)``, for ``d = output - target``; each example's value is its
    mean, the batch's loss their mean. torch's ``SmoothL1Loss(beta)`` is this with
    ``delta=beta``, divided by ``beta``.

    Args:
        delta: where the square turns into a line, > 0.

    Examples:
        >>> import numpy as np
        >>> float(Huber(delta=1.0).reference(np.array([[0.5, 3.0]]), np.zeros((1, 2))))
        1.3125
    """

    delta: float = 1.0

    def __post_init__(self) -> None:
        delta = self.delta
        if not (isinstance(delta, numbers.Real) and not isinstance(delta, bool)) or not (
            0.0 < delta < math.inf
        ):
            raise ConfigError(f"Huber: delta must be a finite number > 0, got {delta=!r}")
        object.__setattr__(self, "delta", float(delta))

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """The mean Huber value of each example."""
        diff = outputs - targets_like(targets, outputs)
        size = ops.abs(diff)
        square = 0.5 * diff * diff
        line = self.delta * (size - 0.5 * self.delta)
        return mean_per_example(ops.where(ops.less(size, self.delta), square, line))
