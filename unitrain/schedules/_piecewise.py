"""Step-shaped schedules: decay every N steps, decay at milestones, a table of constants."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from unitrain._errors import ConfigError
from unitrain.schedules._base import (
    AbstractSchedule,
    check_gamma,
    check_int,
    check_lr,
    check_milestones,
    set_checked,
)

__all__ = ["MultiStepDecay", "PiecewiseConstant", "StepDecay"]


@dataclasses.dataclass(frozen=True)
class StepDecay(AbstractSchedule, type_name="step_decay"):
    """Multiply the learning rate by ``gamma`` every ``step_size`` updates.

    ``lr = base_lr * gamma ** (step // step_size)``.

    Args:
        base_lr: the learning rate for steps 0 .. step_size - 1, a finite float >= 0.
        step_size: the number of updates between drops, a positive int.
        gamma: the factor applied at each drop, 0 < gamma <= 1.

    Examples:
        >>> from unitrain.schedules import StepDecay
        >>> schedule = StepDecay(base_lr=1.0, step_size=2, gamma=0.5)
        >>> [schedule(t) for t in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]

    Differs from:
        Nothing in value: torch StepLR, optax ``exponential_decay(staircase=True)`` and Keras
        ``ExponentialDecay(staircase=True)`` all give these values (torch multiplies
        recursively, a few ulps apart).
    """

    base_lr: float
    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        set_checked(self, "base_lr", check_lr("StepDecay", "base_lr", self.base_lr))
        set_checked(
            self, "step_size", check_int("StepDecay", "step_size", self.step_size, minimum=1)
        )
        set_checked(self, "gamma", check_gamma("StepDecay", self.gamma))

    def _value(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)


@dataclasses.dataclass(frozen=True)
class MultiStepDecay(AbstractSchedule, type_name="multi_step_decay"):
    """Multiply the learning rate by ``gamma`` at each milestone step.

    ``lr = base_lr * gamma ** (number of milestones m with step >= m)``: the drop applies to
    the update made at the milestone step itself.

    Args:
        base_lr: the learning rate before the first milestone, a finite float >= 0.
        milestones: strictly increasing positive ints (a list is stored as a tuple).
        gamma: the factor applied at each milestone, 0 < gamma <= 1.

    Examples:
        >>> from unitrain.schedules import MultiStepDecay
        >>> schedule = MultiStepDecay(base_lr=1.0, milestones=(2, 5), gamma=0.5)
        >>> [schedule(t) for t in range(7)]
        [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]

    Differs from:
        torch MultiStepLR: same values, but torch also accepts repeated milestones (each
        repeat multiplies again); here they must be strictly increasing. Keras has no
        equivalent; its ``PiecewiseConstantDecay`` switches one step later (see
        :class:`PiecewiseConstant`).
    """

    base_lr: float
    # Stored as a tuple; typed as a sequence so that a list (and JSON) type-checks.
    milestones: Sequence[int]
    gamma: float = 0.1

    def __post_init__(self) -> None:
        set_checked(self, "base_lr", check_lr("MultiStepDecay", "base_lr", self.base_lr))
        milestones = check_milestones("MultiStepDecay", "milestones", self.milestones)
        set_checked(self, "milestones", milestones)
        set_checked(self, "gamma", check_gamma("MultiStepDecay", self.gamma))

    def _value(self, step: int) -> float:
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)


@dataclasses.dataclass(frozen=True)
class PiecewiseConstant(AbstractSchedule, type_name="piecewise_constant"):
    """A table of learning rates: ``values[i]`` for ``boundaries[i-1] <= step < boundaries[i]``.

    Args:
        boundaries: strictly increasing positive ints, the steps where the value changes
            (stored as a tuple).
        values: one more learning rate than there are boundaries, each a finite float >= 0
            (stored as a tuple).

    Examples:
        >>> from unitrain.schedules import PiecewiseConstant
        >>> schedule = PiecewiseConstant(boundaries=(2, 4), values=(1.0, 0.5, 0.1))
        >>> [schedule(t) for t in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]

    Differs from:
        Keras ``PiecewiseConstantDecay`` treats boundaries as upper-inclusive
        (``values[i]`` for ``boundaries[i-1] < step <= boundaries[i]``), so it switches one
        step later than this. optax ``piecewise_constant_schedule`` switches at the same step as
        this but takes multiplicative scales, not absolute values. torch MultiStepLR switches at
        the same step as this.
    """

    boundaries: Sequence[int]
    values: Sequence[float]

    def __post_init__(self) -> None:
        owner = "PiecewiseConstant"
        boundaries = check_milestones(owner, "boundaries", self.boundaries)
        set_checked(self, "boundaries", boundaries)
        values = self.values
        if not isinstance(values, (list, tuple)) or len(values) != len(boundaries) + 1:
            raise ConfigError(
                f"{owner}: values must be a sequence of len(boundaries) + 1 = "
                f"{len(boundaries) + 1} learning rates, got values={values!r}"
            )
        set_checked(self, "values", tuple(check_lr(owner, "values", value) for value in values))

    def _value(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, step)]
