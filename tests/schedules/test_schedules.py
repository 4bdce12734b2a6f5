"""Tests for unitrain.schedules: golden values, properties, argument checks, serialisation."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import unitrain.schedules as schedules_module
from unitrain._errors import ConfigError
from unitrain.schedules import (
    AbstractSchedule,
    Constant,
    CosineDecay,
    CosineRestarts,
    ExponentialDecay,
    InverseSqrt,
    LinearDecay,
    MultiStepDecay,
    OneCycle,
    PiecewiseConstant,
    Sequence,
    StepDecay,
    Warmup,
    from_dict,
    from_json,
    to_json,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEDULE_CLASSES = [
    obj
    for name in schedules_module.__all__
    if isinstance(obj := getattr(schedules_module, name), type)
    and issubclass(obj, AbstractSchedule)
    and obj is not AbstractSchedule
]


# ---------------------------------------------------------------------------------------------
# Golden values against torch.optim.lr_scheduler (run live; torch is optional).
# The lr torch uses for update t is the optimizer's lr before the t-th scheduler.step().


def _torch_lrs(build: Callable[[Any, Any], Any], lr: float, steps: int) -> list[float]:
    torch = pytest.importorskip("torch")
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = build(torch.optim.lr_scheduler, optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    return lrs


# (id, ours, build torch scheduler, torch optimizer lr, steps, rel tol). Torch schedulers that
# update recursively (lr_t from lr_{t-1}) drift by ulps, hence 1e-9 for those.
TORCH_CASES = [
    ("StepLR", StepDecay(0.1, 7, 0.5), lambda s, o: s.StepLR(o, 7, 0.5), 0.1, 300, 1e-12),
    (
        "MultiStepLR",
        MultiStepDecay(0.1, (30, 80, 150), 0.3),
        lambda s, o: s.MultiStepLR(o, [30, 80, 150], 0.3),
        0.1,
        300,
        1e-12,
    ),
    (
        "ExponentialLR",
        ExponentialDecay(0.1, 0.99),
        lambda s, o: s.ExponentialLR(o, 0.99),
        0.1,
        300,
        1e-9,
    ),
    (
        "CosineAnnealingLR",
        CosineDecay(0.1, 300, min_lr=1e-3),
        lambda s, o: s.CosineAnnealingLR(o, T_max=300, eta_min=1e-3),
        0.1,
        301,
        1e-9,
    ),
    (
        "LinearLR-up",
        LinearDecay(0.025, 0.1, 120),
        lambda s, o: s.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=120),
        0.1,
        300,
        1e-9,
    ),
    (
        "LinearLR-down",
        LinearDecay(0.1, 0.01, 200),
        lambda s, o: s.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=200),
        0.1,
        300,
        1e-9,
    ),
    (
        "WarmRestarts-mult1",
        CosineRestarts(0.1, 37, 1.0, min_lr=1e-4),
        lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=37, T_mult=1, eta_min=1e-4),
        0.1,
        300,
        1e-12,
    ),
    (
        "WarmRestarts-mult2",
        CosineRestarts(0.1, 10, 2.0, min_lr=1e-4),
        lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=10, T_mult=2, eta_min=1e-4),
        0.1,
        300,
        1e-12,
    ),
    (
        "WarmRestarts-mult3",
        CosineRestarts(0.1, 5, 3, min_lr=0.0),
        lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=3),
        0.1,
        300,
        1e-12,
    ),
    (
        "OneCycleLR-cos",
        OneCycle(0.1, 300),
        lambda s, o: s.OneCycleLR(o, max_lr=0.1, total_steps=300),
        0.1,
        300,
        1e-12,
    ),
    (
        "OneCycleLR-linear",
        OneCycle(
            0.5, 257, pct_start=0.25, div_factor=10.0, final_div_factor=100.0, anneal="linear"
        ),
        lambda s, o: s.OneCycleLR(
            o,
            max_lr=0.5,
            total_steps=257,
            pct_start=0.25,
            div_factor=10.0,
            final_div_factor=100.0,
            anneal_strategy="linear",
        ),
        0.1,
        257,
        1e-12,
    ),
]


@pytest.mark.parametrize(
    ("ours", "build", "lr", "steps", "rel_tol"),
    [case[1:] for case in TORCH_CASES],
    ids=[case[0] for case in TORCH_CASES],
)
def test_matches_torch(
    ours: AbstractSchedule,
    build: Callable[[Any, Any], Any],
    lr: float,
    steps: int,
    rel_tol: float,
) -> None:
    expected = _torch_lrs(build, lr, steps)
    for step, want in enumerate(expected):
        got = ours(step)
        assert math.isclose(got, want, rel_tol=rel_tol, abs_tol=1e-15), (step, got, want)


# ---------------------------------------------------------------------------------------------
# Golden values measured once with keras 3.15.1 (TF 2.21 backend, float32 in-graph), by
# calling keras.optimizers.schedules.<Name>(...)(t) for t = 0, 1, ...; float32, so 5e-6.

KERAS_PIECEWISE = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]  # boundaries=[3, 6]
KERAS_COSINE_WARMUP = [  # CosineDecay(0.0, 8, alpha=0.125, warmup_target=1.0, warmup_steps=4)
    0.0, 0.25, 0.5, 0.75, 1.0, 0.9666972756385803, 0.8718592524528503, 0.7299239635467529,
    0.5625, 0.3950759768486023, 0.25314080715179443, 0.1583026647567749, 0.125, 0.125,
    0.125, 0.125,
]  # fmt: skip
KERAS_COSINE_RESTARTS = [  # CosineDecayRestarts(1.0, 4, t_mul=2.0, m_mul=0.5, alpha=0.1)
    1.0, 0.8681980967521667, 0.5499999523162842, 0.23180195689201355, 0.550000011920929,
    0.5328729152679443, 0.48409903049468994, 0.411103755235672, 0.32499998807907104,
    0.2388962209224701, 0.16590097546577454, 0.11712708324193954, 0.32499998807907104,
    0.32283833622932434, 0.31643643975257874, 0.30604031682014465, 0.2920495271682739,
    0.2750016450881958, 0.25555187463760376, 0.2344476580619812, 0.21249999105930328,
    0.19055233895778656, 0.1694481074810028, 0.14999833703041077, 0.13295048475265503,
    0.11895966529846191, 0.10856354236602783, 0.10216165333986282, 0.21250000596046448,
    0.21222913265228271,
]  # fmt: skip

KERAS_CASES = [
    # Keras boundaries are upper-inclusive: its [3, 6] is our (4, 7).
    ("PiecewiseConstantDecay", PiecewiseConstant((4, 7), (1.0, 0.5, 0.25)), KERAS_PIECEWISE),
    ("CosineDecay-warmup", Warmup(CosineDecay(1.0, 8, 0.125), 4), KERAS_COSINE_WARMUP),
    ("CosineDecayRestarts", CosineRestarts(1.0, 4, 2.0, 0.1, 0.5), KERAS_COSINE_RESTARTS),
]


@pytest.mark.parametrize(
    ("ours", "expected"), [c[1:] for c in KERAS_CASES], ids=[c[0] for c in KERAS_CASES]
)
def test_matches_keras_golden(ours: AbstractSchedule, expected: list[float]) -> None:
    for step, want in enumerate(expected):
        assert math.isclose(ours(step), want, rel_tol=5e-6, abs_tol=1e-7), step


# ---------------------------------------------------------------------------------------------
# Hand-computed values: the formula written out independently of the implementation.


def _half_cosine(fraction: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * fraction))


HAND_CASES = [
    (Constant(0.3), [(0, 0.3), (10**12, 0.3)]),
    (InverseSqrt(2.0, 100), [(0, 0.02), (49, 1.0), (99, 2.0), (399, 1.0), (9_999, 0.2)]),
    (
        PiecewiseConstant((10, 20), (0.3, 0.2, 0.1)),
        [(0, 0.3), (9, 0.3), (10, 0.2), (19, 0.2), (20, 0.1), (10**9, 0.1)],
    ),
    (MultiStepDecay(1.0, (3,), 0.5), [(2, 1.0), (3, 0.5), (10**6, 0.5)]),
    (
        Warmup(CosineDecay(1.0, 10), 5, start_lr=0.5),
        [(0, 0.5), (1, 0.6), (4, 0.9), (5, 1.0), (10, 0.5), (15, 0.0), (99, 0.0)],
    ),
    (
        Warmup(Constant(0.4), 4),
        [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.30000000000000004), (4, 0.4)],
    ),
    (
        Sequence([Constant(1.0), ExponentialDecay(1.0, 0.5), Constant(0.1)], (3, 6)),
        [(0, 1.0), (2, 1.0), (3, 1.0), (4, 0.5), (5, 0.25), (6, 0.1), (1000, 0.1)],
    ),
    (CosineDecay(2.0, 4, 1.0), [(0, 2.0), (1, 1.0 + _half_cosine(0.25)), (4, 1.0), (8, 1.0)]),
    (
        # Fractional periods: 2, 3, 4.5, ...; cycles start at 0, 2, 5, 9.5.
        CosineRestarts(1.0, 2, 1.5, lr_mult=0.5),
        [
            (0, 1.0), (1, 0.5), (2, 0.5), (3, 0.5 * _half_cosine(1 / 3)),
            (9, 0.25 * _half_cosine(4 / 4.5)), (10, 0.125 * _half_cosine(0.5 / 6.75)),
        ],
    ),
    (
        # Peak at P = 0.3 * 10 - 1 = 2, minimum at E = 9, held after.
        OneCycle(1.0, 10, div_factor=4.0, final_div_factor=5.0),
        [
            (0, 0.25), (1, 0.25 + 0.75 * _half_cosine(1.0 - 0.5)), (2, 1.0),
            (9, 0.05), (10, 0.05), (10**7, 0.05),
        ],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("schedule", "cases"), HAND_CASES, ids=lambda x: type(x).__name__)
def test_hand_computed_values(schedule: AbstractSchedule, cases: list[tuple[int, float]]) -> None:
    for step, want in cases:
        assert math.isclose(schedule(step), want, rel_tol=1e-12, abs_tol=1e-15), (step, want)


# ---------------------------------------------------------------------------------------------
# CosineRestarts: the O(1) cycle index must agree with walking the cycles one by one.


def _walk_restarts(schedule: CosineRestarts, steps: int) -> list[float]:
    """Reference: torch's incremental T_cur / T_i bookkeeping, generalised to float T_mult."""
    values, offset, length, cycle = [], 0.0, float(schedule.first_period), 0
    for _ in range(steps):
        scale = schedule.lr_mult**cycle * _half_cosine(offset / length)
        values.append(schedule.min_lr + (schedule.base_lr - schedule.min_lr) * scale)
        offset += 1.0
        if offset >= length:
            offset, length, cycle = offset - length, length * schedule.period_mult, cycle + 1
    return values


