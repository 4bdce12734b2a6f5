"""The op contract where integer arrays are the operands: gathers by index, and the bitwise
functions :mod:`unitrain.ops.random` is written in. ``jnp.right_shift`` is arithmetic on
signed integers and XLA's integer arithmetic wraps, as the contract says."""

from __future__ import annotations

import jax.numpy as jnp

from unitrain.ops import Array


def bitwise_and(x: Array, y: Array) -> Array:
    return jnp.bitwise_and(x, y)


def bitwise_or(x: Array, y: Array) -> Array:
    return jnp.bitwise_or(x, y)


def bitwise_xor(x: Array, y: Array) -> Array:
    return jnp.bitwise_xor(x, y)


def bitwise_left_shift(x: Array, y: Array) -> Array:
    return jnp.left_shift(x, y)


def bitwise_right_shift(x: Array, y: Array) -> Array:
    return jnp.right_shift(x, y)


# -- gathers by index -------------------------------------------------------------------------


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    return jnp.take(x, indices, axis)  # mode "fill": NaN out of range; repeats add gradients


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    return jnp.take_along_axis(x, indices, axis)
