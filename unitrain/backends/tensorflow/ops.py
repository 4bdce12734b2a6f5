"""The :mod:`unitrain.ops` contract in TensorFlow ops, for the adapter's ``tf.function`` s.

Each function is one or a few TensorFlow calls that trace into the graph (autograph off, a
batch axis of unknown size allowed): no host syncs, no numpy at run time, no global switch
flipped. The semantics are the contract's; what was checked against TensorFlow 2.21's CPU
kernels, and where an op is written here so that it agrees:

- ``reduce_max``/``reduce_min`` split the gradient among tied maxima, ``abs`` and ``relu``
  give 0 at 0, ``clip_by_value`` passes it at both bounds and ``pow``'s exponent gradient is
  zero where the base is not positive: TensorFlow's own derivatives are the contract's.
- ``tf.maximum``/``tf.minimum`` give all of a tie's gradient to ``x``: :func:`maximum` and
  :func:`minimum` split it evenly with a custom gradient.
- ``tf.nn.gelu`` casts its constants to the input's dtype from float32 (float64 results
  1e-9 off): :func:`gelu` is written out.
- Float32 matmuls and convolutions are float32 only while TensorFlow's process-wide TF32
  switch is off: the adapter sets it from ``matmul_precision`` (:mod:`.precision`,
  "highest" turns it off); the ops never touch it.

TensorFlow does not promote dtypes: ``float32 + float64`` is an error through the operators
as through these functions, so portable code combines arrays of one dtype (``ops.dtype(x)``
names it). The operators are TensorFlow's own, and ``@`` takes no 1-D operand there
(:func:`matmul` does).

The network ops (convolutions, pooling, attention; what they do where TensorFlow differs) are
in ``_ops_nn.py``, gathers and bitwise functions in ``_ops_int.py``, both imported here, so
that this module holds the whole contract.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from unitrain.backends.tensorflow._ops_int import (  # noqa: F401  (re-exported)
    bitwise_and,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    take,
    take_along_axis,
)
from unitrain.backends.tensorflow._ops_nn import (  # noqa: F401  (re-exported)
    avg_pool,
    conv,
    conv_transpose,
    linear,
    max_pool,
    scaled_dot_product_attention,
)
from unitrain.ops import CONTRACT
from unitrain.ops.composed import layer_norm_of
from unitrain.ops.loops import loop_scan_of

__all__ = [*CONTRACT, "to_numpy", "vjp"]
Array = Any
Axis = int | tuple[int, ...] | None

_LOW_PRECISION = (tf.float16, tf.bfloat16)
_SQRT_HALF = 0.7071067811865476
_SQRT_TWO_OVER_PI = 0.7978845608028654

# -- about arrays ------------------------------------------------------------------------------


def shape(x: Array) -> tuple[int, ...]:
    """``x``'s static shape; an axis unknown while tracing (a batch axis traced as ``None``)
    is its size as a scalar tensor, which reshapes, mask shapes and arithmetic take as they
    take an int (Python control flow on it cannot run in a graph)."""
    static = x.shape.as_list()
    if None not in static:
        return tuple(static)
    dynamic = tf.shape(x)
    return tuple(dynamic[i] if size is None else size for i, size in enumerate(static))


def dtype(x: Array) -> str:
    return tf.as_dtype(x.dtype).name


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    """A tensor from ``x``: tensors and numpy arrays keep their dtype when ``dtype`` is None;
    Python floats become float32 and Python ints int64 (``tf.constant`` would make int32)."""
    if tf.is_tensor(x):
        return x if dtype is None or x.dtype == dtype else tf.cast(x, dtype)
    if dtype is None and not isinstance(x, np.ndarray | np.generic):
        x = np.asarray(x)
        dtype = {"f": "float32", "i": "int64", "u": "int64"}.get(x.dtype.kind)
    if dtype is not None:  # cast on the host: one transfer, rounded once
        x = np.asarray(x, tf.as_dtype(dtype).as_numpy_dtype)
    return tf.convert_to_tensor(x)


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    return tf.zeros(shape, dtype)


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    return tf.ones(shape, dtype)


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    return tf.fill(shape, tf.constant(value, dtype))


def zeros_like(x: Array) -> Array:
    return tf.zeros_like(x)


def ones_like(x: Array) -> Array:
    return tf.ones_like(x)


def arange(n: int, dtype: str = "int64") -> Array:
    return tf.range(n, dtype=dtype)


def cast(x: Array, dtype: str) -> Array:
    """``tf.cast``, whose gradient reaches float inputs only."""
    return tf.cast(x, dtype)


# -- elementwise -------------------------------------------------------------------------------


def _operands(x: Any, y: Any) -> tuple[Array, Array]:
    """``x`` and ``y`` as tensors, a Python number taking the other operand's dtype.

    TensorFlow converts a number in the first position before it sees the second operand's
    dtype (``2.0 + float64`` would be float32 + float64), so the number is converted here."""
    if not tf.is_tensor(x):
        x = tf.convert_to_tensor(x, y.dtype if tf.is_tensor(y) else None)
    if not tf.is_tensor(y):
        y = tf.convert_to_tensor(y, x.dtype)
    return x, y


def add(x: Array, y: Array) -> Array:
    return tf.math.add(*_operands(x, y))


def subtract(x: Array, y: Array) -> Array:
    return tf.math.subtract(*_operands(x, y))


def multiply(x: Array, y: Array) -> Array:
    return tf.math.multiply(*_operands(x, y))


def divide(x: Array, y: Array) -> Array:
    return tf.math.truediv(*_operands(x, y))


def power(x: Array, y: Array) -> Array:
    """``tf.pow``, whose gradient with respect to ``y`` is masked to ``x > 0`` already."""
    return tf.math.pow(*_operands(x, y))


def _reduce_to(gradient: Array, target: Array, axes: Array) -> Array:
    return tf.reshape(tf.reduce_sum(gradient, axes), tf.shape(target))


def _tie_split(select: Callable[..., Array], wins: Callable[..., Array]) -> Callable[..., Array]:
    """An elementwise ``select`` (``tf.maximum``) whose gradient goes to the operand that
    ``wins``, half to each at a tie."""

    @tf.custom_gradient
    def split(x: Array, y: Array) -> tuple[Array, Callable[[Array], tuple[Array, Array]]]:
        def gradient(upstream: Array) -> tuple[Array, Array]:
            tied = tf.where(tf.equal(x, y), 0.5 * upstream, tf.zeros_like(upstream))
            to_x = tf.where(wins(x, y), upstream, tied)
            x_axes, y_axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x), s1=tf.shape(y))
            return _reduce_to(to_x, x, x_axes), _reduce_to(upstream - to_x, y, y_axes)

        return select(x, y), gradient

    return split


_maximum = _tie_split(tf.math.maximum, tf.math.greater)
_minimum = _tie_split(tf.math.minimum, tf.math.less)


def maximum(x: Array, y: Array) -> Array:
    """``tf.maximum`` with a tie's gradient split evenly (TensorFlow's goes all to ``x``)."""
    return _maximum(*_operands(x, y))


def minimum(x: Array, y: Array) -> Array:
    """``tf.minimum`` with a tie's gradient split evenly (TensorFlow's goes all to ``x``)."""
    return _minimum(*_operands(x, y))


def where(condition: Array, x: Array, y: Array) -> Array:
    return tf.where(condition, *_operands(x, y))


def clip(x: Array, low: float, high: float) -> Array:
    """``tf.clip_by_value``, whose gradient passes at both bounds (``low <= x <= high``)."""
    return tf.clip_by_value(x, low, high)


def negative(x: Array) -> Array:
    return tf.math.negative(x)


def abs(x: Array) -> Array:
    return tf.math.abs(x)


def sign(x: Array) -> Array:
    return tf.math.sign(x)


def exp(x: Array) -> Array:
    return tf.math.exp(x)


def expm1(x: Array) -> Array:
    return tf.math.expm1(x)


def log(x: Array) -> Array:
    return tf.math.log(x)


def log1p(x: Array) -> Array:
    return tf.math.log1p(x)


def sqrt(x: Array) -> Array:
    return tf.math.sqrt(x)


def rsqrt(x: Array) -> Array:
    return tf.math.rsqrt(x)


def square(x: Array) -> Array:
    return tf.math.square(x)


def sin(x: Array) -> Array:
    return tf.math.sin(x)


def cos(x: Array) -> Array:
    return tf.math.cos(x)


def tanh(x: Array) -> Array:
    return tf.math.tanh(x)


def erf(x: Array) -> Array:
    return tf.math.erf(x)


def sigmoid(x: Array) -> Array:
    return tf.math.sigmoid(x)


def relu(x: Array) -> Array:
    return tf.nn.relu(x)


def gelu(x: Array, approximate: bool = False) -> Array:
    """The GELU written out: ``tf.nn.gelu`` casts its constants to the input's dtype from
    float32, which leaves float64 results about 1e-9 off."""
    if approximate:
        inner = _SQRT_TWO_OVER_PI * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + tf.math.tanh(inner))
    return 0.5 * x * tf.math.erfc(-_SQRT_HALF * x)  # erfc: no cancellation for x << 0


def silu(x: Array) -> Array:
    return tf.nn.silu(x)


def softplus(x: Array) -> Array:
    return tf.math.softplus(x)


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    return tf.math.equal(*_operands(x, y))


def less(x: Array, y: Array) -> Array:
    return tf.math.less(*_operands(x, y))


def greater(x: Array, y: Array) -> Array:
    return tf.math.greater(*_operands(x, y))


def logical_and(x: Array, y: Array) -> Array:
    return tf.math.logical_and(x, y)


def logical_not(x: Array) -> Array:
    return tf.math.logical_not(x)


def isfinite(x: Array) -> Array:
    return tf.math.is_finite(x)


# -- reductions --------------------------------------------------------------------------------


def _axes(axis: Axis) -> int | list[int] | None:
    return list(axis) if isinstance(axis, tuple) else axis


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return tf.math.reduce_sum(x, _axes(axis), keepdims)


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return tf.math.reduce_mean(x, _axes(axis), keepdims)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """``tf.reduce_max``, whose gradient is split evenly among tied maxima."""
    return tf.math.reduce_max(x, _axes(axis), keepdims)


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """``tf.reduce_min``, whose gradient is split evenly among tied minima."""
    return tf.math.reduce_min(x, _axes(axis), keepdims)


def argmax(x: Array, axis: int = -1) -> Array:
    return tf.math.argmax(x, axis, output_type=tf.int64)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    """Mean and the mean squared deviation from it, float16 and bfloat16 in float32.

    TensorFlow's CPU ``reduce_mean`` adds in float32 with an error that grows with the count
    (``tf.nn.moments`` too): over a 32x8x8 batch whose channel mean is 10 its mean is off by
    4e-5 of the channel's spread, which moved a ResNet 1e-3 away from the reference within
    ten updates. The mean of the residuals ``x - mean`` corrects it (those are small, so their
    sum's error is too); the variance is then taken around the corrected mean. Unlike
    ``tf.nn.moments`` the mean is not cut off from the gradient (its contribution is zero only
    in exact arithmetic), and bfloat16 is upcast too."""
    values = tf.cast(x, tf.float32) if x.dtype in _LOW_PRECISION else x
    axes = _axes(axis)
    center = tf.math.reduce_mean(values, axes, keepdims=True)
    center += tf.math.reduce_mean(values - center, axes, keepdims=True)
    variance = tf.math.reduce_mean(tf.math.square(values - center), axes, keepdims)
    if not keepdims:
        center = tf.squeeze(center, axes)
    return tf.cast(center, x.dtype), tf.cast(variance, x.dtype)


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    """``tf.reduce_logsumexp``: shifted by the (gradient-stopped) maximum."""
    return tf.math.reduce_logsumexp(x, _axes(axis), keepdims)


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    """``tf.linalg.matmul`` with numpy's 1-D rule (a vector is a row on the left, a column on
    the right, its axis dropped from the result), which TensorFlow's op lacks."""
    vector_x, vector_y = x.shape.rank == 1, y.shape.rank == 1
    out = tf.linalg.matmul(x[None] if vector_x else x, y[:, None] if vector_y else y)
    if vector_y:
        out = out[..., 0]
    return tf.squeeze(out, -1 if vector_y else -2) if vector_x else out


