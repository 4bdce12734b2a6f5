"""``unitrain.ops``: the contract portable computations are written in, once for every backend.

A layer's forward, a loss or an update rule written with these functions (and the array operators
``+ - * / ** @``, unary ``-`` and basic indexing with ints, slices, ``None`` and ``...``; both
operands of an operator in one dtype, and ``@`` on matrices or batches of them: TensorFlow's
operators neither promote dtypes nor take a vector, :func:`matmul` does) runs natively on every
backend: each backend implements the contract once, in its own ``ops`` module
(``unitrain/backends/<name>/ops.py``), and the calls here go to the module of the backend running
the code (:func:`using`). Gradients come from each framework's autodiff; the numpy reference
computes them in float64 with derivatives of its own, which is what makes it an independent oracle
for any layer.

Names follow the Python array API standard where it has the operation; what it lacks and
networks need (convolution, pooling, softmax, attention, ``stop_gradient``, accurate moments)
is added with the semantics written down here, where frameworks disagree. Conventions:

- dtypes are strings: ``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``,
  ``"int32"``, ``"int64"``, ``"bool"``;
- ``axis`` is an int or a tuple of ints, negative counting from the end; ``None`` means all;
- images are channels-last, ``(N, *spatial, C)``; kernels ``(*window, C_in / groups, C_out)``
  (``(*window, C_out, C_in)`` is torch's layout; the adapters convert);
- the binary elementwise functions and comparisons take a Python number for either operand;
- comparisons, ``argmax``, the bitwise functions and casts to integer dtypes carry no
  gradient; integer ``add``/``subtract``/``multiply`` wrap around on overflow;
- random numbers come from explicit keys through :mod:`unitrain.ops.random`, written once in
  these ops, so every backend draws the same bits.

Every name in :data:`CONTRACT` is a function here and in each backend's ops module, with the
same parameters; ``tests/ops/test_ops_contract.py`` checks it.

Examples:
    >>> import numpy as np
    >>> from unitrain import ops
    >>> with ops.using("numpy"):
    ...     print(ops.softmax(np.array([0.0, 0.0])))
    [0.5 0.5]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unitrain.ops._dispatch import active, current, enter, leave, using
from unitrain.ops._types import Array, Axis, Pairish  # noqa: F401 - the backends' signatures

# -- about arrays ------------------------------------------------------------------------------


def shape(x: Array) -> tuple[int, ...]:
    """``x``'s shape as a tuple of Python ints."""
    return current().shape(x)


def dtype(x: Array) -> str:
    """``x``'s dtype as a string (``"float32"``, ...)."""
    return current().dtype(x)


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    """An array of the running backend from ``x`` (an array, a numpy array, nested lists or a
    number); ``dtype`` None keeps a floating array's dtype and makes Python floats float32."""
    return current().asarray(x, dtype)


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    """An array of zeros."""
    return current().zeros(shape, dtype)


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    """An array of ones."""
    return current().ones(shape, dtype)


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    """An array filled with ``value``."""
    return current().full(shape, value, dtype)


def zeros_like(x: Array) -> Array:
    """Zeros of ``x``'s shape and dtype."""
    return current().zeros_like(x)


def ones_like(x: Array) -> Array:
    """Ones of ``x``'s shape and dtype."""
    return current().ones_like(x)


def arange(n: int, dtype: str = "int64") -> Array:
    """``0, 1, ..., n - 1``."""
    return current().arange(n, dtype)


def cast(x: Array, dtype: str) -> Array:
    """``x`` in ``dtype``; the gradient flows back through float-to-float casts only."""
    return current().cast(x, dtype)


# -- elementwise -------------------------------------------------------------------------------


def add(x: Array, y: Array) -> Array:
    """``x + y`` with broadcasting."""
    return current().add(x, y)


def subtract(x: Array, y: Array) -> Array:
    """``x - y`` with broadcasting."""
    return current().subtract(x, y)


def multiply(x: Array, y: Array) -> Array:
    """``x * y`` with broadcasting."""
    return current().multiply(x, y)


def divide(x: Array, y: Array) -> Array:
    """``x / y`` with broadcasting (true division)."""
    return current().divide(x, y)


def power(x: Array, y: Array) -> Array:
    """``x ** y``; the gradient with respect to ``y`` uses ``log(x)`` and is taken only where
    ``x > 0`` (zero elsewhere), as torch and JAX do for a positive base."""
    return current().power(x, y)


def maximum(x: Array, y: Array) -> Array:
    """Elementwise maximum; at a tie the gradient is split evenly (as JAX and TensorFlow do;
    torch's ``maximum`` does the same)."""
    return current().maximum(x, y)


def minimum(x: Array, y: Array) -> Array:
    """Elementwise minimum; at a tie the gradient is split evenly."""
    return current().minimum(x, y)


