"""The op contract where integer arrays are the operands: gathers by index, and the bitwise
functions :mod:`unitrain.ops.random` is written in. ``tf.bitwise.right_shift`` is arithmetic
on signed integers and ``left_shift`` drops the bits shifted out, as the contract says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from unitrain.ops import Array


def _tensors(x: Any, y: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """A Python int beside a tensor becomes a tensor of its dtype."""
    if not tf.is_tensor(x):
        x = tf.convert_to_tensor(x, y.dtype)
    if not tf.is_tensor(y):
        y = tf.convert_to_tensor(y, x.dtype)
    return x, y


def _binary(function: Callable[..., tf.Tensor]) -> Callable[[Array, Array], Array]:
    def op(x: Array, y: Array) -> Array:
        return function(*_tensors(x, y))

    return op


bitwise_and = _binary(tf.bitwise.bitwise_and)
bitwise_or = _binary(tf.bitwise.bitwise_or)
bitwise_xor = _binary(tf.bitwise.bitwise_xor)
bitwise_left_shift = _binary(tf.bitwise.left_shift)
bitwise_right_shift = _binary(tf.bitwise.right_shift)


# -- gathers by index -------------------------------------------------------------------------


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    """``tf.gather``; its gradient is an ``IndexedSlices`` that sums repeated indices when
    densified (``vjp`` does)."""
    return tf.gather(x, indices, axis=axis)


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    """A gather along the last axis with every other axis a batch axis (``axis`` is moved
    last and back; the other axes broadcast, as in numpy)."""
    rank = x.shape.rank
    axis %= rank
    if axis != rank - 1:
        order = [*range(axis), *range(axis + 1, rank), axis]
        picked = take_along_axis(tf.transpose(x, order), tf.transpose(indices, order), -1)
        return tf.transpose(picked, np.argsort(order).tolist())
    if x.shape[:-1] != indices.shape[:-1] or not x.shape[:-1].is_fully_defined():
        batch = tf.broadcast_dynamic_shape(tf.shape(x)[:-1], tf.shape(indices)[:-1])
        x = tf.broadcast_to(x, tf.concat([batch, tf.shape(x)[-1:]], 0))
        indices = tf.broadcast_to(indices, tf.concat([batch, tf.shape(indices)[-1:]], 0))
    return tf.gather(x, indices, axis=rank - 1, batch_dims=rank - 1)