@pytest.mark.parametrize("first_period", [1, 2, 3, 7])
@pytest.mark.parametrize("period_mult", [1.0, 1.5, 2.0, 3.0, 4.0, 1.1])
def test_cosine_restarts_matches_walk(first_period: int, period_mult: float) -> None:
    schedule = CosineRestarts(1.0, first_period, period_mult, min_lr=0.01, lr_mult=0.9)
    for step, want in enumerate(_walk_restarts(schedule, 3000)):
        assert math.isclose(schedule(step), want, rel_tol=1e-9), step


@pytest.mark.parametrize("period_mult", [2, 3, 4, 5, 7, 10])
@pytest.mark.parametrize("first_period", [1, 3, 10])
def test_cosine_restarts_exact_integer_boundaries(period_mult: int, first_period: int) -> None:
    schedule = CosineRestarts(1.0, first_period, period_mult, min_lr=0.0, lr_mult=0.5)
    start, length = 0, first_period
    for cycle in range(40):
        if start > 10**15:
            break
        assert schedule(start) == 0.5**cycle, (cycle, start)  # a restart: the cycle's peak
        if start > 0:  # the previous cycle's last step, at offset L - 1 of its length L
            previous = length // period_mult
            want = 0.5 ** (cycle - 1) * _half_cosine((previous - 1) / previous)
            assert math.isclose(schedule(start - 1), want, rel_tol=1e-12), (cycle, start)
        start, length = start + length, length * period_mult


