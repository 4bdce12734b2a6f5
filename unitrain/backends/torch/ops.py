"""The op contract (:mod:`unitrain.ops`) on torch tensors, for portable code run eagerly.

Each function is one or a few native torch calls: these run per op in eager training loops,
so nothing here reads a value back to the host, goes through numpy, or flips a global flag.
The semantics are the contract's; where torch's own function differs, the function here says
how it is made to agree. What was checked against torch's kernels (on the CPU; the points
the parity cases avoid are pinned by ``tests/test_ops_torch.py``):

- ``maximum``/``minimum`` split the gradient evenly at a tie, ``amax``/``amin`` among tied
  maxima, ``abs`` and ``relu`` give 0 at 0 and ``clamp`` passes the gradient where
  ``low <= x <= high``: torch's own derivatives already are the contract's.
- ``max_pool`` sends the gradient to the first maximum of a window, as torch's kernels do.
- ``power``'s gradient with respect to the exponent is NaN in torch for a negative base;
  here it is zero wherever the base is not positive.
- ``softplus``: torch switches to the identity above ``threshold=20``, which is exact to
  float32 but off by 2e-9 in float64; float64 switches at 37, where ``log1p(exp(-x))``
  drops below float64's resolution.
- ``moments`` is written as two passes rather than ``torch.var_mean``, for its float32
  gradient; ``scaled_dot_product_attention`` mends rows that keep nothing around torch's
  fused kernel, whose answer for them depends on the kernel chosen.
- ``matmul``/``einsum``/``conv`` in float32 use TF32 on CUDA only if the backend's precision
  options allowed it (``torch.set_float32_matmul_precision``, cuDNN's ``allow_tf32``, set
  in ``precision.py``); the ops never touch those flags.

New arrays made from nothing (``zeros``, ``arange``, ``asarray`` of host data) go to the
device set with :func:`set_default_device`; with none set they follow torch's own default
(``torch.set_default_device`` or a ``with torch.device(...)`` block). A module-level device,
not torch's default-device context, because that context intercepts every torch call made
while it is active (a ``TorchFunctionMode``), a cost on each op of a training step. Arrays
made from an array (``zeros_like``, results of ops) stay on its device.
"""

from __future__ import annotations

import builtins  # the contract's max, min, abs and sum shadow the builtins
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from unitrain.backends.torch.core import to_numpy

# A torch.Tensor, or a Python number where the contract takes one (as in unitrain.ops).
Array = Any
Axis = int | tuple[int, ...] | None
Pairish = int | Sequence[int]

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


def set_default_device(device: torch.device | str | None) -> None:
    """Make new arrays on ``device`` (None: torch's default device)."""
    global _device
    _device = None if device is None else torch.device(device)


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


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    """``index_select``, whose gradient adds up repeated indices (deterministically on CUDA
    under ``torch.use_deterministic_algorithms``); indices of any rank are flattened and the
    result reshaped."""
    if indices.ndim == 1:
        return torch.index_select(x, axis, indices)
    axis %= x.ndim
    picked = torch.index_select(x, axis, indices.reshape(-1))
    return picked.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1 :])


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    # take_along_dim broadcasts like numpy; gather would silently take a corner instead.
    return torch.take_along_dim(x, indices.to(torch.int64), dim=axis)


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    # With num_classes given, the CUDA kernel checks the range on the device: no host sync.
    return F.one_hot(indices.to(torch.int64), depth).to(_DTYPES[dtype])


# -- networks ----------------------------------------------------------------------------------


def softmax(x: Array, axis: int = -1) -> Array:
    return torch.softmax(x, axis)


def log_softmax(x: Array, axis: int = -1) -> Array:
    return torch.log_softmax(x, axis)


# Channels-last arrays are moved to torch's channels-first order with ``movedim``, a view: for
# a contiguous NHWC input it is an NCHW tensor in torch's channels_last memory format, which
# cuDNN takes as it is. Kernels ``(*window, A, B)`` become ``(B, A, *window)``, torch's layout
# for both conv (A = C_in / groups, B = C_out) and conv_transpose (A = C_out, B = C_in).
_CONV: dict[int, Callable[..., Array]] = {1: F.conv1d, 2: F.conv2d}
_CONV_TRANSPOSE: dict[int, Callable[..., Array]] = {
    1: F.conv_transpose1d,
    2: F.conv_transpose2d,
}
_MAX_POOL: dict[int, Callable[..., Array]] = {1: F.max_pool1d, 2: F.max_pool2d}
_AVG_POOL: dict[int, Callable[..., Array]] = {1: F.avg_pool1d, 2: F.avg_pool2d}


