"""schedules: the learning rate a backend applies at each update equals the schedule's.

Observed from outside with the learning-rate probe (:func:`~unitrain.conformance._probes.
lr_probe`): plain SGD from a zero state with a gradient every dtype holds exactly, so each
update reveals the rate used to within one rounding. Every built-in schedule is covered,
warmup included, plus a rate that changes at every step. For step-shaped schedules the steps
where the rate changes must also match exactly (a discrete outcome).
"""

from __future__ import annotations

import math

import numpy as np

from unitrain import schedules as s
from unitrain.conformance._context import Context
from unitrain.conformance._probes import lr_probe
from unitrain.conformance._registry import add_check

__all__ = ["SCHEDULES"]


def _every_step() -> s.AbstractSchedule:
    rng = np.random.default_rng(0xE5)
    values = tuple(float(v) for v in 10.0 ** rng.uniform(-4.0, -1.0, 24))
    return s.PiecewiseConstant(boundaries=tuple(range(1, 24)), values=values)


#: name -> (schedule, updates to observe, whether it is step-shaped). Cosine-like schedules
#: run into their minimum (1% of the peak), where a rate evaluated in float32 goes wrong.
SCHEDULES: dict[str, tuple[s.AbstractSchedule, int, bool]] = {
    "constant": (s.Constant(0.1), 8, True),
    "exponential_decay": (s.ExponentialDecay(0.1, gamma=0.9), 24, False),
    "cosine_decay": (s.CosineDecay(0.1, decay_steps=30, min_lr=1e-3), 34, False),
    "linear_decay": (s.LinearDecay(0.1, 1e-3, steps=24), 28, False),
    "inverse_sqrt": (s.InverseSqrt(0.1, warmup_steps=6), 24, False),
    "step_decay": (s.StepDecay(0.1, step_size=5, gamma=0.5), 24, True),
    "multi_step_decay": (s.MultiStepDecay(0.1, milestones=(3, 8, 17), gamma=0.3), 24, True),
    "piecewise_constant": (
        s.PiecewiseConstant(boundaries=(4, 9, 15), values=(0.1, 0.05, 0.2, 0.01)),
        20,
        True,
    ),
    "warmup_cosine": (s.Warmup(s.CosineDecay(0.1, 24, 1e-3), warmup_steps=6), 34, False),
    "sequence": (
        s.Sequence(
            [s.LinearDecay(0.0, 0.1, 5), s.CosineDecay(0.1, 16, 2e-3), s.Constant(2e-3)],
            boundaries=[5, 21],
        ),
        26,
        False,
    ),
    "cosine_restarts": (
        s.CosineRestarts(0.1, first_period=6, period_mult=2.0, min_lr=1e-3, lr_mult=0.5),
        30,
        False,
    ),
    "one_cycle": (s.OneCycle(0.1, total_steps=24, pct_start=0.25), 26, False),
    "every_step": (_every_step(), 24, True),
}


def _change_steps(values: list[float], threshold: float) -> list[int]:
    return [
        t
        for t in range(1, len(values))
        if abs(values[t] - values[t - 1]) > threshold * max(abs(values[t]), abs(values[t - 1]))
    ]


def _relative_error(got: float, want: float) -> float:
    # A zero learning rate (a warmup's first step) must be applied exactly.
    if want == 0.0:
        return 0.0 if got == 0.0 else math.inf
    return abs(got - want) / want


def _run(ctx: Context, schedule: s.AbstractSchedule, steps: int, step_shaped: bool) -> None:
    applied = lr_probe(ctx, schedule, steps)
    expected = [schedule(t) for t in range(steps)]
    ctx.require_equal("updates observed", len(applied), steps)
    worst, worst_abs, worst_step = 0.0, 0.0, 0
    for t, (got, want) in enumerate(zip(applied, expected)):
        error = _relative_error(got, want)
        if not error <= worst:
            worst, worst_abs, worst_step = error, abs(got - want), t
    ctx.record(
        f"learning rate applied at update {worst_step} (schedule {expected[worst_step]:.6g}, "
        f"applied {applied[worst_step]:.9g})",
        "lr",
        worst_abs,
        worst,
        ctx.tolerance.lr,
    )
    if step_shaped:
        threshold = 10 * ctx.tolerance.lr
        ctx.require_equal(
            "steps where the learning rate changes",
            _change_steps(applied, threshold),
            _change_steps(expected, threshold),
        )


def _register(name: str, schedule: s.AbstractSchedule, steps: int, step_shaped: bool) -> None:
    def run(ctx: Context) -> None:
        _run(ctx, schedule, steps, step_shaped)

    add_check(
        "schedules",
        name,
        run,
        description=f"the LR applied at each of {steps} updates equals {type(schedule).__name__}",
        guards="a learning rate applied late, cached, or evaluated in float32 in a graph",
    )


for _name, (_schedule, _steps, _shaped) in SCHEDULES.items():
    _register(_name, _schedule, _steps, _shaped)
