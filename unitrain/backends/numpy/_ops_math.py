"""The numpy reference's elementwise functions and comparisons, with their derivatives.

The arithmetic behind the operators (``add`` to ``power``, ``negative``) is in
:mod:`._ops_array`, beside the tracked array whose operators call it; the error function's
float64 evaluation is in :mod:`._special`. Ties of ``maximum``/``minimum`` split the gradient
evenly; ``relu`` and ``abs`` have gradient 0 at 0; ``clip`` passes it where
``low <= x <= high``. Comparisons return plain boolean arrays, never tracked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unitrain.backends.numpy import _special
from unitrain.backends.numpy._ops_array import (
    Tracked,
    binary,
    is_float,
    record,
    unary,
    unbroadcast,
    value_of,
)
from unitrain.ops import Array

# -- elementwise -------------------------------------------------------------------------------


def _first_wins(g: Any, x: Any, y: Any) -> Any:
    """``g`` where ``x`` beats ``y``, half of it at a tie, zero where it loses."""
    return np.where(np.greater(x, y), g, np.where(np.equal(x, y), 0.5 * g, 0))


def maximum(x: Array, y: Array) -> Array:
    return binary(
        x,
        y,
        np.maximum,
        lambda g, x, y, _: _first_wins(g, x, y),
        lambda g, x, y, _: _first_wins(g, y, x),
    )


def minimum(x: Array, y: Array) -> Array:
    return binary(
        x,
        y,
        np.minimum,
        lambda g, x, y, _: _first_wins(g, y, x),
        lambda g, x, y, _: _first_wins(g, x, y),
    )


def where(condition: Array, x: Array, y: Array) -> Array:
    picks = np.asarray(value_of(condition), dtype=bool)
    xv, yv = value_of(x), value_of(y)

    def vjp(g: Any) -> tuple[None, Any, Any]:
        return (
            None,
            unbroadcast(np.where(picks, g, 0), np.shape(xv)) if isinstance(x, Tracked) else None,
            unbroadcast(np.where(picks, 0, g), np.shape(yv)) if isinstance(y, Tracked) else None,
        )

    return record(np.where(picks, xv, yv), (condition, x, y), vjp)


def clip(x: Array, low: float, high: float) -> Array:
    return unary(
        x,
        lambda x: np.clip(x, low, high),
        lambda g, x, _: np.where((x >= low) & (x <= high), g, 0),
    )


def abs(x: Array) -> Array:
    return unary(x, np.abs, lambda g, x, _: g * np.sign(x))


def sign(x: Array) -> Array:
    return np.sign(value_of(x))


def exp(x: Array) -> Array:
    return unary(x, np.exp, lambda g, _, out: g * out)


def expm1(x: Array) -> Array:
    return unary(x, np.expm1, lambda g, _, out: g * (out + 1))


def log(x: Array) -> Array:
    return unary(x, np.log, lambda g, x, _: g / x)


def log1p(x: Array) -> Array:
    return unary(x, np.log1p, lambda g, x, _: g / (x + 1))


def sqrt(x: Array) -> Array:
    return unary(x, np.sqrt, lambda g, _, out: 0.5 * g / out)


def rsqrt(x: Array) -> Array:
    return unary(x, lambda x: 1 / np.sqrt(x), lambda g, x, out: -0.5 * g * out / x)


def square(x: Array) -> Array:
    return unary(x, np.square, lambda g, x, _: 2 * g * x)


def sin(x: Array) -> Array:
    return unary(x, np.sin, lambda g, x, _: g * np.cos(x))


def cos(x: Array) -> Array:
    return unary(x, np.cos, lambda g, x, _: -g * np.sin(x))


def tanh(x: Array) -> Array:
    return unary(x, np.tanh, lambda g, _, out: g * (1 - out * out))


def _float_dtype(x: Any) -> np.dtype:
    """The dtype a transcendental function of ``x`` returns: ``x``'s, float64 for integers."""
    found = np.asarray(x).dtype
    return found if is_float(found) else np.dtype(np.float64)


def _erf(x: Any) -> Any:
    return _special.erf_and_erfc(x)[0].astype(_float_dtype(x))


def _normal_cdf(x: Any) -> Any:
    """``Phi(x) = erfc(-x / sqrt(2)) / 2``: accurate far into the lower tail."""
    return (0.5 * _special.erf_and_erfc(-np.asarray(x) / math.sqrt(2.0))[1]).astype(_float_dtype(x))


def erf(x: Array) -> Array:
    return unary(x, _erf, lambda g, x, _: g * _special.TWO_OVER_SQRT_PI * np.exp(-x * x))


def _sigmoid(x: Any) -> Any:
    small = np.exp(-np.abs(x))  # never overflows; the two branches are the same function
    return np.where(np.greater_equal(x, 0), 1 / (1 + small), small / (1 + small))


def _sigmoid_derivative(x: Any) -> Any:
    small = np.exp(-np.abs(x))  # s (1 - s), without 1 - s rounding to 0 for large x
    return small / ((1 + small) * (1 + small))


def sigmoid(x: Array) -> Array:
    return unary(x, _sigmoid, lambda g, x, _: g * _sigmoid_derivative(x))


def relu(x: Array) -> Array:
    return unary(x, lambda x: np.maximum(x, 0), lambda g, x, _: np.where(x > 0, g, 0))


_GELU_C, _GELU_CUBIC = math.sqrt(2 / math.pi), 0.044715


def _gelu_tanh(x: Any) -> Any:
    return 0.5 * x * (1 + np.tanh(_GELU_C * (x + _GELU_CUBIC * x**3)))


def _gelu_tanh_derivative(x: Any) -> Any:
    t = np.tanh(_GELU_C * (x + _GELU_CUBIC * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_CUBIC * x * x)


def gelu(x: Array, approximate: bool = False) -> Array:
    if approximate:
        return unary(x, _gelu_tanh, lambda g, x, _: g * _gelu_tanh_derivative(x))
    return unary(
        x,
        lambda x: x * _normal_cdf(x),
        lambda g, x, _: g * (_normal_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
    )


def silu(x: Array) -> Array:
    def derivative(g: Any, x: Any, _: Any) -> Any:
        s = _sigmoid(x)
        return g * s * (1 + x * (1 - s))

    return unary(x, lambda x: x * _sigmoid(x), derivative)


def softplus(x: Array) -> Array:
    return unary(
        x,
        lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
        lambda g, x, _: g * _sigmoid(x),
    )


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    return np.equal(value_of(x), value_of(y))


def less(x: Array, y: Array) -> Array:
    return np.less(value_of(x), value_of(y))


def greater(x: Array, y: Array) -> Array:
    return np.greater(value_of(x), value_of(y))


def logical_and(x: Array, y: Array) -> Array:
    return np.logical_and(value_of(x), value_of(y))


def logical_not(x: Array) -> Array:
    return np.logical_not(value_of(x))


def isfinite(x: Array) -> Array:
    return np.isfinite(value_of(x))


# -- integer bits (no gradient) ----------------------------------------------------------------


def bitwise_and(x: Array, y: Array) -> Array:
    return np.bitwise_and(value_of(x), value_of(y))


def bitwise_or(x: Array, y: Array) -> Array:
    return np.bitwise_or(value_of(x), value_of(y))


def bitwise_xor(x: Array, y: Array) -> Array:
    return np.bitwise_xor(value_of(x), value_of(y))


def bitwise_left_shift(x: Array, y: Array) -> Array:
    return np.left_shift(value_of(x), value_of(y))


def bitwise_right_shift(x: Array, y: Array) -> Array:
    return np.right_shift(value_of(x), value_of(y))
