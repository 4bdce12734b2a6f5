"""The JAX adapter's network ops: convolutions, pooling and attention, channels last.

:mod:`.ops` imports them, so that it holds the whole contract. They live apart because they
share one job, turning the contract's window arguments (an int or one per spatial axis,
"same" padding) into ``lax.conv_general_dilated`` and ``lax.reduce_window`` calls; attention
is written out (see :func:`scaled_dot_product_attention`). Products run at the precision
:func:`_precision` picks, which :mod:`.ops`' ``matmul`` and ``einsum`` share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from unitrain.ops import Array, Pairish
from unitrain.ops.windows import per_axis, same_padding

#: ``conv_general_dilated``'s layouts per number of spatial axes: channels last, kernels
#: ``(*window, C_in / groups, C_out)``; the transposed conv reads its kernel as
#: ``(*window, C_out, C_in)``.
_CONV_LAYOUTS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC")}
_TRANSPOSED_LAYOUTS = {1: ("NWC", "WOI", "NWC"), 2: ("NHWC", "HWOI", "NHWC")}


def _precision() -> lax.Precision | None:
    """HIGHEST unless the caller chose a precision with ``jax.default_matmul_precision``."""
    return None if jax.default_matmul_precision.value is not None else lax.Precision.HIGHEST


def _conv_padding(
    padding: str | Pairish,
    sizes: Sequence[int],
    window: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[tuple[int, int]]:
    """Explicit ``(before, after)`` pads; "same" is TensorFlow's, the extra one after."""
    if padding == "valid":
        return [(0, 0)] * len(sizes)
    if padding == "same":
        return [same_padding(*axis) for axis in zip(sizes, window, strides, dilations)]
    if isinstance(padding, str):
        raise ValueError(f"padding is an int, ints, 'same' or 'valid', got {padding!r}")
    return [(p, p) for p in per_axis(padding, len(sizes), "padding")]


def _spatial_axes(x: Array, layouts: dict[int, Any]) -> int:
    n = jnp.ndim(x) - 2
    if n not in layouts:
        raise ValueError(f"convolutions take 1 or 2 spatial axes, got an input of shape {x.shape}")
    return n


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
    bias: Array | None = None,
) -> Array:
    n = _spatial_axes(x, _CONV_LAYOUTS)
    strides = per_axis(stride, n, "stride")
    dilations = per_axis(dilation, n, "dilation")
    pads = _conv_padding(padding, x.shape[1:-1], kernel.shape[:n], strides, dilations)
    out = lax.conv_general_dilated(
        x,
        kernel,
        strides,
        pads,
        rhs_dilation=dilations,
        dimension_numbers=_CONV_LAYOUTS[n],
        feature_group_count=groups,
        precision=_precision(),
    )
    return out if bias is None else out + bias


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    out = jnp.matmul(x, weight, precision=_precision())
    return out if bias is None else out + bias


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    """:func:`conv`'s input gradient written as a conv: the input dilated by ``stride``, the
    kernel flipped with its channel axes read the other way round, and each side padded by
    ``dilation * (window - 1) - padding`` (plus ``output_padding`` after)."""
    n = _spatial_axes(x, _TRANSPOSED_LAYOUTS)
    strides = per_axis(stride, n, "stride")
    dilations = per_axis(dilation, n, "dilation")
    pads = per_axis(padding, n, "padding")
    extras = per_axis(output_padding, n, "output_padding")
    edges = []
    for k, d, p, extra in zip(kernel.shape[:n], dilations, pads, extras):
        edge = d * (k - 1) - p
        edges.append((edge, edge + extra))
    return lax.conv_general_dilated(
        x,
        lax.rev(kernel, tuple(range(n))),
        (1,) * n,
        edges,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        dimension_numbers=_TRANSPOSED_LAYOUTS[n],
        precision=_precision(),
    )


def _pool_geometry(
    x: Array, window: Pairish, stride: Pairish | None, padding: Pairish
) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]:
    """``reduce_window``'s dimensions, strides and pads: batch and channels untouched."""
    n = _spatial_axes(x, _CONV_LAYOUTS)
    sizes = per_axis(window, n, "window")
    steps = sizes if stride is None else per_axis(stride, n, "stride")
    pads = [(p, p) for p in per_axis(padding, n, "padding")]
    return (1, *sizes, 1), (1, *steps, 1), [(0, 0), *pads, (0, 0)]


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """``reduce_window`` of ``max`` from -inf, which pads with -inf; its derivative
    (``select_and_scatter_add`` with ``>=``) goes to the first maximum of each window."""
    dims, strides, pads = _pool_geometry(x, window, stride, padding)
    return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    dims, strides, pads = _pool_geometry(x, window, stride, padding)
    total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads)
    if not any(before or after for before, after in pads):
        return total / math.prod(dims)
    # The count of real entries in each window: a constant XLA folds under jit.
    ones = jnp.ones((1, *x.shape[1:-1], 1), x.dtype)
    return total / lax.reduce_window(ones, 0.0, lax.add, dims, strides, pads)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Written out rather than ``jax.nn.dot_product_attention``, which gives a row that keeps
    nothing the mean of ``value`` where the contract wants zeros.

    Left-out scores are -inf before the shift and the exponential, so they take no gradient
    and no ``inf * 0`` appears; a row without a kept score is shifted by 0 instead of -inf and
    divided by 1 instead of 0, which makes its weights, output and gradients zeros.
    """
    length, keys, depth = query.shape[-2], key.shape[-2], query.shape[-1]
    factor = 1.0 / math.sqrt(depth) if scale is None else scale
    scores = jnp.einsum("...ld,...sd->...ls", query, key, precision=_precision()) * factor
    keep = None if mask is None else mask
    if causal:
        lower = jnp.arange(keys)[None, :] <= jnp.arange(length)[:, None]
        keep = lower if keep is None else keep & lower
    if keep is not None:
        scores = jnp.where(keep, scores, -jnp.inf)
    top = lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    shifted = jnp.exp(scores - jnp.where(jnp.isneginf(top), 0, top))
    total = jnp.sum(shifted, axis=-1, keepdims=True)
    weights = shifted / jnp.where(total > 0, total, 1)
    return jnp.einsum("...ls,...sd->...ld", weights, value, precision=_precision())


def scan(step: Callable[[Any, Array], tuple[Any, Array]], init: Any, xs: Array) -> Any:
    """``lax.scan``: the step is traced once, not once per position."""
    if jnp.shape(xs)[0] < 1:
        raise ValueError(f"scan needs at least one position along axis 0, got {jnp.shape(xs)}")
    return lax.scan(step, init, xs)