def _spatial_function(table: dict[int, Callable[..., Array]], x: Array, op: str) -> Callable:
    function = table.get(x.ndim - 2)
    if function is None:
        raise ValueError(f"{op} takes 1 or 2 spatial axes, (N, *spatial, C); got shape {x.shape}")
    return function


def _per_axis(value: Pairish, count: int) -> tuple[int, ...]:
    return (value,) * count if isinstance(value, int) else tuple(value)


def _torch_kernel(kernel: Array) -> Array:
    spatial = kernel.ndim - 2
    return kernel.permute(spatial + 1, spatial, *range(spatial))


def _pad_spatial(x: Array, before: Sequence[int], after: Sequence[int], value: float) -> Array:
    """``x`` (channels first) padded on its spatial axes, for padding torch's layers refuse."""
    widths = [w for pair in zip(reversed(before), reversed(after)) for w in pair]
    return F.pad(x, widths, value=value)


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
) -> Array:
    """torch's conv; ``"same"`` pads as TensorFlow does (extra one after) with ``F.pad`` when
    the two sides differ, through the conv's own padding when they do not."""
    function = _spatial_function(_CONV, x, "conv")
    inputs = x.movedim(-1, 1)
    if padding == "same":
        spatial = x.ndim - 2
        strides, dilations = _per_axis(stride, spatial), _per_axis(dilation, spatial)
        totals = [
            builtins.max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            for n, k, s, d in zip(x.shape[1:-1], kernel.shape[:spatial], strides, dilations)
        ]
        before = [total // 2 for total in totals]
        after = [total - first for total, first in zip(totals, before)]
        if before == after:
            padding = tuple(before)
        else:
            inputs, padding = _pad_spatial(inputs, before, after, 0.0), 0
    elif padding == "valid":
        padding = 0
    out = function(inputs, _torch_kernel(kernel), None, stride, padding, dilation, groups)
    return out.movedim(1, -1)


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    function = _spatial_function(_CONV_TRANSPOSE, x, "conv_transpose")
    weight = _torch_kernel(kernel)
    out = function(x.movedim(-1, 1), weight, None, stride, padding, output_padding, 1, dilation)
    return out.movedim(1, -1)


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """torch's max pooling (its padding is -inf); padding wider than half the window, which
    torch refuses, is added as -inf with ``F.pad`` instead."""
    function = _spatial_function(_MAX_POOL, x, "max_pool")
    inputs = x.movedim(-1, 1)
    windows, pads = _per_axis(window, x.ndim - 2), _per_axis(padding, x.ndim - 2)
    if any(2 * p > w for p, w in zip(pads, windows)):
        inputs, pads = _pad_spatial(inputs, pads, pads, -math.inf), (0,) * len(pads)
    return function(inputs, windows, stride, pads).movedim(1, -1)


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """torch's average pooling with ``count_include_pad=False``; for padding wider than half
    the window (which torch refuses) the zero-padded sums are divided by pooled counts."""
    function = _spatial_function(_AVG_POOL, x, "avg_pool")
    inputs = x.movedim(-1, 1)
    windows, pads = _per_axis(window, x.ndim - 2), _per_axis(padding, x.ndim - 2)
    if all(2 * p <= w for p, w in zip(pads, windows)):
        out = function(inputs, windows, stride, pads, count_include_pad=False)
        return out.movedim(1, -1)
    ones = torch.ones((1, 1, *inputs.shape[2:]), dtype=x.dtype, device=x.device)
    sums = function(_pad_spatial(inputs, pads, pads, 0.0), windows, stride)
    counts = function(_pad_spatial(ones, pads, pads, 0.0), windows, stride)
    return (sums / counts).movedim(1, -1)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """torch's fused attention (a flash or memory-efficient kernel where one applies).

    With a mask, a row that keeps nothing is given every position instead (so no kernel
    takes a softmax over nothing, which some give as NaN, and whose NaN would reach the
    gradients of keys and values), and its output is replaced by zeros: a zero gradient for
    that row. torch refuses a mask together with ``is_causal``, so a causal mask is added to
    the given one.
    """
    if mask is None:
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scale)
    if causal:
        length, source = query.shape[-2], key.shape[-2]
        lower = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        mask = torch.logical_and(mask, lower)
    kept = mask.any(-1, keepdim=True)
    attended = F.scaled_dot_product_attention(
        query, key, value, attn_mask=torch.logical_or(mask, ~kept), scale=scale
    )
    return torch.where(kept, attended, 0.0)


def stop_gradient(x: Array) -> Array:
    return x.detach()