def einsum(subscripts: str, *operands: Array) -> Array:
    return tf.einsum(subscripts, *operands)


# -- shapes ------------------------------------------------------------------------------------


def reshape(x: Array, shape: Sequence[int]) -> Array:
    return tf.reshape(x, shape)


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    return tf.transpose(x, axes)


def expand_dims(x: Array, axis: int) -> Array:
    return tf.expand_dims(x, axis)


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    return tf.squeeze(x, _axes(axis))


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    return tf.broadcast_to(x, shape)


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    return tf.concat(list(arrays), axis)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    return tf.stack(list(arrays), axis)


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    return tf.split(x, list(sizes), axis)


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    return tf.pad(x, [list(pair) for pair in widths], constant_values=value)


# -- indexing ----------------------------------------------------------------------------------


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    return tf.one_hot(indices, depth, dtype=dtype)


# -- networks ----------------------------------------------------------------------------------


def softmax(x: Array, axis: int = -1) -> Array:
    return tf.nn.softmax(x, axis)


def log_softmax(x: Array, axis: int = -1) -> Array:
    return tf.nn.log_softmax(x, axis)


# conv, conv_transpose, max_pool, avg_pool and scaled_dot_product_attention: _ops_nn.py.


def stop_gradient(x: Array) -> Array:
    return tf.stop_gradient(x)