def where(condition: Array, x: Array, y: Array) -> Array:
    """``x`` where ``condition`` holds, else ``y``; each gets the gradient of its picks."""
    return current().where(condition, x, y)


def clip(x: Array, low: float, high: float) -> Array:
    """``x`` limited to ``[low, high]``; the gradient passes where ``low <= x <= high``."""
    return current().clip(x, low, high)


def negative(x: Array) -> Array:
    """``-x``."""
    return current().negative(x)


def abs(x: Array) -> Array:
    """``|x|``; the gradient at 0 is 0."""
    return current().abs(x)


def sign(x: Array) -> Array:
    """-1, 0 or 1; no gradient (zero)."""
    return current().sign(x)


def exp(x: Array) -> Array:
    """``e ** x``."""
    return current().exp(x)


def expm1(x: Array) -> Array:
    """``e ** x - 1``, accurate near 0."""
    return current().expm1(x)


def log(x: Array) -> Array:
    """Natural logarithm."""
    return current().log(x)


def log1p(x: Array) -> Array:
    """``log(1 + x)``, accurate near 0."""
    return current().log1p(x)


def sqrt(x: Array) -> Array:
    """Square root."""
    return current().sqrt(x)


def rsqrt(x: Array) -> Array:
    """``1 / sqrt(x)``."""
    return current().rsqrt(x)


def square(x: Array) -> Array:
    """``x * x``."""
    return current().square(x)


def sin(x: Array) -> Array:
    """Sine."""
    return current().sin(x)


def cos(x: Array) -> Array:
    """Cosine."""
    return current().cos(x)


def tanh(x: Array) -> Array:
    """Hyperbolic tangent."""
    return current().tanh(x)


def erf(x: Array) -> Array:
    """The error function."""
    return current().erf(x)


def sigmoid(x: Array) -> Array:
    """``1 / (1 + e ** -x)``, without overflow for large ``|x|``."""
    return current().sigmoid(x)


def relu(x: Array) -> Array:
    """``max(x, 0)``; the gradient at 0 is 0."""
    return current().relu(x)


def gelu(x: Array, approximate: bool = False) -> Array:
    """``x * Phi(x)`` with the exact normal CDF, or its tanh approximation."""
    return current().gelu(x, approximate)


def silu(x: Array) -> Array:
    """``x * sigmoid(x)``."""
    return current().silu(x)


def softplus(x: Array) -> Array:
    """``log(1 + e ** x)``, without overflow."""
    return current().softplus(x)


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    """``x == y`` as bools."""
    return current().equal(x, y)


def less(x: Array, y: Array) -> Array:
    """``x < y`` as bools."""
    return current().less(x, y)


def greater(x: Array, y: Array) -> Array:
    """``x > y`` as bools."""
    return current().greater(x, y)


def logical_and(x: Array, y: Array) -> Array:
    """Both true."""
    return current().logical_and(x, y)


def logical_not(x: Array) -> Array:
    """Not true."""
    return current().logical_not(x)


def isfinite(x: Array) -> Array:
    """Neither inf nor NaN."""
    return current().isfinite(x)


# -- reductions --------------------------------------------------------------------------------


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """Sum over ``axis``."""
    return current().sum(x, axis, keepdims)


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """Mean over ``axis``."""
    return current().mean(x, axis, keepdims)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """Maximum over ``axis``; the gradient is split evenly among tied maxima."""
    return current().max(x, axis, keepdims)


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    """Minimum over ``axis``; the gradient is split evenly among tied minima."""
    return current().min(x, axis, keepdims)


def argmax(x: Array, axis: int = -1) -> Array:
    """Index of the first maximum along ``axis`` (int64); no gradient."""
    return current().argmax(x, axis)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    """``(mean, variance)`` over ``axis``: the population variance (divided by the count),
    computed from the deviations from the mean, so large offsets lose no precision (a
    one-pass ``E[x^2] - E[x]^2`` in float16 or bfloat16 can be negative)."""
    return current().moments(x, axis, keepdims)


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    """``log(sum(exp(x)))`` over ``axis``, shifted by the maximum so it cannot overflow."""
    return current().logsumexp(x, axis, keepdims)


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    """Matrix product over the last two axes, batch axes broadcast (``x @ y``); a 1-D
    operand is a vector, as in numpy. Float32 products are computed in float32 on every
    backend (no TF32, JAX's HIGHEST precision)."""
    return current().matmul(x, y)


def einsum(subscripts: str, *operands: Array) -> Array:
    """Einstein summation with explicit output (``"bij,bjk->bik"``); each operand's letters
    are distinct (no diagonals) and there is no ``...``."""
    return current().einsum(subscripts, *operands)