def test_cosine_restarts_mult_one_is_periodic() -> None:
    schedule = CosineRestarts(0.2, 17)
    assert [schedule(t) for t in range(17)] == [schedule(t + 17 * 1000) for t in range(17)]


# ---------------------------------------------------------------------------------------------
# Hypothesis: one strategy per schedule type. The properties below are about values, not
# speed, so none has a deadline: drawing a nested schedule takes a few ms alone but hundreds
# on a shared, loaded machine or under mutation testing, and a deadline there fails a correct
# schedule (test_json_round_trip[Sequence] did, at 278 ms against hypothesis's 200 ms).

lrs = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=1, max_value=1000)
gammas = st.floats(min_value=1e-3, max_value=1.0)
milestones = st.lists(st.integers(1, 10_000), min_size=1, max_size=5, unique=True).map(
    lambda xs: tuple(sorted(xs))
)
steps = st.integers(min_value=0, max_value=10**9)


@st.composite
def _piecewise(draw: st.DrawFn) -> PiecewiseConstant:
    boundaries = draw(milestones)
    values = draw(st.lists(lrs, min_size=len(boundaries) + 1, max_size=len(boundaries) + 1))
    return PiecewiseConstant(boundaries, tuple(values))


@st.composite
def _one_cycle(draw: st.DrawFn) -> OneCycle:
    total = draw(st.integers(2, 10_000))
    pct = draw(st.floats(min_value=1.0 / total, max_value=1.0, exclude_min=True, exclude_max=True))
    assume(pct * total > 1.0)  # the float product can round down to exactly 1
    return OneCycle(
        draw(lrs),
        total,
        pct,
        draw(st.floats(1.0, 1e3)),
        draw(st.floats(1.0, 1e5)),
        draw(st.sampled_from(["cos", "linear"])),
    )


