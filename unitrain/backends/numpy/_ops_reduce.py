"""The numpy reference's reductions, and the normalizations over an axis built like them.

Sums, means and extremes over axes; ``moments``; ``logsumexp`` and the softmaxes, which reduce
an axis to normalize along it. Ties of ``max``/``min`` split the gradient evenly among the tied
entries. ``masked_softmax`` serves attention (:mod:`._ops_nn`) and shares softmax's derivative.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain.backends.numpy._ops_array import normalize_axes, record, subtract, unary, value_of
from unitrain.backends.numpy._ops_math import square
from unitrain.backends.numpy._ops_shape import squeeze
from unitrain.ops import Array, Axis

# -- reductions --------------------------------------------------------------------------------


def _spread(g: Any, axes: tuple[int, ...], keepdims: bool, shape: tuple[int, ...]) -> Any:
    """A reduction's cotangent broadcast back over the reduced axes."""
    return np.broadcast_to(g if keepdims else np.expand_dims(g, axes), shape)


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    xv = np.asarray(value_of(x))
    axes = normalize_axes(axis, xv.ndim)
    return unary(
        x,
        lambda x: np.sum(x, axis=axes, keepdims=keepdims),
        lambda g, x, _: _spread(g, axes, keepdims, x.shape),
    )


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    xv = np.asarray(value_of(x))
    axes = normalize_axes(axis, xv.ndim)
    count = math.prod(xv.shape[a] for a in axes)
    return unary(
        x,
        lambda x: np.mean(x, axis=axes, keepdims=keepdims),
        lambda g, x, _: _spread(g / count, axes, keepdims, x.shape),
    )


def _extreme(x: Array, axis: Axis, keepdims: bool, reduce: Callable) -> Array:
    xv = np.asarray(value_of(x))
    axes = normalize_axes(axis, xv.ndim)

    def derivative(g: Any, x: Any, out: Any) -> Any:
        winners = x == _spread(out, axes, keepdims, x.shape)
        count = np.sum(winners, axis=axes, keepdims=True, dtype=g.dtype)
        return np.where(winners, _spread(g, axes, keepdims, x.shape) / count, 0)

    return unary(x, lambda x: reduce(x, axis=axes, keepdims=keepdims), derivative)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return _extreme(x, axis, keepdims, np.max)


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return _extreme(x, axis, keepdims, np.min)


def argmax(x: Array, axis: int = -1) -> Array:
    return np.argmax(value_of(x), axis=axis).astype(np.int64)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    # Two passes from tracked ops: the variance's gradient 2 (x - mean) / n comes out of the
    # chain rule, and the deviations are what keeps large offsets exact.
    axes = normalize_axes(axis, np.ndim(value_of(x)))
    centre = mean(x, axes, keepdims=True)
    variance = mean(square(subtract(x, centre)), axes, keepdims)
    return (centre if keepdims else squeeze(centre, axes)), variance


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    xv = np.asarray(value_of(x))
    axes = normalize_axes(axis, xv.ndim)
    shift = np.max(xv, axis=axes, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0)
    with np.errstate(divide="ignore"):  # all -inf: log(0) = -inf is the answer
        kept = np.log(np.sum(np.exp(xv - shift), axis=axes, keepdims=True)) + shift
    out = kept if keepdims else np.squeeze(kept, axes)
    return record(out, (x,), lambda g: (_spread(g, axes, keepdims, xv.shape) * np.exp(xv - kept),))


# -- normalizations ----------------------------------------------------------------------------


def _softmax_vjp(g: Any, probabilities: Any, axis: int) -> Any:
    return probabilities * (g - np.sum(g * probabilities, axis=axis, keepdims=True))


def softmax(x: Array, axis: int = -1) -> Array:
    def forward(x: Any) -> Any:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    return unary(x, forward, lambda g, _, out: _softmax_vjp(g, out, axis))


def log_softmax(x: Array, axis: int = -1) -> Array:
    return unary(
        x,
        lambda x: x - logsumexp(x, axis, keepdims=True),
        lambda g, _, out: g - np.exp(out) * np.sum(g, axis=axis, keepdims=True),
    )


def masked_softmax(x: Array, keep: np.ndarray) -> Array:
    """Softmax over the last axis of the kept entries; dropped ones and rows that keep nothing
    are 0 (so is their gradient)."""

    def forward(x: Any) -> Any:
        kept = np.broadcast_to(keep, x.shape)
        shift = np.max(np.where(kept, x, -np.inf), axis=-1, keepdims=True)
        shift = np.where(np.isfinite(shift), shift, 0)
        e = np.exp(np.where(kept, x - shift, -np.inf))
        total = np.sum(e, axis=-1, keepdims=True)
        return e / np.where(total > 0, total, 1)

    return unary(x, forward, lambda g, _, out: _softmax_vjp(g, out, -1))
