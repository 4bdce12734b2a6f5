"""Schedules built from others or from several phases: warmup, join, restarts, one-cycle."""

from __future__ import annotations

import bisect
import collections.abc
import dataclasses
import math
import sys
from typing import Literal

from unitrain._errors import ConfigError
from unitrain.schedules._base import (
    AbstractSchedule,
    check_float,
    check_int,
    check_lr,
    check_milestones,
    check_schedule,
    set_checked,
)

__all__ = ["CosineRestarts", "OneCycle", "Sequence", "Warmup"]

# A bound on the rounding error of CosineRestarts._cycle_start, relative to
# ``start + first_period / (period_mult - 1)``: the power, the subtraction of 1 (which loses
# digits when the power is near 1), the product and the quotient each add at most one ulp.
_START_ERROR = 4.0 * sys.float_info.epsilon


@dataclasses.dataclass(frozen=True)
class Warmup(AbstractSchedule, type_name="warmup"):
    """Ramp linearly from ``start_lr`` up to another schedule's first value, then run it.

    With ``W = warmup_steps`` and ``peak = schedule(0)``: for ``step < W`` the rate is
    ``start_lr + (peak - start_lr) * step / W``; from ``step == W`` on it is
    ``schedule(step - W)``. The inner schedule's clock starts AFTER the warmup.

    Args:
        schedule: the schedule to run after the warmup.
        warmup_steps: W, a positive int.
        start_lr: the learning rate at step 0, a finite float >= 0.

    Examples:
        >>> from unitrain.schedules import CosineDecay, Warmup
        >>> schedule = Warmup(CosineDecay(base_lr=1.0, decay_steps=4), warmup_steps=2)
        >>> [schedule(t) for t in range(7)]
        [0.0, 0.5, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0]

    Differs from:
        Keras ``CosineDecay(warmup_steps=W, decay_steps=D)`` counts D after the warmup, like
        this. optax ``warmup_cosine_decay_schedule(warmup_steps=W, decay_steps=D)`` counts D
        INCLUDING the warmup: its equivalent here is ``Warmup(CosineDecay(..., D - W), W)``.
        torch has no warmup wrapper; ``SequentialLR([LinearLR, ...], milestones=[W])`` is
        the usual recipe, and LinearLR cannot start from 0.
    """

    schedule: AbstractSchedule
    warmup_steps: int
    start_lr: float = 0.0
    _peak: float = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_checked(self, "schedule", check_schedule("Warmup", "schedule", self.schedule))
        warmup = check_int("Warmup", "warmup_steps", self.warmup_steps, minimum=1)
        set_checked(self, "warmup_steps", warmup)
        set_checked(self, "start_lr", check_lr("Warmup", "start_lr", self.start_lr))
        set_checked(self, "_peak", self.schedule._value(0))

    def _value(self, step: int) -> float:
        if step >= self.warmup_steps:
            return self.schedule._value(step - self.warmup_steps)
        return self.start_lr + (self._peak - self.start_lr) * step / self.warmup_steps


@dataclasses.dataclass(frozen=True)
class Sequence(AbstractSchedule, type_name="sequence"):
    """Run schedules one after another, each restarting its own clock at its boundary.

    ``schedules[i]`` is used for ``boundaries[i-1] <= step < boundaries[i]`` and evaluated at
    ``step - boundaries[i-1]`` (the first one at ``step`` itself).

    Args:
        schedules: two or more schedules (a list is stored as a tuple).
        boundaries: ``len(schedules) - 1`` strictly increasing positive ints.

    Examples:
        >>> from unitrain.schedules import Constant, LinearDecay, Sequence
        >>> schedule = Sequence([LinearDecay(0.0, 1.0, steps=2), Constant(0.5)], boundaries=[3])
        >>> [schedule(t) for t in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.5]

    Differs from:
        optax ``join_schedules``: same semantics. torch ``SequentialLR`` also restarts each
        scheduler at its milestone, but runs them recursively on the optimizer's lr, so
        schedulers that read the current lr can see the previous one's last value.
    """

    # Stored as tuples; typed as sequences so that lists (and JSON) type-check as arguments.
    schedules: collections.abc.Sequence[AbstractSchedule]
    boundaries: collections.abc.Sequence[int]
    _starts: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        schedules = self.schedules
        if not isinstance(schedules, (list, tuple)) or len(schedules) < 2:
            raise ConfigError(
                f"Sequence: schedules must be a sequence of at least two schedules, "
                f"got schedules={schedules!r}"
            )
        checked = tuple(check_schedule("Sequence", "schedules", item) for item in schedules)
        set_checked(self, "schedules", checked)
        boundaries = check_milestones("Sequence", "boundaries", self.boundaries)
        if len(boundaries) != len(checked) - 1:
            raise ConfigError(
                f"Sequence: boundaries must have len(schedules) - 1 = {len(checked) - 1} "
                f"entries, got boundaries={self.boundaries!r}"
            )
        set_checked(self, "boundaries", boundaries)
        set_checked(self, "_starts", (0, *boundaries))

    def _value(self, step: int) -> float:
        index = bisect.bisect_right(self.boundaries, step)
        return self.schedules[index]._value(step - self._starts[index])


