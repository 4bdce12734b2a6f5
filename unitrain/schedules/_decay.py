"""Smooth single-formula schedules: constant, exponential, cosine, linear, inverse square root."""

from __future__ import annotations

import dataclasses
import math

from unitrain.schedules._base import AbstractSchedule, check_gamma, check_int, check_lr, set_checked

__all__ = ["Constant", "CosineDecay", "ExponentialDecay", "InverseSqrt", "LinearDecay"]


@dataclasses.dataclass(frozen=True)
class Constant(AbstractSchedule, type_name="constant"):
    """The same learning rate at every step.

    Args:
        lr: the learning rate, a finite float >= 0.

    Examples:
        >>> from unitrain.schedules import Constant
        >>> Constant(0.1)(0), Constant(0.1)(10_000)
        (0.1, 0.1)

    Differs from:
        Nothing: torch ConstantLR is a different thing (a factor for the first
        ``total_iters`` steps, then the base rate); this is optax ``constant_schedule``.
    """

    lr: float

    def __post_init__(self) -> None:
        set_checked(self, "lr", check_lr("Constant", "lr", self.lr))

    def _value(self, step: int) -> float:
        return self.lr


@dataclasses.dataclass(frozen=True)
class ExponentialDecay(AbstractSchedule, type_name="exponential_decay"):
    """Multiply the learning rate by ``gamma`` after every update: ``base_lr * gamma**step``.

    Args:
        base_lr: the learning rate at step 0, a finite float >= 0.
        gamma: the factor per step, 0 < gamma <= 1.

    Examples:
        >>> from unitrain.schedules import ExponentialDecay
        >>> schedule = ExponentialDecay(base_lr=1.0, gamma=0.5)
        >>> [schedule(t) for t in range(4)]
        [1.0, 0.5, 0.25, 0.125]

    Differs from:
        torch ExponentialLR: same values (torch multiplies recursively, so it drifts by a few
        ulps). optax ``exponential_decay(init, transition_steps=1, decay_rate=gamma)`` and
        Keras ``ExponentialDecay(decay_steps=1)``: same values. gamma > 1 (growth) is
        rejected here because it overflows float64 on long runs.
    """

    base_lr: float
    gamma: float

    def __post_init__(self) -> None:
        set_checked(self, "base_lr", check_lr("ExponentialDecay", "base_lr", self.base_lr))
        set_checked(self, "gamma", check_gamma("ExponentialDecay", self.gamma))

    def _value(self, step: int) -> float:
        return self.base_lr * self.gamma**step


@dataclasses.dataclass(frozen=True)
class CosineDecay(AbstractSchedule, type_name="cosine_decay"):
    """Half a cosine from ``base_lr`` down to ``min_lr`` over ``decay_steps``, then flat.

    ``lr = min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * min(step, T) / T))``.

    Args:
        base_lr: the learning rate at step 0, a finite float >= 0.
        decay_steps: T, the step at which ``min_lr`` is reached; a positive int.
        min_lr: the learning rate from step T on, a finite float >= 0.

    Examples:
        >>> from unitrain.schedules import CosineDecay
        >>> schedule = CosineDecay(base_lr=1.0, decay_steps=100, min_lr=0.1)
        >>> schedule(0), round(schedule(50), 12), schedule(100), schedule(1_000)
        (1.0, 0.55, 0.1, 0.1)

    Differs from:
        torch CosineAnnealingLR: same values for step <= T, but torch does not clamp: past T
        it rises again with period 2T. optax ``cosine_decay_schedule`` and Keras
        ``CosineDecay`` clamp like this one, but take ``alpha``, a fraction of the initial
        value, where this takes the absolute ``min_lr`` (torch's ``eta_min``).
    """

    base_lr: float
    decay_steps: int
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        set_checked(self, "base_lr", check_lr("CosineDecay", "base_lr", self.base_lr))
        steps = check_int("CosineDecay", "decay_steps", self.decay_steps, minimum=1)
        set_checked(self, "decay_steps", steps)
        set_checked(self, "min_lr", check_lr("CosineDecay", "min_lr", self.min_lr))

    def _value(self, step: int) -> float:
        if step >= self.decay_steps:
            return self.min_lr
        cosine = 0.5 * (1.0 + math.cos(math.pi * step / self.decay_steps))
        return self.min_lr + (self.base_lr - self.min_lr) * cosine