LEAF_STRATEGIES: dict[type[AbstractSchedule], st.SearchStrategy[AbstractSchedule]] = {
    Constant: st.builds(Constant, lrs),
    StepDecay: st.builds(StepDecay, lrs, counts, gammas),
    MultiStepDecay: st.builds(MultiStepDecay, lrs, milestones, gammas),
    ExponentialDecay: st.builds(ExponentialDecay, lrs, gammas),
    CosineDecay: st.builds(CosineDecay, lrs, counts, lrs),
    LinearDecay: st.builds(LinearDecay, lrs, lrs, counts),
    InverseSqrt: st.builds(InverseSqrt, lrs, counts),
    PiecewiseConstant: _piecewise(),
    CosineRestarts: st.builds(
        CosineRestarts, lrs, counts, st.floats(1.0, 4.0), lrs, st.floats(1e-3, 1.0)
    ),
    OneCycle: _one_cycle(),
}


@st.composite
def _sequence(draw: st.DrawFn, children: st.SearchStrategy[AbstractSchedule]) -> Sequence:
    parts = draw(st.lists(children, min_size=2, max_size=4))
    cuts = draw(st.lists(st.integers(1, 10_000), min_size=len(parts) - 1, unique=True))
    return Sequence(parts, sorted(cuts[: len(parts) - 1]))


any_schedule = st.recursive(
    st.one_of(list(LEAF_STRATEGIES.values())),
    lambda children: st.one_of(st.builds(Warmup, children, counts, lrs), _sequence(children)),
    max_leaves=6,
)
STRATEGIES: dict[type[AbstractSchedule], st.SearchStrategy[AbstractSchedule]] = {
    **LEAF_STRATEGIES,
    Warmup: st.builds(Warmup, any_schedule, counts, lrs),
    Sequence: _sequence(any_schedule),
}


def test_every_public_schedule_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(SCHEDULE_CLASSES)


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_json_round_trip(cls: type[AbstractSchedule], data: st.DataObject) -> None:
    schedule = data.draw(STRATEGIES[cls])
    text = to_json(schedule)
    rebuilt = from_json(text)
    assert rebuilt == schedule and hash(rebuilt) == hash(schedule)
    assert type(rebuilt) is cls
    assert from_dict(json.loads(text)) == schedule
    assert rebuilt.to_dict() == schedule.to_dict() == json.loads(text)
    step = data.draw(steps)
    assert rebuilt(step) == schedule(step)