# -- shapes ------------------------------------------------------------------------------------


def reshape(x: Array, shape: Sequence[int]) -> Array:
    """``x`` with a new shape of the same size; one entry may be -1."""
    return current().reshape(x, shape)


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    """``x`` with its axes permuted (reversed when ``axes`` is None)."""
    return current().transpose(x, axes)


def expand_dims(x: Array, axis: int) -> Array:
    """``x`` with a new axis of length 1 at ``axis``."""
    return current().expand_dims(x, axis)


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    """``x`` without the length-1 ``axis`` (an error if its length is not 1)."""
    return current().squeeze(x, axis)


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    """``x`` broadcast to ``shape``; the gradient is summed back."""
    return current().broadcast_to(x, shape)


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    """The arrays joined along an existing ``axis``."""
    return current().concat(arrays, axis)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    """The arrays joined along a new ``axis``."""
    return current().stack(arrays, axis)


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    """``x`` cut along ``axis`` into pieces of the given ``sizes`` (they add up to its length;
    torch's meaning of a list, not numpy's split indices)."""
    return current().split(x, sizes, axis)


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    """``x`` with ``widths[i] = (before, after)`` entries of ``value`` on each side of axis
    ``i`` (one pair per axis)."""
    return current().pad(x, widths, value)


# -- indexing ----------------------------------------------------------------------------------


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    """The entries of ``x`` at integer ``indices`` along ``axis`` (an embedding lookup with
    ``axis=0``); indices out of range are an error where the backend can tell, undefined where
    it cannot (compiled code). Repeated indices add their gradients."""
    return current().take(x, indices, axis)


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    """``x``'s entries at ``indices``, which has ``x``'s rank and picks along ``axis`` (the
    target logit of each row: ``take_along_axis(logits, labels[:, None], 1)``)."""
    return current().take_along_axis(x, indices, axis)


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    """``indices`` as one-hot vectors of length ``depth`` on a new last axis."""
    return current().one_hot(indices, depth, dtype)


# -- integer bits (no gradient; the portable generator, unitrain.ops.random, is written in these)


def bitwise_and(x: Array, y: Array) -> Array:
    """Bitwise AND of integer arrays (or a Python int beside one)."""
    return current().bitwise_and(x, y)


def bitwise_or(x: Array, y: Array) -> Array:
    """Bitwise OR of integer arrays (or a Python int beside one)."""
    return current().bitwise_or(x, y)


def bitwise_xor(x: Array, y: Array) -> Array:
    """Bitwise exclusive OR of integer arrays (or a Python int beside one)."""
    return current().bitwise_xor(x, y)


def bitwise_left_shift(x: Array, y: Array) -> Array:
    """``x`` shifted left by ``y`` bits (``0 <= y <`` the width), the bits shifted out of the
    width dropped: on int32 this and ``add``/``subtract``/``multiply`` wrap modulo 2**32."""
    return current().bitwise_left_shift(x, y)


def bitwise_right_shift(x: Array, y: Array) -> Array:
    """``x`` shifted right by ``y`` bits (``0 <= y <`` the width), copying the sign bit in
    (arithmetic), as the array API has it for signed integers."""
    return current().bitwise_right_shift(x, y)


# -- networks (in _nn.py) ----------------------------------------------------------------------

from unitrain.ops import random  # noqa: E402 - the generator is written in the ops above
from unitrain.ops._nn import (  # noqa: E402, F401 - re-exported; listed where the contract lists them
    avg_pool,
    conv,
    conv_transpose,
    layer_norm,
    linear,
    log_softmax,
    max_pool,
    scaled_dot_product_attention,
    softmax,
    stop_gradient,
)
from unitrain.ops.loops import scan  # noqa: E402, F401 - re-exported

#: Every function of the contract, the names each backend's ops module defines.
CONTRACT = (
    "shape", "dtype",
    "asarray", "zeros", "ones", "full", "zeros_like", "ones_like", "arange", "cast",
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "where", "clip",
    "negative", "abs", "sign", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "square",
    "sin", "cos", "tanh", "erf", "sigmoid", "relu", "gelu", "silu", "softplus",
    "equal", "less", "greater", "logical_and", "logical_not", "isfinite",
    "sum", "mean", "max", "min", "argmax", "moments", "logsumexp",
    "matmul", "einsum",
    "reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "concat", "stack",
    "split", "pad",
    "take", "take_along_axis", "one_hot",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "softmax", "log_softmax", "linear", "layer_norm", "conv", "conv_transpose", "max_pool",
    "avg_pool",
    "scaled_dot_product_attention", "stop_gradient", "scan",
)  # fmt: skip

__all__ = ["CONTRACT", "active", "enter", "leave", "random", "using", *CONTRACT]
