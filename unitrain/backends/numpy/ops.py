"""The :mod:`unitrain.ops` contract in numpy, with derivatives of its own: the oracle.

Every op computes its forward with numpy in its input's dtype (float64 for the oracle; float32
inputs stay float32, so the same code measures what float32 costs) and, when an input is a
:class:`Tracked` array, records a hand-written vector-Jacobian product on the graph of
:mod:`._tape`. With no tracked input an op returns a plain ndarray, so forward-only code pays
nothing for the graph. No framework is imported: that is what makes these derivatives an
independent check of torch's, JAX's and TensorFlow's. The error function is the reference's
own too (numpy has none, and scipy is not a dependency of unitrain).

Where frameworks differ the contract's docstrings decide; the choices that show in the
derivatives: ties of ``maximum``/``minimum``/``max``/``min`` split the gradient evenly;
``relu`` and ``abs`` have gradient 0 at 0; ``max_pool`` gives the gradient to the first maximum
of each window; ``conv_transpose`` is the input gradient of ``conv`` (the same helpers compute
both).

This module is the one backends and tests import: it holds the whole contract, ``to_numpy``
and :func:`vjp`. It defines where arrays enter and leave the reference (making and casting
arrays, ``stop_gradient``, :func:`vjp`); the ops that compute are imported from private
modules, one concept each: :mod:`._ops_array` (the :class:`Tracked` array, how ops record on
it, and the arithmetic, ``matmul`` and indexing its operators call), :mod:`._ops_math` (the
other elementwise functions and the comparisons; the error function's evaluation in
:mod:`._special`), :mod:`._ops_reduce` (reductions and softmaxes), :mod:`._ops_shape` (shape
ops and gathers) and :mod:`._ops_nn` (convolutions, pooling, attention).

Examples:
    >>> import numpy as np
    >>> outputs, pullback = vjp(lambda x: sum(x * x), [np.array([1.0, 2.0])], (0,))
    >>> outputs[0], pullback([np.array(1.0)])[0]
    (array(5.), array([2., 4.]))
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unitrain.backends.numpy import _tape
from unitrain.backends.numpy._ops_array import (  # noqa: F401  (re-exported, or used here)
    Tracked,
    add,
    divide,
    einsum,
    is_float,
    matmul,
    multiply,
    negative,
    numpy_dtype,
    power,
    subtract,
    value_of,
)
from unitrain.backends.numpy._ops_math import (  # noqa: F401  (re-exported)
    abs,
    bitwise_and,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    clip,
    cos,
    equal,
    erf,
    exp,
    expm1,
    gelu,
    greater,
    isfinite,
    less,
    log,
    log1p,
    logical_and,
    logical_not,
    maximum,
    minimum,
    relu,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softplus,
    sqrt,
    square,
    tanh,
    where,
)
from unitrain.backends.numpy._ops_nn import (  # noqa: F401  (re-exported)
    avg_pool,
    conv,
    conv_transpose,
    linear,
    max_pool,
    scaled_dot_product_attention,
)
from unitrain.backends.numpy._ops_reduce import (  # noqa: F401  (re-exported)
    argmax,
    log_softmax,
    logsumexp,
    max,
    mean,
    min,
    moments,
    softmax,
    sum,
)
from unitrain.backends.numpy._ops_shape import (  # noqa: F401  (re-exported)
    broadcast_to,
    concat,
    expand_dims,
    one_hot,
    pad,
    reshape,
    split,
    squeeze,
    stack,
    take,
    take_along_axis,
    transpose,
)
from unitrain.ops import CONTRACT, Array
from unitrain.ops.composed import layer_norm_of
from unitrain.ops.loops import loop_scan_of

__all__ = [*CONTRACT, "Tracked", "to_numpy", "vjp"]


# -- about arrays ------------------------------------------------------------------------------


def shape(x: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in np.shape(value_of(x)))


def dtype(x: Array) -> str:
    x = value_of(x)
    return (x if isinstance(x, np.ndarray | np.generic) else asarray(x)).dtype.name


def to_numpy(x: Array) -> np.ndarray:
    """``x`` as a numpy array (bfloat16 as float32)."""
    array = np.asarray(value_of(x))
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    if isinstance(x, Tracked):
        return x if dtype is None or x.dtype == numpy_dtype(dtype) else cast(x, dtype)
    if dtype is not None:
        return np.asarray(x, dtype=numpy_dtype(dtype))
    array = np.asarray(x)
    # Python floats (and lists of them) become float32, as a framework's tensor() makes them.
    if array.dtype == np.float64 and not isinstance(x, np.ndarray | np.generic):
        return array.astype(np.float32)
    return array


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    return np.zeros(tuple(shape), numpy_dtype(dtype))


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    return np.ones(tuple(shape), numpy_dtype(dtype))


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    return np.full(tuple(shape), value, numpy_dtype(dtype))


def zeros_like(x: Array) -> Array:
    return np.zeros_like(value_of(x))


def ones_like(x: Array) -> Array:
    return np.ones_like(value_of(x))


def arange(n: int, dtype: str = "int64") -> Array:
    return np.arange(n, dtype=numpy_dtype(dtype))


def cast(x: Array, dtype: str) -> Array:
    xv = np.asarray(value_of(x))
    out = xv.astype(numpy_dtype(dtype))
    if not (isinstance(x, Tracked) and is_float(xv.dtype) and is_float(out.dtype)):
        return out
    return Tracked(out, ((0, x),), lambda g: (np.asarray(g).astype(xv.dtype),))


# -- differentiation ---------------------------------------------------------------------------


def stop_gradient(x: Array) -> Array:
    return value_of(x)


def vjp(
    fn: Callable[..., Any], arrays: Sequence[Any], wrt: Sequence[int]
) -> tuple[list[np.ndarray], Callable[[Sequence[Any]], list[np.ndarray]]]:
    """``fn(*arrays)``'s outputs and their pullback to the inputs at positions ``wrt``.

    Args:
        fn: computes an array, or a tuple or list of arrays, from ``arrays``.
        arrays: its inputs; those at ``wrt`` are tracked.
        wrt: the positions of the inputs to differentiate.

    Returns:
        The outputs as numpy arrays, and ``pullback(cotangents)`` (one per output) giving the
        gradient of each input in ``wrt``: zeros where no output depends on it.
    """
    inputs = list(arrays)
    for i in wrt:
        inputs[i] = Tracked(np.asarray(value_of(arrays[i])))
    result = fn(*inputs)
    outputs = list(result) if isinstance(result, tuple | list) else [result]

    def pullback(cotangents: Sequence[Any]) -> list[np.ndarray]:
        if len(cotangents) != len(outputs):
            raise ValueError(f"{len(cotangents)} cotangents for {len(outputs)} outputs")
        grads = _tape.backpropagate(outputs, [np.asarray(value_of(c)) for c in cotangents])
        gradients = []
        for i in wrt:
            grad = grads.get(id(inputs[i]))
            leaf = inputs[i].value
            gradients.append(np.zeros_like(leaf) if grad is None else np.require(grad, None, "W"))
        return gradients

    return [np.asarray(value_of(o)) for o in outputs], pullback


#: The contract's loop over this module's own ops (see unitrain.ops.loops).
scan = loop_scan_of(sys.modules[__name__])
layer_norm = layer_norm_of(sys.modules[__name__])