@settings(max_examples=300, deadline=None)
@given(schedule=any_schedule, step=steps)
def test_values_are_finite_and_non_negative(schedule: AbstractSchedule, step: int) -> None:
    value = schedule(step)
    assert type(value) is float
    assert math.isfinite(value) and value >= 0.0


@settings(deadline=None)
@given(base=lrs, floor=lrs, horizon=counts, extra=st.integers(0, 10**9))
def test_cosine_clamped_after_horizon(base: float, floor: float, horizon: int, extra: int) -> None:
    schedule = CosineDecay(base, horizon, floor)
    assert schedule(horizon + extra) == floor
    # min + (base - min) * 1 can be an ulp of max(base, min) away from base (the torch/optax
    # formula; kept for parity).
    assert math.isclose(schedule(0), base, rel_tol=1e-15, abs_tol=4.5e-16 * max(base, floor))


@settings(deadline=None)
@given(inner=any_schedule, warmup_steps=counts, start=lrs)
def test_warmup_is_continuous_at_the_join(
    inner: AbstractSchedule, warmup_steps: int, start: float
) -> None:
    schedule = Warmup(inner, warmup_steps, start)
    peak = inner(0)
    assert schedule(0) == start
    assert schedule(warmup_steps) == peak
    on_line = start + (peak - start) * (warmup_steps - 1) / warmup_steps
    assert math.isclose(schedule(warmup_steps - 1), on_line, rel_tol=1e-12, abs_tol=1e-300)
    assert schedule(warmup_steps + 7) == inner(7)


@settings(deadline=None)
@given(schedule=_sequence(any_schedule), offset=st.integers(0, 1000))
def test_sequence_switches_at_boundaries(schedule: Sequence, offset: int) -> None:
    starts = (0, *schedule.boundaries)
    for index, part in enumerate(schedule.schedules):
        start = starts[index]
        assert schedule(start) == part(0)
        end = schedule.boundaries[index] if index < len(schedule.boundaries) else None
        if end is None or start + offset < end:
            assert schedule(start + offset) == part(offset)
        if end is not None:
            assert schedule(end - 1) == part(end - 1 - start)


# ---------------------------------------------------------------------------------------------
# Argument checks: each bad argument raises ConfigError naming it and showing its value.

