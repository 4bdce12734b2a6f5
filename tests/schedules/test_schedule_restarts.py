"""CosineRestarts against exact arithmetic: where cycles start, and how fast the cycle is found."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from unitrain.schedules import CosineRestarts


def _half_cosine(fraction: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * fraction))


def _exact_value(first_period: int, mult: Fraction, step: int, lr_mult: float = 0.5) -> float:
    """Reference: walk the cycles in exact rational arithmetic (base_lr 1, min_lr 0)."""
    start, length, cycle = Fraction(0), Fraction(first_period), 0
    while start + length <= step:
        start, length, cycle = start + length, length * mult, cycle + 1
    return lr_mult**cycle * _half_cosine(float((step - start) / length))


def _assert_exact_around(schedule: CosineRestarts, exact_mult: Fraction, start: Fraction) -> None:
    """The step before a cycle start, the first step at or after it and the next one."""
    for step in range(max(math.ceil(start) - 1, 0), math.ceil(start) + 2):
        want = _exact_value(schedule.first_period, exact_mult, step)
        got = schedule(step)
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (schedule, step, got, want)


@pytest.mark.parametrize("mult", ["1.01", "1.05", "1.1", "1.2", "1.5", "2.5"])
def test_cycles_start_where_exact_arithmetic_says(mult: str) -> None:
    # Decimal growth factors put many cycle starts on whole steps (43 steps at 1.1: a second
    # cycle at 43; 5 steps at 1.2: a third at 11), where the float start formula lands an ulp
    # late. Around every start of the first six cycles, the step before ends the old cycle
    # and the start itself is a restart. Six cycles keep the exact starts' denominators
    # small (at most 100**4), so no true start is within rounding of a whole step without
    # being on it.
    exact_mult = Fraction(mult)
    for first_period in range(1, 61):
        schedule = CosineRestarts(1.0, first_period, float(mult), lr_mult=0.5)
        start, length = Fraction(0), Fraction(first_period)
        for _ in range(6):
            _assert_exact_around(schedule, exact_mult, start)
            start, length = start + length, length * exact_mult


@pytest.mark.parametrize(("mult", "first_period"), [("1.02", 2500), ("1.01", 10_000)])
def test_whole_step_starts_restart_when_growth_is_close_to_one(
    mult: str, first_period: int
) -> None:
    # Close to 1, mult**i - 1 cancels digits: the start formula's error grows with
    # first_period / (mult - 1), not with the start (7651 at mult 1.02 from 2500 comes out
    # 1.2e-11 late), and the slack must follow it.
    exact_mult = Fraction(mult)
    schedule = CosineRestarts(1.0, first_period, float(mult), lr_mult=0.5)
    start = first_period * (1 + exact_mult + exact_mult**2)  # the fourth cycle, a whole step
    assert start.denominator == 1
    _assert_exact_around(schedule, exact_mult, start)


# Last steps of a cycle where the log of the closed form rounds one cycle high, so that the
# downward correction is what finds the cycle (found by searching steps next to cycle starts).
LOG_ROUNDS_HIGH = [(1.5, 3, 5_654_013_826_208), (1.75, 2, 1_235_364_363_797)]


@pytest.mark.parametrize(("mult", "first_period", "step"), LOG_ROUNDS_HIGH)
def test_a_guess_one_cycle_high_is_corrected(mult: float, first_period: int, step: int) -> None:
    # lr_mult 1 so that the end of a cycle (0) and a restart (1) differ by the whole range.
    schedule = CosineRestarts(1.0, first_period, mult)
    for at, want in [(step, 0.0), (step + 1, 1.0)]:
        assert _exact_value(first_period, Fraction(mult), at, lr_mult=1.0) == want
        assert schedule(at) == want, (at, schedule(at))


def test_the_cycle_is_found_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cycle is found in O(1) for any step, as the code says: it comes from inverting the
    # series, and the start formula only confirms it. Walking the cycles instead gives the
    # same values but takes about 250,000 evaluations at mult 1.0001 and step 10**15.
    evaluations = 0
    cycle_start = CosineRestarts._cycle_start

    def counted(self: CosineRestarts, cycle: int) -> float:
        nonlocal evaluations
        evaluations += 1
        assert evaluations <= 8, f"{self!r} evaluated more than 8 cycle starts"
        return cycle_start(self, cycle)

    monkeypatch.setattr(CosineRestarts, "_cycle_start", counted)
    cases = [
        (CosineRestarts(1.0, first_period, mult), step)
        for mult in (1.0001, 1.1, 2.0, 3.7)
        for first_period in (1, 1000)
        for step in (0, 999, 10**6, 10**12, 10**15)
    ]
    cases += [(CosineRestarts(1.0, period, mult), step) for mult, period, step in LOG_ROUNDS_HIGH]
    for schedule, step in cases:
        evaluations = 0
        assert math.isfinite(schedule(step))
