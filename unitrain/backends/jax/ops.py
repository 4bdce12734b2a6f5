"""The :mod:`unitrain.ops` contract in JAX: ``jax.numpy``, ``jax.lax`` and ``jax.nn``.

Every function traces under ``jax.jit`` into plain XLA (no host callbacks, no Python work at
run time), so portable layers cost nothing here beyond their tracing. The semantics are the
contract's (see :mod:`unitrain.ops`); what follows is where JAX needed a decision.

- **x64.** JAX has 64-bit types only in x64 mode, which this adapter never switches on for
  the process (see :mod:`.backend`). Without it, ``"float64"`` and ``"int64"`` asked of
  :func:`zeros`, :func:`cast`, :func:`arange`, ... mean float32 and int32, JAX's own types,
  quietly, so float32 code that names a 64-bit dtype keeps running. Two places give real
  float64 anyway: :func:`asarray` with ``dtype="float64"`` makes a float64 array (the data
  a float64 computation starts from), and :func:`vjp` runs ``fn`` and its pullback inside
  ``jax.enable_x64(True)`` when an input is 64-bit, a thread-local switch, so the whole
  computation, Python numbers included, stays in float64. Other float64 work belongs inside
  ``with jax.enable_x64(True):`` (or in a process started with ``JAX_ENABLE_X64=1``):
  outside it JAX truncates float64 operands to float32 with a warning.
- **Integers.** Python ints, integer lists and :func:`argmax` give int64 in x64 mode and
  int32 without it (indices and labels fit either).
- **Matmul precision.** :func:`matmul`, :func:`einsum`, :func:`conv`, :func:`conv_transpose`
  and attention compute float32 products in float32 (``Precision.HIGHEST``: no TF32 or
  bfloat16 passes on a GPU), unless the caller has chosen a precision with
  ``jax.default_matmul_precision``, as the backend's compiled functions do for the run's
  ``matmul_precision``: then that choice holds. :func:`vjp` applies "highest" when none is
  chosen, so the ``@`` operator follows the contract there too.
- **Out-of-range indices** in :func:`take` and :func:`take_along_axis` are never an error
  (telling would take a device-to-host sync): they read NaN for floating arrays, JAX's
  ``mode="fill"``.
- Where JAX's own derivative differs from the contract, the op is written so that it follows
  the contract: :func:`abs` (JAX's is 1 at 0), :func:`clip` (JAX's is 1/2 at a bound) and
  :func:`power` (JAX's exponent gradient is NaN for a negative base).

The network ops (convolutions, pooling, attention) are in ``_ops_nn.py``, gathers and bitwise
functions in ``_ops_int.py``, both imported here, so that this module holds the whole contract.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy import special

from unitrain.backends.jax._ops_int import (  # noqa: F401  (re-exported)
    bitwise_and,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    take,
    take_along_axis,
)
from unitrain.backends.jax._ops_nn import (  # noqa: F401  (re-exported)
    _precision,
    avg_pool,
    conv,
    conv_transpose,
    linear,
    max_pool,
    scaled_dot_product_attention,
    scan,
)
from unitrain.ops import Array, Axis
from unitrain.ops.composed import layer_norm_of

_DTYPES: dict[str, Any] = {
    "float16": jnp.float16,
    "bfloat16": jnp.bfloat16,
    "float32": jnp.float32,
    "float64": jnp.float64,
    "int32": jnp.int32,
    "int64": jnp.int64,
    "bool": jnp.bool_,
}
#: What the 64-bit dtypes are without x64 mode.
_NARROW = {"float64": jnp.float32, "int64": jnp.int32}
_NARROW_TYPES = tuple(jnp.dtype(name) for name in _NARROW)
_LOW_FLOATS = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _x64() -> bool:
    return bool(jax.enable_x64.value)  # this thread's, inside `with jax.enable_x64()` too


def _dtype(name: str) -> Any:
    """The JAX dtype ``name`` stands for in the current x64 mode."""
    if name in _NARROW and not _x64():
        return _NARROW[name]
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}") from None


# -- about arrays ------------------------------------------------------------------------------


def shape(x: Array) -> tuple[int, ...]:
    return tuple(jnp.shape(x))


def dtype(x: Array) -> str:
    if isinstance(x, jax.Array | np.ndarray):
        return x.dtype.name
    return asarray(x).dtype.name


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    """A JAX array; ``dtype="float64"`` is real float64 even without x64 mode (see the module
    docstring), and Python floats and lists of them are float32."""
    if dtype is None:
        if isinstance(x, jax.Array):
            return x
        host = np.asarray(x)
        if host.dtype.kind == "f" and not hasattr(x, "dtype"):  # Python floats, lists of them
            return jnp.asarray(host, jnp.float32)
        return jnp.asarray(host)  # numpy dtypes kept (64-bit ones need x64)
    if dtype == "float64" and not _x64():
        with jax.enable_x64(True):
            return jnp.asarray(x, jnp.float64)
    return jnp.asarray(x, _dtype(dtype))


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    return jnp.zeros(tuple(shape), _dtype(dtype))


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    return jnp.ones(tuple(shape), _dtype(dtype))


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    return jnp.full(tuple(shape), value, _dtype(dtype))


def zeros_like(x: Array) -> Array:
    return jnp.zeros_like(x)


def ones_like(x: Array) -> Array:
    return jnp.ones_like(x)


def arange(n: int, dtype: str = "int64") -> Array:
    return jnp.arange(n, dtype=_dtype(dtype))


def cast(x: Array, dtype: str) -> Array:
    return jnp.asarray(x).astype(_dtype(dtype))


# -- elementwise -------------------------------------------------------------------------------


def add(x: Array, y: Array) -> Array:
    return jnp.add(x, y)


def subtract(x: Array, y: Array) -> Array:
    return jnp.subtract(x, y)


def multiply(x: Array, y: Array) -> Array:
    return jnp.multiply(x, y)


def divide(x: Array, y: Array) -> Array:
    return jnp.true_divide(x, y)


def power(x: Array, y: Array) -> Array:
    """``x ** y`` with the exponent's gradient taken only where ``x > 0``.

    A Python int exponent goes to ``lax.integer_pow`` (exact for negative bases); others to
    :func:`_real_power`, whose derivative avoids ``log`` of a non-positive base.
    """
    if isinstance(y, int) and not isinstance(y, bool):
        return jnp.power(x, y)
    common = jnp.result_type(x, y)
    if not jnp.issubdtype(common, jnp.inexact):
        return jnp.power(x, y)
    return _real_power(jnp.asarray(x, common), jnp.asarray(y, common))


@jax.custom_jvp
def _real_power(x: Array, y: Array) -> Array:
    return jnp.power(x, y)


@_real_power.defjvp
def _real_power_jvp(primals: tuple[Array, Array], tangents: tuple[Array, Array]) -> Any:
    (x, y), (dx, dy) = primals, tangents
    out = jnp.power(x, y)
    # d/dx is 0 where y == 0 (torch's choice; 0 * 0 ** -1 would be NaN at x == 0).
    by_base = jnp.where(y == 0, 0, y * jnp.power(x, y - 1))
    positive = x > 0
    by_exponent = jnp.where(positive, out * jnp.log(jnp.where(positive, x, 1)), 0)
    return out, by_base * dx + by_exponent * dy


def maximum(x: Array, y: Array) -> Array:
    return jnp.maximum(x, y)  # a tie splits the gradient evenly


def minimum(x: Array, y: Array) -> Array:
    return jnp.minimum(x, y)


def where(condition: Array, x: Array, y: Array) -> Array:
    return jnp.where(condition, x, y)


def clip(x: Array, low: float, high: float) -> Array:
    # jnp.clip is maximum-then-minimum, which gives 1/2 at a bound; where() gives the bound 1.
    return jnp.where((x >= low) & (x <= high), x, jnp.clip(x, low, high))


def negative(x: Array) -> Array:
    return jnp.negative(x)


def abs(x: Array) -> Array:
    # x * sign(x) is |x| exactly, and its derivative is sign(x): 0 at 0, where jnp.abs's is 1.
    return x * jnp.sign(x)


def sign(x: Array) -> Array:
    return jnp.sign(x)


def exp(x: Array) -> Array:
    return jnp.exp(x)


def expm1(x: Array) -> Array:
    return jnp.expm1(x)


def log(x: Array) -> Array:
    return jnp.log(x)


def log1p(x: Array) -> Array:
    return jnp.log1p(x)


def sqrt(x: Array) -> Array:
    return jnp.sqrt(x)


def rsqrt(x: Array) -> Array:
    return lax.rsqrt(x)


def square(x: Array) -> Array:
    return jnp.square(x)


def sin(x: Array) -> Array:
    return jnp.sin(x)


def cos(x: Array) -> Array:
    return jnp.cos(x)


def tanh(x: Array) -> Array:
    return jnp.tanh(x)


def erf(x: Array) -> Array:
    return special.erf(x)


def sigmoid(x: Array) -> Array:
    return jax.nn.sigmoid(x)


def relu(x: Array) -> Array:
    return jax.nn.relu(x)  # its derivative at 0 is 0


def gelu(x: Array, approximate: bool = False) -> Array:
    return jax.nn.gelu(x, approximate=approximate)


def silu(x: Array) -> Array:
    return jax.nn.silu(x)


def softplus(x: Array) -> Array:
    return jax.nn.softplus(x)


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    return jnp.equal(x, y)


def less(x: Array, y: Array) -> Array:
    return jnp.less(x, y)


def greater(x: Array, y: Array) -> Array:
    return jnp.greater(x, y)


def logical_and(x: Array, y: Array) -> Array:
    return jnp.logical_and(x, y)


def logical_not(x: Array) -> Array:
    return jnp.logical_not(x)


def isfinite(x: Array) -> Array:
    return jnp.isfinite(x)


# -- reductions --------------------------------------------------------------------------------


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return jnp.sum(x, axis, keepdims=keepdims)


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return jnp.mean(x, axis, keepdims=keepdims)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return jnp.max(x, axis, keepdims=keepdims)  # splits the gradient among ties


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return jnp.min(x, axis, keepdims=keepdims)


def argmax(x: Array, axis: int = -1) -> Array:
    return jnp.argmax(x, axis)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    """Two passes; float16 and bfloat16 inputs are reduced in float32 and cast back."""
    low = jnp.result_type(x) in _LOW_FLOATS
    wide = jnp.asarray(x, jnp.float32) if low else x
    average = jnp.mean(wide, axis, keepdims=True)
    variance = jnp.mean(jnp.square(wide - average), axis, keepdims=keepdims)
    if not keepdims:
        average = jnp.squeeze(average, axis)
    if low:
        return average.astype(x.dtype), variance.astype(x.dtype)
    return average, variance


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    return jax.nn.logsumexp(x, axis, keepdims=keepdims)


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    return jnp.matmul(x, y, precision=_precision())


def einsum(subscripts: str, *operands: Array) -> Array:
    return jnp.einsum(subscripts, *operands, precision=_precision())


# -- shapes ------------------------------------------------------------------------------------


def reshape(x: Array, shape: Sequence[int]) -> Array:
    return jnp.reshape(x, tuple(shape))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    return jnp.transpose(x, None if axes is None else tuple(axes))


def expand_dims(x: Array, axis: int) -> Array:
    return jnp.expand_dims(x, axis)


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    return jnp.squeeze(x, axis)


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    return jnp.broadcast_to(x, tuple(shape))


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    return jnp.concatenate(arrays, axis)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    return jnp.stack(arrays, axis)


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    length = jnp.shape(x)[axis]
    if builtins.sum(sizes) != length:
        raise ValueError(f"split sizes {list(sizes)} do not add up to the axis length {length}")
    return jnp.split(x, list(itertools.accumulate(sizes))[:-1], axis)


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    return jnp.pad(x, [tuple(w) for w in widths], constant_values=value)


# -- indexing ----------------------------------------------------------------------------------


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    return jax.nn.one_hot(indices, depth, dtype=_dtype(dtype))


# -- networks ----------------------------------------------------------------------------------


def softmax(x: Array, axis: int = -1) -> Array:
    return jax.nn.softmax(x, axis)


def log_softmax(x: Array, axis: int = -1) -> Array:
    return jax.nn.log_softmax(x, axis)


# conv, conv_transpose, max_pool, avg_pool and scaled_dot_product_attention: _ops_nn.py.
layer_norm = layer_norm_of(sys.modules[__name__])  # composed (XLA fuses it)


def stop_gradient(x: Array) -> Array:
    return lax.stop_gradient(x)


# -- beside the contract -----------------------------------------------------------------------


def to_numpy(x: Array) -> np.ndarray:
    """``x`` on the host; bfloat16 comes back as float32 (numpy has no bfloat16)."""
    host = np.asarray(x)
    return host.astype(np.float32) if host.dtype == jnp.bfloat16 else host


def vjp(
    fn: Callable[..., Any], arrays: Sequence[Array], wrt: Sequence[int]
) -> tuple[list[Array], Callable[[Sequence[Array]], list[Array]]]:
    """``fn(*arrays)``'s outputs and a pullback to the gradients of ``arrays[i]``, ``i in wrt``.

    ``jax.vjp`` differentiates a function of the chosen inputs alone (the others are closed
    over). The forward and the pullback run in x64 mode when an input is 64-bit, and under
    "highest" matmul precision unless the caller chose one (see the module docstring).
    """
    arrays, wrt = list(arrays), tuple(wrt)
    x64 = not _x64() and any(getattr(a, "dtype", None) in _NARROW_TYPES for a in arrays)

    def modes() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if x64:
            stack.enter_context(jax.enable_x64(True))
        if jax.default_matmul_precision.value is None:
            stack.enter_context(jax.default_matmul_precision("highest"))
        return stack

    def of_chosen(*chosen: Array) -> list[Array]:
        full = list(arrays)
        for position, array in zip(wrt, chosen):
            full[position] = array
        out = fn(*full)
        return list(out) if isinstance(out, tuple | list) else [out]

    with modes():
        outputs, pull = jax.vjp(of_chosen, *(arrays[i] for i in wrt))

    def pullback(cotangents: Sequence[Array]) -> list[Array]:
        # JAX wants float0 zeros as the cotangent of an integer or bool output.
        weights = [
            c if jnp.issubdtype(o.dtype, jnp.inexact) else np.zeros(o.shape, jax.dtypes.float0)
            for c, o in zip(cotangents, outputs)
        ]
        with modes():
            return list(pull(weights))

    return outputs, pullback