c = Constant(0.1)
BAD_ARGUMENTS: list[tuple[str, Callable[[], object]]] = [
    ("lr", lambda: Constant(-0.1)),
    ("lr", lambda: Constant(math.nan)),
    ("lr", lambda: Constant(math.inf)),
    ("lr", lambda: Constant("0.1")),  # type: ignore[arg-type]
    ("lr", lambda: Constant(True)),
    ("base_lr", lambda: StepDecay(-1.0, 10)),
    ("step_size", lambda: StepDecay(0.1, 0)),
    ("step_size", lambda: StepDecay(0.1, 2.0)),  # type: ignore[arg-type]
    ("step_size", lambda: StepDecay(0.1, True)),
    ("gamma", lambda: StepDecay(0.1, 5, gamma=0.0)),
    ("gamma", lambda: StepDecay(0.1, 5, gamma=1.5)),
    ("gamma", lambda: StepDecay(0.1, 5, gamma=math.nan)),
    ("base_lr", lambda: MultiStepDecay(math.inf, (5,))),
    ("milestones", lambda: MultiStepDecay(0.1, ())),
    ("milestones", lambda: MultiStepDecay(0.1, (5, 5))),
    ("milestones", lambda: MultiStepDecay(0.1, (5, 3))),
    ("milestones", lambda: MultiStepDecay(0.1, (0, 5))),
    ("milestones", lambda: MultiStepDecay(0.1, (1.5,))),  # type: ignore[arg-type]
    ("milestones", lambda: MultiStepDecay(0.1, "12")),  # type: ignore[arg-type]
    ("gamma", lambda: MultiStepDecay(0.1, (5,), gamma=-0.1)),
    ("base_lr", lambda: ExponentialDecay(-0.1, 0.9)),
    ("gamma", lambda: ExponentialDecay(0.1, 1.01)),
    ("base_lr", lambda: CosineDecay(math.inf, 10)),
    ("decay_steps", lambda: CosineDecay(0.1, 0)),
    ("decay_steps", lambda: CosineDecay(0.1, -5)),
    ("min_lr", lambda: CosineDecay(0.1, 10, min_lr=-1e-3)),
    ("start_lr", lambda: LinearDecay(math.nan, 0.0, 10)),
    ("end_lr", lambda: LinearDecay(0.1, -0.1, 10)),
    ("steps", lambda: LinearDecay(0.1, 0.0, 0)),
    ("base_lr", lambda: InverseSqrt(-1.0, 10)),
    ("warmup_steps", lambda: InverseSqrt(0.1, 0)),
    ("boundaries", lambda: PiecewiseConstant((), (0.1,))),
    ("boundaries", lambda: PiecewiseConstant((5, 2), (0.1, 0.2, 0.3))),
    ("values", lambda: PiecewiseConstant((5,), (0.1,))),
    ("values", lambda: PiecewiseConstant((5,), (0.1, -1.0))),
    ("values", lambda: PiecewiseConstant((5,), 0.1)),  # type: ignore[arg-type]
    ("schedule", lambda: Warmup("cosine", 10)),  # type: ignore[arg-type]
    ("warmup_steps", lambda: Warmup(c, 0)),
    ("start_lr", lambda: Warmup(c, 10, start_lr=-1.0)),
    ("schedules", lambda: Sequence([c], [])),
    ("schedules", lambda: Sequence(c, [5])),  # type: ignore[arg-type]
    ("schedules", lambda: Sequence([c, 0.1], [5])),  # type: ignore[list-item]
    ("boundaries", lambda: Sequence([c, c], [0])),
    ("boundaries", lambda: Sequence([c, c], [5, 6])),
    ("boundaries", lambda: Sequence([c, c, c], [6, 5])),
    ("base_lr", lambda: CosineRestarts(-0.1, 10)),
    ("first_period", lambda: CosineRestarts(0.1, 0)),
    ("period_mult", lambda: CosineRestarts(0.1, 10, period_mult=0.5)),
    ("period_mult", lambda: CosineRestarts(0.1, 10, period_mult=math.nan)),
    ("min_lr", lambda: CosineRestarts(0.1, 10, min_lr=-1.0)),
    ("lr_mult", lambda: CosineRestarts(0.1, 10, lr_mult=0.0)),
    ("lr_mult", lambda: CosineRestarts(0.1, 10, lr_mult=1.5)),
    ("max_lr", lambda: OneCycle(math.nan, 100)),
    ("total_steps", lambda: OneCycle(0.1, 0)),
    ("pct_start", lambda: OneCycle(0.1, 100, pct_start=0.0)),
    ("pct_start", lambda: OneCycle(0.1, 100, pct_start=1.0)),
    ("pct_start", lambda: OneCycle(0.1, 100, pct_start=0.01)),
    ("div_factor", lambda: OneCycle(0.1, 100, div_factor=0.0)),
    ("final_div_factor", lambda: OneCycle(0.1, 100, final_div_factor=-1.0)),
    ("anneal", lambda: OneCycle(0.1, 100, anneal="cosine")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("name", "build"),
    BAD_ARGUMENTS,
    ids=[f"{i}-{name}" for i, (name, _) in enumerate(BAD_ARGUMENTS)],
)
def test_bad_argument_raises_config_error(name: str, build: Callable[[], object]) -> None:
    with pytest.raises(ConfigError, match=rf"\b{name}=") as info:
        build()
    assert isinstance(info.value, ValueError)


def test_error_message_shows_the_value_optax_style() -> None:
    with pytest.raises(ConfigError) as info:
        CosineDecay(0.1, decay_steps=0)
    assert str(info.value) == "CosineDecay: decay_steps must be a positive int, got decay_steps=0"


@pytest.mark.parametrize("bad_step", [-1, 1.0, True, False, "3", None, np.float64(2.0)])
@pytest.mark.parametrize("schedule", [c, Warmup(c, 3), OneCycle(0.1, 10)], ids=repr)
def test_bad_step_raises_config_error(schedule: AbstractSchedule, bad_step: object) -> None:
    with pytest.raises(ConfigError, match=r"\bstep="):
        schedule(bad_step)  # type: ignore[arg-type]


def test_numpy_integer_step_is_accepted() -> None:
    schedule = CosineDecay(1.0, 10)
    assert schedule(np.int64(3)) == schedule(3)  # type: ignore[arg-type]
    assert type(schedule(np.int32(3))) is float  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Serialisation and value semantics.


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"type": "cosine"}, "unknown schedule type 'cosine'"),
        ({"lr": 0.1}, "unknown schedule type None"),
        ("constant", "expected a dict"),
        ({"type": "constant", "lr": 0.1, "gamma": 0.5}, "has no field(s) gamma"),
        ({"type": "cosine_decay", "base_lr": 0.1}, "missing field(s) decay_steps"),
        ({"type": "warmup", "schedule": {"type": "nope"}, "warmup_steps": 3}, "'nope'"),
        ({"type": "constant", "lr": -1}, "lr=-1"),
        ({"type": "step_decay", "base_lr": 0.1, "step_size": "10"}, "step_size='10'"),
    ],
)
def test_from_dict_rejects_bad_input(data: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    assert fragment in str(info.value)


def test_unknown_type_lists_known_types() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({"type": "cosine"})
    for cls in SCHEDULE_CLASSES:
        assert cls.type_name in str(info.value)


def test_wrong_field_lists_the_fields() -> None:
    with pytest.raises(ConfigError, match="its fields are: base_lr, decay_steps, min_lr"):
        from_dict({"type": "cosine_decay", "base_lr": 0.1, "steps": 10})


def test_from_json_rejects_invalid_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        from_json("{type: constant")


def test_type_names_are_unique_and_registered() -> None:
    names = [cls.type_name for cls in SCHEDULE_CLASSES]
    assert len(set(names)) == len(names) == 12
    assert sorted(names) == sorted(schedules_module._base._REGISTRY.types())


def test_the_readme_counts_the_schedules_there_are() -> None:
    words = {"Eleven": 11, "Twelve": 12, "Thirteen": 13, "Fourteen": 14}
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"\*\*Schedules are data\.\*\* (\w+) schedules", readme)
    assert stated is not None and words[stated.group(1)] == len(SCHEDULE_CLASSES)