@dataclasses.dataclass(frozen=True)
class CosineRestarts(AbstractSchedule, type_name="cosine_restarts"):
    """Cosine decay that restarts forever, with periods growing by ``period_mult`` (SGDR).

    Cycle ``i`` starts at ``first_period * (period_mult**i - 1) / (period_mult - 1)`` (at
    ``first_period * i`` when ``period_mult == 1``) and lasts ``first_period *
    period_mult**i`` steps. Within it, at offset ``c`` of length ``L``:
    ``lr = min_lr + (base_lr - min_lr) * lr_mult**i * 0.5 * (1 + cos(pi * c / L))``.

    Args:
        base_lr: the learning rate at step 0, a finite float >= 0.
        first_period: the length of the first cycle, a positive int.
        period_mult: the growth of each cycle's length, a finite float >= 1. Non-integer
            values give cycles of fractional length, as in Keras.
        min_lr: the floor every cycle decays toward, a finite float >= 0.
        lr_mult: the factor applied to ``base_lr - min_lr`` at each restart, 0 < lr_mult <= 1.

    Examples:
        >>> from unitrain.schedules import CosineRestarts
        >>> schedule = CosineRestarts(base_lr=1.0, first_period=2, period_mult=2.0)
        >>> [round(schedule(t), 12) for t in range(8)]
        [1.0, 0.5, 1.0, 0.853553390593, 0.5, 0.146446609407, 1.0, 0.961939766256]

    Differs from:
        torch CosineAnnealingWarmRestarts(T_0, T_mult, eta_min): same values (T_mult must
        be an int there; it has no ``lr_mult``). Keras ``CosineDecayRestarts(t_mul, m_mul,
        alpha)``: ``lr_mult`` is ``m_mul`` and scales the part above the floor the same way,
        but ``alpha`` is a fraction of the initial rate where ``min_lr`` is absolute. optax
        ``sgdr_schedule`` runs a fixed list of cycles and then holds the last value.
    """

    base_lr: float
    first_period: int
    period_mult: float = 1.0
    min_lr: float = 0.0
    lr_mult: float = 1.0

    def __post_init__(self) -> None:
        owner = "CosineRestarts"
        set_checked(self, "base_lr", check_lr(owner, "base_lr", self.base_lr))
        period = check_int(owner, "first_period", self.first_period, minimum=1)
        set_checked(self, "first_period", period)
        mult = check_float(
            owner, "period_mult", self.period_mult, low=1.0, requirement="a finite float >= 1"
        )
        set_checked(self, "period_mult", mult)
        set_checked(self, "min_lr", check_lr(owner, "min_lr", self.min_lr))
        lr_mult = check_float(
            owner,
            "lr_mult",
            self.lr_mult,
            low=0.0,
            high=1.0,
            low_open=True,
            requirement="a float with 0 < lr_mult <= 1",
        )
        set_checked(self, "lr_mult", lr_mult)

    def _cycle_start(self, cycle: int) -> float:
        mult = self.period_mult
        return self.first_period * (mult**cycle - 1.0) / (mult - 1.0)

    def _value(self, step: int) -> float:
        mult = self.period_mult
        offset: float
        if mult == 1.0:
            cycle, offset = divmod(step, self.first_period)
            length = float(self.first_period)
        else:
            # Closed form of the geometric series, inverted: O(1) for any step. The log can
            # land one cycle off exactly at a boundary (log(243, 3) = 4.999...), so the
            # start formula has the last word. That formula rounds too (43 steps at mult 1.1
            # give a second cycle starting at 43.00000000000001), so a start within its
            # rounding error of the step counts as reached: a cycle that starts on a whole
            # step restarts on it, as exact arithmetic says.
            reached = step + _START_ERROR * (step + self.first_period / (mult - 1.0))
            cycle = int(math.log1p(step * (mult - 1.0) / self.first_period) / math.log(mult))
            while cycle > 0 and self._cycle_start(cycle) > reached:
                cycle -= 1
            while self._cycle_start(cycle + 1) <= reached:
                cycle += 1
            offset = max(step - self._cycle_start(cycle), 0.0)
            length = self.first_period * mult**cycle
        cosine = 0.5 * (1.0 + math.cos(math.pi * offset / length))
        return self.min_lr + (self.base_lr - self.min_lr) * self.lr_mult**cycle * cosine