# -- the conformance kit's hooks ---------------------------------------------------------------


def to_numpy(x: Array) -> np.ndarray:
    """``x`` on the host; bfloat16 comes back as float32 (numpy has no bfloat16)."""
    if tf.is_tensor(x):
        return (tf.cast(x, tf.float32) if x.dtype == tf.bfloat16 else x).numpy()
    return np.asarray(x)


def vjp(
    fn: Callable[..., Any], arrays: Sequence[Array], wrt: Sequence[int]
) -> tuple[list[Array], Callable[[Sequence[Array]], list[Array]]]:
    """``fn(*arrays)`` on a ``tf.GradientTape`` watching ``arrays[i]`` for ``i`` in ``wrt``,
    and the pullback: a gradient per watched input, dense (a gather's ``IndexedSlices`` is
    summed into a tensor) and zeros where nothing depends on it."""
    sources = [arrays[i] for i in wrt]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(sources)
        result = fn(*arrays)
    outputs = list(result) if isinstance(result, tuple | list) else [result]

    def pullback(cotangents: Sequence[Array]) -> list[Array]:
        grads = tape.gradient(
            outputs,
            sources,
            output_gradients=list(cotangents),
            unconnected_gradients=tf.UnconnectedGradients.ZERO,
        )
        return [tf.convert_to_tensor(g) for g in grads]

    return outputs, pullback


#: The contract's loop over this module's own ops (see unitrain.ops.loops).
scan = loop_scan_of(sys.modules[__name__])
layer_norm = layer_norm_of(sys.modules[__name__])