def test_nested_to_dict() -> None:
    schedule = Sequence([Warmup(CosineDecay(1.0, 10), 2), Constant(0.0)], [12])
    assert schedule.to_dict() == {
        "type": "sequence",
        "schedules": [
            {
                "type": "warmup",
                "schedule": {
                    "type": "cosine_decay",
                    "base_lr": 1.0,
                    "decay_steps": 10,
                    "min_lr": 0.0,
                },
                "warmup_steps": 2,
                "start_lr": 0.0,
            },
            {"type": "constant", "lr": 0.0},
        ],
        "boundaries": [12],
    }


def test_arguments_are_normalised() -> None:
    assert MultiStepDecay(1, [5, 10]) == MultiStepDecay(1.0, (5, 10))
    assert MultiStepDecay(1, [5, 10]).milestones == (5, 10)
    assert Constant(np.float32(0.5)).to_dict() == {"type": "constant", "lr": 0.5}  # type: ignore[arg-type]
    assert type(Constant(1).lr) is float
    assert type(StepDecay(1.0, np.int64(3)).step_size) is int  # type: ignore[arg-type]
    json.dumps(CosineRestarts(np.float64(1.0), np.int64(3), np.int64(2)).to_dict())  # type: ignore[arg-type]


def test_schedules_are_immutable_and_hashable() -> None:
    schedule = Warmup(CosineDecay(1.0, 10), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.warmup_steps = 3  # type: ignore[misc]
    assert len({schedule, Warmup(CosineDecay(1.0, 10), 2)}) == 1


def test_import_pulls_in_no_framework() -> None:
    code = (
        "import sys, unitrain.schedules\n"
        "heavy = ('torch', 'jax', 'tensorflow', 'keras', 'optax')\n"
        "print(sorted(name for name in heavy if name in sys.modules))"
    )
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.stdout.strip() == "[]"


def test_a_bad_step_is_refused_naming_the_schedule() -> None:
    with pytest.raises(ConfigError, match=r"^CosineDecay: step must be a non-negative int"):
        CosineDecay(0.1, 10)(-1)
    with pytest.raises(ConfigError, match=r"^Warmup: step must be a non-negative int"):
        Warmup(Constant(0.1), 2)(1.5)