@dataclasses.dataclass(frozen=True)
class LinearDecay(AbstractSchedule, type_name="linear_decay"):
    """A straight line from ``start_lr`` at step 0 to ``end_lr`` at ``steps``, then flat.

    Args:
        start_lr: the learning rate at step 0, a finite float >= 0.
        end_lr: the learning rate from step ``steps`` on, a finite float >= 0 (may be larger
            than ``start_lr``, for a linear ramp up).
        steps: the length of the ramp, a positive int.

    Examples:
        >>> from unitrain.schedules import LinearDecay
        >>> schedule = LinearDecay(start_lr=1.0, end_lr=0.0, steps=4)
        >>> [schedule(t) for t in range(6)]
        [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]

    Differs from:
        torch LinearLR takes factors of the optimizer's lr (``start_factor`` must be > 0)
        and updates recursively; values agree to a few ulps. optax ``linear_schedule`` has the
        same shape (``init_value``, ``end_value``, ``transition_steps``); Keras
        ``PolynomialDecay(power=1)`` too, without ``cycle``.
    """

    start_lr: float
    end_lr: float
    steps: int

    def __post_init__(self) -> None:
        set_checked(self, "start_lr", check_lr("LinearDecay", "start_lr", self.start_lr))
        set_checked(self, "end_lr", check_lr("LinearDecay", "end_lr", self.end_lr))
        set_checked(self, "steps", check_int("LinearDecay", "steps", self.steps, minimum=1))

    def _value(self, step: int) -> float:
        if step >= self.steps:
            return self.end_lr
        return self.start_lr + (self.end_lr - self.start_lr) * step / self.steps


@dataclasses.dataclass(frozen=True)
class InverseSqrt(AbstractSchedule, type_name="inverse_sqrt"):
    """Linear warmup to ``base_lr``, then decay as one over the square root of the step.

    With ``n = step + 1`` (the 1-based number of the update being made) and
    ``W = warmup_steps``: ``lr = base_lr * min(n / W, sqrt(W / n))``. The peak ``base_lr`` is
    used for update ``n == W``, i.e. at ``step == W - 1``; ``lr`` is ``base_lr / W`` at step 0,
    never 0.

    Args:
        base_lr: the peak learning rate, a finite float >= 0.
        warmup_steps: W, a positive int.

    Examples:
        >>> from unitrain.schedules import InverseSqrt
        >>> schedule = InverseSqrt(base_lr=1.0, warmup_steps=4)
        >>> [schedule(t) for t in (0, 1, 3, 15)]
        [0.25, 0.5, 1.0, 0.5]

    Differs from:
        The Transformer paper's rate ``d_model**-0.5 * min(n**-0.5, n * W**-1.5)`` is this
        with ``base_lr = (d_model * W)**-0.5``: here ``base_lr`` is the peak itself.
        T5's inverse square root schedule is flat (no linear ramp) before W.
    """

    base_lr: float
    warmup_steps: int

    def __post_init__(self) -> None:
        set_checked(self, "base_lr", check_lr("InverseSqrt", "base_lr", self.base_lr))
        warmup = check_int("InverseSqrt", "warmup_steps", self.warmup_steps, minimum=1)
        set_checked(self, "warmup_steps", warmup)

    def _value(self, step: int) -> float:
        update = step + 1
        if update < self.warmup_steps:
            return self.base_lr * update / self.warmup_steps
        return self.base_lr * math.sqrt(self.warmup_steps / update)
