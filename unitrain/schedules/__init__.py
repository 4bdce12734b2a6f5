"""Learning-rate schedules: pure, immutable, JSON-serialisable functions of the step.

``lr = schedule(step)``, where ``step`` is the number of optimizer updates already applied
(0 for the first update). Values are Python floats computed in float64 on the host, so
every backend sees the same numbers. ``schedule.to_dict()`` / :func:`from_dict` and
:func:`to_json` / :func:`from_json` round-trip every schedule, composites included.

Examples:
    >>> from unitrain.schedules import CosineDecay, Warmup, from_json, to_json
    >>> schedule = Warmup(CosineDecay(base_lr=0.1, decay_steps=1000), warmup_steps=100)
    >>> schedule(50), schedule(100)
    (0.05, 0.1)
    >>> from_json(to_json(schedule)) == schedule
    True
"""

from unitrain.schedules._base import AbstractSchedule, from_dict, from_json, to_json
from unitrain.schedules._composite import CosineRestarts, OneCycle, Sequence, Warmup
from unitrain.schedules._decay import (
    Constant,
    CosineDecay,
    ExponentialDecay,
    InverseSqrt,
    LinearDecay,
)
from unitrain.schedules._piecewise import MultiStepDecay, PiecewiseConstant, StepDecay

__all__ = [
    "AbstractSchedule",
    "Constant",
    "CosineDecay",
    "CosineRestarts",
    "ExponentialDecay",
    "InverseSqrt",
    "LinearDecay",
    "MultiStepDecay",
    "OneCycle",
    "PiecewiseConstant",
    "Sequence",
    "StepDecay",
    "Warmup",
    "from_dict",
    "from_json",
    "to_json",
]