@dataclasses.dataclass(frozen=True)
class OneCycle(AbstractSchedule, type_name="one_cycle"):
    """The 1cycle policy: up from ``max_lr / div_factor`` to ``max_lr``, then down to near 0.

    torch OneCycleLR's two-phase formula. With ``initial = max_lr / div_factor``,
    ``final = initial / final_div_factor``, ``P = pct_start * total_steps - 1`` (a float)
    and ``E = total_steps - 1``: for ``step <= P`` anneal from ``initial`` to ``max_lr`` with
    ``pct = step / P``; after, anneal from ``max_lr`` to ``final`` with
    ``pct = min((step - P) / (E - P), 1)``. Cosine anneal: ``end + (start - end) / 2 * (1 +
    cos(pi * pct))``; linear: ``start + (end - start) * pct``. From step E on: ``final``.

    Args:
        max_lr: the peak learning rate, a finite float >= 0.
        total_steps: the number of updates in the cycle, a positive int.
        pct_start: the fraction of the cycle spent rising, 0 < pct_start < 1, with
            ``pct_start * total_steps > 1``.
        div_factor: ``max_lr / initial``, a finite float > 0.
        final_div_factor: ``initial / final``, a finite float > 0.
        anneal: ``"cos"`` or ``"linear"``.

    Examples:
        >>> from unitrain.schedules import OneCycle
        >>> schedule = OneCycle(max_lr=1.0, total_steps=12, pct_start=0.25, anneal="linear")
        >>> [round(schedule(t), 6) for t in (0, 1, 2, 11, 50)]
        [0.04, 0.52, 1.0, 4e-06, 4e-06]

    Differs from:
        torch OneCycleLR: same values for steps 0 .. total_steps - 1; torch raises after
        total_steps and at step total_steps itself overshoots the minimum, where this holds
        ``final``. optax ``cosine_onecycle_schedule`` / ``linear_onecycle_schedule`` reach the
        peak at step ``int(pct_start * T)`` and the minimum at step T, one step later than
        torch and this. Keras has no one-cycle schedule.
    """

    max_lr: float
    total_steps: int
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    anneal: Literal["cos", "linear"] = "cos"

    def __post_init__(self) -> None:
        owner = "OneCycle"
        set_checked(self, "max_lr", check_lr(owner, "max_lr", self.max_lr))
        total = check_int(owner, "total_steps", self.total_steps, minimum=1)
        set_checked(self, "total_steps", total)
        pct = check_float(
            owner,
            "pct_start",
            self.pct_start,
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
            requirement="a float with 0 < pct_start < 1",
        )
        if pct * total <= 1.0:
            raise ConfigError(
                f"OneCycle: pct_start * total_steps must be > 1 so that the rise lasts at least "
                f"one step, got pct_start={self.pct_start!r}, total_steps={total!r}"
            )
        set_checked(self, "pct_start", pct)
        for name in ("div_factor", "final_div_factor"):
            factor = check_float(
                owner,
                name,
                getattr(self, name),
                low=0.0,
                low_open=True,
                requirement="a finite float > 0",
            )
            set_checked(self, name, factor)
        if self.anneal not in ("cos", "linear"):
            raise ConfigError(
                f"OneCycle: anneal must be 'cos' or 'linear', got anneal={self.anneal!r}"
            )

    def _value(self, step: int) -> float:
        initial = self.max_lr / self.div_factor
        peak_step = self.pct_start * self.total_steps - 1.0
        if step <= peak_step:
            start, end, pct = initial, self.max_lr, step / peak_step
        else:
            last_step = self.total_steps - 1
            pct = min((step - peak_step) / (last_step - peak_step), 1.0)
            start, end = self.max_lr, initial / self.final_div_factor
        if self.anneal == "cos":
            return end + (start - end) / 2.0 * (1.0 + math.cos(math.pi * pct))
        return start + (end - start) * pct
