"""The op contract (:mod:`unitrain.ops`) on torch tensors, for portable code run eagerly.

Each function is one or a few native torch calls: these run per op in eager training loops,
so nothing here reads a value back to the host, goes through numpy, or flips a global flag.
The semantics are the contract's; where torch's own function differs, the function here says
how it is made to agree. What was checked against torch's kernels (on the CPU; the points
the parity cases avoid are pinned by ``tests/ops/test_ops_torch.py``):

- ``maximum``/``minimum`` split the gradient evenly at a tie, ``amax``/``amin`` among tied
  maxima, ``abs`` and ``relu`` give 0 at 0 and ``clamp`` passes the gradient where
  ``low <= x <= high``: torch's own derivatives already are the contract's.
- ``power``'s gradient with respect to the exponent is NaN in torch for a negative base;
  here it is zero wherever the base is not positive.
- ``softplus``: torch switches to the identity above ``threshold=20``, which is exact to
  float32 but off by 2e-9 in float64; float64 switches at 37, where ``log1p(exp(-x))``
  drops below float64's resolution.
- ``moments`` is written as two passes rather than ``torch.var_mean``, for its float32
  gradient.
- ``matmul``/``einsum``/``conv`` in float32 use TF32 on CUDA only if the backend's precision
  options allowed it (``torch.set_float32_matmul_precision``, cuDNN's ``allow_tf32``, set
  in ``precision.py``); the ops never touch those flags.

New arrays made from nothing (``zeros``, ``arange``, ``asarray`` of host data) go to the
device set with :func:`set_default_device`; with none set they follow torch's own default
(``torch.set_default_device`` or a ``with torch.device(...)`` block). A module-level device,
not torch's default-device context, because that context intercepts every torch call made
while it is active (a ``TorchFunctionMode``), a cost on each op of a training step. Arrays
made from an array (``zeros_like``, results of ops) stay on its device.

The network ops (convolutions, pooling, attention; what they do where torch differs) are in
``_ops_nn.py``, gathers and bitwise functions in ``_ops_int.py``, both imported here, so that
this module holds the whole contract.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from unitrain.backends.torch._ops_int import (  # noqa: F401  (re-exported)
    bitwise_and,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    take,
    take_along_axis,
)
from unitrain.backends.torch._ops_nn import (  # noqa: F401  (re-exported)
    avg_pool,
    conv,
    conv_transpose,
    layer_norm,
    linear,
    max_pool,
    scaled_dot_product_attention,
)
from unitrain.backends.torch.core import to_numpy
from unitrain.ops.loops import loop_scan_of

# A torch.Tensor, or a Python number where the contract takes one (as in unitrain.ops).
Array = Any
Axis = int | tuple[int, ...] | None

__all__ = ["set_default_device", "to_numpy", "vjp"]

_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_NAMES = {value: name for name, value in _DTYPES.items()}
_REDUCED = (torch.float16, torch.bfloat16)

_device: torch.device | None = None
_CPU = torch.device("cpu")


def set_default_device(device: torch.device | str | None) -> torch.device | None:
    """Make new arrays on ``device`` (None: torch's default device); returns the device set
    before, for the caller to put back."""
    global _device
    previous, _device = _device, None if device is None else torch.device(device)
    return previous


def vjp(
    fn: Callable[..., Any], arrays: Sequence[Array], wrt: Sequence[int]
) -> tuple[list[Array], Callable[[Sequence[Array]], list[Array]]]:
    """``fn(*arrays)``'s outputs and their pullback to ``arrays[i]`` for ``i in wrt``.

    The differentiated inputs are fresh leaves (detached from any graph they came with), and
    the graph is kept, so the pullback may be called more than once.
    """
    inputs = list(arrays)
    for i in wrt:
        inputs[i] = inputs[i].detach().requires_grad_(True)
    with torch.enable_grad():
        result = fn(*inputs)
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    sources = [inputs[i] for i in wrt]

    def pullback(cotangents: Sequence[Array]) -> list[Array]:
        pairs = [(o, c) for o, c in zip(outputs, cotangents, strict=True) if o.requires_grad]
        if not pairs or not sources:
            return [torch.zeros_like(source) for source in sources]
        grads = torch.autograd.grad(
            [output for output, _ in pairs],
            sources,
            grad_outputs=[cotangent for _, cotangent in pairs],
            retain_graph=True,
            allow_unused=True,
            materialize_grads=True,
        )
        return list(grads)

    return outputs, pullback


def _operands(x: Any, y: Any) -> tuple[Array, Array]:
    """``x`` and ``y`` as tensors, for the torch functions that take no Python number.

    A number becomes a 0-d CPU tensor of the dtype torch would give the pair (a number does
    not widen a float16 array, an int array with a float becomes float): torch treats a 0-d
    CPU tensor beside a CUDA tensor as a scalar, so nothing is copied to the device.
    ``scalar_tensor`` costs a quarter of ``torch.tensor`` (2 us against 8 on a CPU).
    """
    if not isinstance(x, torch.Tensor):
        return _scalar_beside(x, y), y
    if not isinstance(y, torch.Tensor):
        return x, _scalar_beside(y, x)
    return x, y


def _scalar_beside(number: Any, array: Array) -> Array:
    kind = array.dtype if array.is_floating_point() else torch.result_type(array, number)
    return torch.scalar_tensor(number, dtype=kind, device=_CPU)


# -- about arrays ------------------------------------------------------------------------------


def shape(x: Array) -> tuple[int, ...]:
    return tuple(x.shape)


def dtype(x: Array) -> str:
    return _NAMES[x.dtype]


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    """A tensor from ``x``: a tensor is returned as it is (cast when ``dtype`` says so, the
    graph kept); a numpy array shares its memory on the CPU, as ``np.asarray`` would."""
    target = None if dtype is None else _DTYPES[dtype]
    if isinstance(x, torch.Tensor):
        return x if target is None else x.to(target)
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:  # torch warns that it cannot share a read-only buffer
            x = x.copy()
        return torch.as_tensor(x, dtype=target, device=_device)
    made = torch.as_tensor(x, dtype=target, device=_device)
    if target is None and made.is_floating_point():  # whatever torch's default dtype is
        made = made.to(torch.float32)
    return made


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    return torch.zeros(shape, dtype=_DTYPES[dtype], device=_device)


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    return torch.ones(shape, dtype=_DTYPES[dtype], device=_device)


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    return torch.full(shape, value, dtype=_DTYPES[dtype], device=_device)


def zeros_like(x: Array) -> Array:
    return torch.zeros_like(x)


def ones_like(x: Array) -> Array:
    return torch.ones_like(x)


def arange(n: int, dtype: str = "int64") -> Array:
    return torch.arange(n, dtype=_DTYPES[dtype], device=_device)


def cast(x: Array, dtype: str) -> Array:
    return x.to(_DTYPES[dtype])


# -- elementwise -------------------------------------------------------------------------------
# The operators take a Python number on either side (the reflected method answers).


def add(x: Array, y: Array) -> Array:
    return x + y


def subtract(x: Array, y: Array) -> Array:
    return x - y


def multiply(x: Array, y: Array) -> Array:
    return x * y


def divide(x: Array, y: Array) -> Array:
    return x / y


def power(x: Array, y: Array) -> Array:
    """``x ** y``; when the exponent takes a gradient, the base is replaced by 1 where it is
    not positive in the branch that gives it (``log(1) = 0``: a zero gradient, not NaN), and
    those positions take their value from a branch the exponent does not differentiate."""
    if not (isinstance(y, torch.Tensor) and y.requires_grad and torch.is_grad_enabled()):
        return x**y
    if not isinstance(x, torch.Tensor):
        return x**y if x > 0 else x ** y.detach()
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, 1.0) ** y, x ** y.detach())


def maximum(x: Array, y: Array) -> Array:
    return torch.maximum(*_operands(x, y))


def minimum(x: Array, y: Array) -> Array:
    return torch.minimum(*_operands(x, y))


def where(condition: Array, x: Array, y: Array) -> Array:
    return torch.where(condition, x, y)


def clip(x: Array, low: float, high: float) -> Array:
    return torch.clamp(x, low, high)


def negative(x: Array) -> Array:
    return torch.neg(x)


def abs(x: Array) -> Array:
    return torch.abs(x)


def sign(x: Array) -> Array:
    return torch.sign(x)


def exp(x: Array) -> Array:
    return torch.exp(x)


def expm1(x: Array) -> Array:
    return torch.expm1(x)


def log(x: Array) -> Array:
    return torch.log(x)


def log1p(x: Array) -> Array:
    return torch.log1p(x)


def sqrt(x: Array) -> Array:
    return torch.sqrt(x)


def rsqrt(x: Array) -> Array:
    return torch.rsqrt(x)


def square(x: Array) -> Array:
    return torch.square(x)


def sin(x: Array) -> Array:
    return torch.sin(x)


def cos(x: Array) -> Array:
    return torch.cos(x)


def tanh(x: Array) -> Array:
    return torch.tanh(x)


def erf(x: Array) -> Array:
    return torch.erf(x)


def sigmoid(x: Array) -> Array:
    return torch.sigmoid(x)


def relu(x: Array) -> Array:
    return torch.relu(x)


def gelu(x: Array, approximate: bool = False) -> Array:
    return F.gelu(x, approximate="tanh" if approximate else "none")


def silu(x: Array) -> Array:
    return F.silu(x)


def softplus(x: Array) -> Array:
    """torch's softplus, switching to the identity where ``log1p(exp(-x))`` no longer shows
    in the dtype (float16 and bfloat16 are computed in float32 inside the kernel)."""
    return F.softplus(x, threshold=37.0 if x.dtype == torch.float64 else 20.0)


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    return x == y


def less(x: Array, y: Array) -> Array:
    return x < y


def greater(x: Array, y: Array) -> Array:
    return x > y


def logical_and(x: Array, y: Array) -> Array:
    return torch.logical_and(*_operands(x, y))


def logical_not(x: Array) -> Array:
    return torch.logical_not(x)


def isfinite(x: Array) -> Array:
    return torch.isfinite(x)


# -- reductions --------------------------------------------------------------------------------


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return torch.sum(x, dim=axis, keepdim=keepdims)


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return torch.mean(x, dim=axis, keepdim=keepdims)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return torch.amax(x, dim=() if axis is None else axis, keepdim=keepdims)


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return torch.amin(x, dim=() if axis is None else axis, keepdim=keepdims)


def argmax(x: Array, axis: int = -1) -> Array:
    return torch.argmax(x, dim=axis)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    """Two passes: the mean, then the mean of squared deviations from it.

    Not ``torch.var_mean`` (one kernel, also stable forward): its derivative recomputes
    ``x - mean(x)`` with the rounded mean, so in float32 every deviation of data far from zero
    is off by the mean's rounding (7.6e-6 at 64). Differentiating the two passes subtracts
    the mean of the deviations as well, which cancels that error. float16 and bfloat16 are
    computed in float32 and cast back: their mean is rounded to 8 or 11 bits, an error as
    large as the spread itself when the data sit far from zero.
    """
    source = x.to(torch.float32) if x.dtype in _REDUCED else x
    average = torch.mean(source, dim=axis, keepdim=True)
    variance = torch.mean(torch.square(source - average), dim=axis, keepdim=keepdims)
    if not keepdims:
        average = torch.squeeze(average) if axis is None else torch.squeeze(average, axis)
    return average.to(x.dtype), variance.to(x.dtype)


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    return torch.logsumexp(x, dim=tuple(range(x.ndim)) if axis is None else axis, keepdim=keepdims)


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    return torch.matmul(x, y)


def einsum(subscripts: str, *operands: Array) -> Array:
    return torch.einsum(subscripts, *operands)


# -- shapes ------------------------------------------------------------------------------------


def reshape(x: Array, shape: Sequence[int]) -> Array:
    return torch.reshape(x, tuple(shape))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    return x.permute(tuple(range(x.ndim - 1, -1, -1)) if axes is None else tuple(axes))


def expand_dims(x: Array, axis: int) -> Array:
    return torch.unsqueeze(x, axis)


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    """``torch.squeeze`` leaves an axis longer than 1 in place; the contract calls it an error."""
    for a in (axis,) if isinstance(axis, int) else axis:
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of length {x.shape[a]} (shape {x.shape})")
    return torch.squeeze(x, axis)


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    return torch.broadcast_to(x, tuple(shape))


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    return torch.cat(list(arrays), dim=axis)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    return torch.stack(list(arrays), dim=axis)


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    return list(torch.split(x, list(sizes), dim=axis))


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    # F.pad lists (before, after) from the last axis backwards.
    return F.pad(x, [w for pair in reversed(widths) for w in pair], value=value)


# -- indexing ----------------------------------------------------------------------------------


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    # With num_classes given, the CUDA kernel checks the range on the device: no host sync.
    return F.one_hot(indices.to(torch.int64), depth).to(_DTYPES[dtype])


# -- networks ----------------------------------------------------------------------------------


def softmax(x: Array, axis: int = -1) -> Array:
    return torch.softmax(x, axis)


def log_softmax(x: Array, axis: int = -1) -> Array:
    return torch.log_softmax(x, axis)


# conv, conv_transpose, max_pool, avg_pool and scaled_dot_product_attention: _ops_nn.py.


def stop_gradient(x: Array) -> Array:
    return x.detach()


#: The contract's loop over this module's own ops (see unitrain.ops.loops).
scan = loop_scan_of(sys.modules[__name__])
