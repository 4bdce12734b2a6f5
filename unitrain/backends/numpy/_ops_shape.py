"""The numpy reference's shape ops and gathers: ops that move elements without computing.

Their derivatives put each cotangent element back where its input element came from: reshapes
reshape it back, ``pad`` crops it, ``concat`` and ``split`` cut and join it, and the gathers
(``take``, ``take_along_axis``) add it at every position picked, repeats included. Basic
indexing (``x[...]``) is in :mod:`._ops_array`, beside the operator that calls it.
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unitrain.backends.numpy._ops_array import (
    getitem,
    normalize_axes,
    numpy_dtype,
    record,
    unary,
    unbroadcast,
    value_of,
)
from unitrain.ops import Array

# -- shapes ------------------------------------------------------------------------------------


def _reshaped(x: Array, forward: Callable[[Any], Any]) -> Array:
    """An op that only rearranges ``x``'s elements into a new shape, in the same order."""
    return unary(x, forward, lambda g, x, _: np.reshape(g, np.shape(x)))


def reshape(x: Array, shape: Sequence[int]) -> Array:
    return _reshaped(x, lambda x: np.reshape(x, tuple(shape)))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    ndim = len(np.shape(value_of(x)))
    order = tuple(range(ndim))[::-1] if axes is None else tuple(a % ndim for a in axes)
    inverse = tuple(np.argsort(order))
    return unary(x, lambda x: np.transpose(x, order), lambda g, *_: np.transpose(g, inverse))


def expand_dims(x: Array, axis: int) -> Array:
    return _reshaped(x, lambda x: np.expand_dims(x, axis))


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    return _reshaped(x, lambda x: np.squeeze(x, axis))


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    return unary(
        x,
        lambda x: np.broadcast_to(x, tuple(shape)),
        lambda g, x, _: unbroadcast(g, np.shape(x)),
    )


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    values = [value_of(a) for a in arrays]
    out = np.concatenate(values, axis=axis)
    ends = np.cumsum([np.shape(v)[axis] for v in values])[:-1]
    return record(out, tuple(arrays), lambda g: np.split(g, ends, axis=axis))


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    out = np.stack([value_of(a) for a in arrays], axis=axis)
    return record(out, tuple(arrays), lambda g: list(np.moveaxis(g, axis, 0)))


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    dims = np.shape(value_of(x))
    axis = normalize_axes(axis, len(dims))[0]
    if builtins.sum(sizes) != dims[axis]:
        raise ValueError(f"split sizes {list(sizes)} do not add up to axis {axis}'s {dims[axis]}")
    ends = np.cumsum([0, *sizes]).tolist()
    lead = (slice(None),) * axis
    return [getitem(x, (*lead, slice(a, b))) for a, b in itertools.pairwise(ends)]


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    xv = value_of(x)
    widths = [(int(before), int(after)) for before, after in widths]
    if len(widths) != np.ndim(xv):
        raise ValueError(f"pad takes one (before, after) pair per axis of {np.shape(xv)}")
    inside = tuple(slice(b, b + n) for (b, _), n in zip(widths, np.shape(xv)))
    return unary(x, lambda x: np.pad(x, widths, constant_values=value), lambda g, *_: g[inside])


# -- indexing ----------------------------------------------------------------------------------


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    xv, picks = value_of(x), np.asarray(value_of(indices))
    axis = normalize_axes(axis, xv.ndim)[0]
    picked = list(range(axis, axis + picks.ndim))

    def vjp(g: Any) -> tuple[Any, None]:
        grad = np.zeros(xv.shape, xv.dtype)
        # Along axis first, np.add.at adds every pick's row, repeats included.
        np.add.at(
            np.moveaxis(grad, axis, 0), picks, np.moveaxis(g, picked, list(range(picks.ndim)))
        )
        return grad, None

    return record(np.take(xv, picks, axis=axis), (x, indices), vjp)


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    xv, picks = value_of(x), np.asarray(value_of(indices))
    axis = normalize_axes(axis, xv.ndim)[0]
    out = np.take_along_axis(xv, picks, axis=axis)

    def vjp(g: Any) -> tuple[Any, None]:
        # put_along_axis would keep one of two picks of an element: add.at with the full
        # index grid adds them (an axis x has of length 1 was broadcast: all at 0).
        grid = []
        for d, n in enumerate(out.shape):
            if d == axis:
                grid.append(picks)
                continue
            along = np.arange(n) if xv.shape[d] == n else np.zeros(n, np.int64)
            grid.append(along.reshape([n if e == d else 1 for e in range(out.ndim)]))
        grad = np.zeros(xv.shape, xv.dtype)
        np.add.at(grad, tuple(grid), g)
        return grad, None

    return record(out, (x, indices), vjp)


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    picks = np.asarray(value_of(indices))
    return (picks[..., None] == np.arange(depth)).astype(numpy_dtype(dtype))
