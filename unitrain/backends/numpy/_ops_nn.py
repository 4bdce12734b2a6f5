"""The numpy reference's network ops: convolutions, pooling and attention, channels last.

:mod:`.ops` imports them, so that it holds the whole contract, as the other adapters'
``_ops_nn.py`` are imported by theirs. Convolution and pooling are built on one view, every
window of the padded input as an array ``(N, *out, C, *window)`` read through
``sliding_window_view`` without a copy, and their gradients add each output's cotangent back
over the input positions its window covered, one window offset at a time. ``conv_transpose``
is the input gradient of ``conv``: the same helpers compute both. ``max_pool`` gives the
gradient to the first maximum of each window, as the contract asks; the average pool leaves
padding out of its count. Attention is written in the tracked ops, its derivative their chain.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from unitrain.backends.numpy._ops_array import (
    Tracked,
    add,
    matmul,
    multiply,
    record,
    value_of,
)
from unitrain.backends.numpy._ops_reduce import masked_softmax, softmax
from unitrain.backends.numpy._ops_shape import transpose
from unitrain.ops import Array, Pairish
from unitrain.ops.windows import per_axis, same_padding


def _windows(
    padded: np.ndarray, window: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> np.ndarray:
    """Every window of ``padded`` (N, *spatial, C), as a view (N, *out, C, *window)."""
    rank = len(window)
    span = tuple((k - 1) * d + 1 for k, d in zip(window, dilation))
    view = sliding_window_view(padded, span, axis=tuple(range(1, rank + 1)))
    every = (slice(None, None, s) for s in stride)
    taps = (slice(None, None, d) for d in dilation)
    return view[(slice(None), *every, slice(None), *taps)]


def _offsets(
    window: Sequence[int], stride: Sequence[int], dilation: Sequence[int], out: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Each position of a window, with the slice of the padded input it covers across outputs."""
    for offset in np.ndindex(*window):
        yield (
            offset,
            tuple(
                slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offset, dilation, stride, out)
            ),
        )


def _channel(group: int, width: int) -> slice:
    return slice(group * width, (group + 1) * width)


def _correlate(padded, kernel, stride, dilation, groups: int, out: Any = None) -> np.ndarray:
    """The cross-correlation of ``padded`` (N, *spatial, C) with ``kernel``
    (*window, C // groups, C_out), at the first ``out`` positions when given."""
    rank = kernel.ndim - 2
    windows = _windows(padded, kernel.shape[:rank], stride, dilation)
    if out is not None:
        windows = windows[(slice(None), *(slice(n) for n in out))]
    width, group_out = kernel.shape[rank], kernel.shape[-1] // groups
    contracted = ([1 + rank, *range(2 + rank, 2 + 2 * rank)], [rank, *range(rank)])
    parts = [
        np.tensordot(
            windows[(slice(None),) * (1 + rank) + (_channel(group, width),)],
            kernel[..., _channel(group, group_out)],
            axes=contracted,
        )
        for group in range(groups)
    ]
    return parts[0] if groups == 1 else np.concatenate(parts, axis=-1)


def _correlate_input_grad(g, kernel, padded_shape, stride, dilation, groups: int) -> np.ndarray:
    """The gradient of :func:`_correlate` with respect to its padded input."""
    rank = kernel.ndim - 2
    width, group_out = kernel.shape[rank], kernel.shape[-1] // groups
    grad = np.zeros(padded_shape, np.result_type(g, kernel))
    for offset, covered in _offsets(kernel.shape[:rank], stride, dilation, g.shape[1:-1]):
        for group in range(groups):
            tap = kernel[offset][:, _channel(group, group_out)]
            target = (slice(None), *covered, _channel(group, width))
            grad[target] += g[..., _channel(group, group_out)] @ tap.T
    return grad


def _correlate_kernel_grad(padded, g, window, stride, dilation, groups: int) -> np.ndarray:
    """The gradient of :func:`_correlate` with respect to its kernel."""
    rank = len(window)
    windows = _windows(padded, window, stride, dilation)
    windows = windows[(slice(None), *(slice(n) for n in g.shape[1:-1]))]
    width, group_out = padded.shape[-1] // groups, g.shape[-1] // groups
    positions = list(range(1 + rank))
    parts = [  # each (C // groups, *window, C_out // groups)
        np.tensordot(
            windows[(slice(None),) * (1 + rank) + (_channel(group, width),)],
            g[..., _channel(group, group_out)],
            axes=(positions, positions),
        )
        for group in range(groups)
    ]
    return np.moveaxis(np.concatenate(parts, axis=-1), 0, rank)


def _crop(padded: np.ndarray, widths: Sequence[tuple[int, int]], spatial: Sequence[int]) -> Any:
    return padded[(slice(None), *(slice(b, b + n) for (b, _), n in zip(widths, spatial)))]


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
    bias: Array | None = None,
) -> Array:
    xv, kv = value_of(x), value_of(kernel)
    rank, spatial = xv.ndim - 2, xv.shape[1:-1]
    if kv.ndim != rank + 2 or xv.shape[-1] != kv.shape[-2] * groups or kv.shape[-1] % groups:
        raise ValueError(
            f"conv of an input {xv.shape} with a kernel {kv.shape} in {groups} groups: the "
            "kernel is (*window, C_in // groups, C_out) with C_out divisible by groups"
        )
    window = kv.shape[:rank]
    strides, dilations = per_axis(stride, rank, "stride"), per_axis(dilation, rank, "dilation")
    if isinstance(padding, str) and padding.lower() in ("same", "valid"):
        widths = tuple(
            same_padding(*sizes) if padding.lower() == "same" else (0, 0)
            for sizes in zip(spatial, window, strides, dilations)
        )
    elif isinstance(padding, str):
        raise ValueError(f"conv padding is 'same', 'valid' or ints, got {padding!r}")
    else:
        widths = tuple((p, p) for p in per_axis(padding, rank, "padding"))
    padded = np.pad(xv, ((0, 0), *widths, (0, 0))) if np.any(widths) else xv
    out = _correlate(padded, kv, strides, dilations, groups)

    def vjp(g: Any) -> tuple[Any, Any]:
        dx = dk = None
        if isinstance(x, Tracked):
            full = _correlate_input_grad(g, kv, padded.shape, strides, dilations, groups)
            dx = _crop(full, widths, spatial)
        if isinstance(kernel, Tracked):
            dk = _correlate_kernel_grad(padded, g, window, strides, dilations, groups)
        return dx, dk

    out = record(out, (x, kernel), vjp)
    return out if bias is None else add(out, bias)


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    out = matmul(x, weight)
    return out if bias is None else add(out, bias)


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    xv, kv = value_of(x), value_of(kernel)
    rank, spatial = xv.ndim - 2, xv.shape[1:-1]
    if kv.ndim != rank + 2 or kv.shape[-1] != xv.shape[-1]:
        raise ValueError(
            f"conv_transpose of an input {xv.shape} with a kernel {kv.shape}: the kernel is "
            "(*window, C_out, C_in)"
        )
    window = kv.shape[:rank]
    strides, dilations = per_axis(stride, rank, "stride"), per_axis(dilation, rank, "dilation")
    pads = per_axis(padding, rank, "padding")
    extra = per_axis(output_padding, rank, "output_padding")
    sizes = [
        (n - 1) * s - 2 * p + d * (k - 1) + e + 1
        for n, s, p, d, k, e in zip(spatial, strides, pads, dilations, window, extra)
    ]
    widths = tuple((p, p) for p in pads)
    padded_shape = (xv.shape[0], *(n + 2 * p for n, p in zip(sizes, pads)), kv.shape[-2])
    # The conv whose input gradient this is maps the padded output (sizes + 2 * padding) to x.
    full = _correlate_input_grad(xv, kv, padded_shape, strides, dilations, 1)

    def vjp(g: Any) -> tuple[Any, Any]:
        padded = np.pad(g, ((0, 0), *widths, (0, 0)))
        dx = dk = None
        if isinstance(x, Tracked):
            dx = _correlate(padded, kv, strides, dilations, 1, spatial)
        if isinstance(kernel, Tracked):
            dk = _correlate_kernel_grad(padded, xv, window, strides, dilations, 1)
        return dx, dk

    return record(_crop(full, widths, sizes), (x, kernel), vjp)


def _pool_setup(x: Array, window: Pairish, stride: Pairish | None, padding: Pairish, fill: float):
    xv = value_of(x)
    rank = xv.ndim - 2
    windows = per_axis(window, rank, "window")
    strides = windows if stride is None else per_axis(stride, rank, "stride")
    widths = tuple((p, p) for p in per_axis(padding, rank, "padding"))
    padded = np.pad(xv, ((0, 0), *widths, (0, 0)), constant_values=fill)
    return xv, windows, strides, widths, padded


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    xv, windows, strides, widths, padded = _pool_setup(x, window, stride, padding, -np.inf)
    view = _windows(padded, windows, strides, (1,) * len(windows))
    flat = view.reshape(*view.shape[: xv.ndim], -1)
    first = np.argmax(flat, axis=-1)  # the first maximum of each window, as torch
    out = np.take_along_axis(flat, first[..., None], axis=-1)[..., 0]

    def vjp(g: Any) -> tuple[Any]:
        grad = np.zeros(padded.shape, g.dtype)
        dilation = (1,) * len(windows)
        for tap, (_, covered) in enumerate(_offsets(windows, strides, dilation, out.shape[1:-1])):
            grad[(slice(None), *covered)] += np.where(first == tap, g, 0)
        return (_crop(grad, widths, xv.shape[1:-1]),)

    return record(out, (x,), vjp)


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    xv, windows, strides, widths, padded = _pool_setup(x, window, stride, padding, 0.0)
    rank, dilation = len(windows), (1,) * len(windows)
    taps = tuple(range(-rank, 0))
    real = np.pad(np.ones((1, *xv.shape[1:-1], 1), xv.dtype), ((0, 0), *widths, (0, 0)))
    count = np.sum(_windows(real, windows, strides, dilation), axis=taps)  # (1, *out, 1)
    out = np.sum(_windows(padded, windows, strides, dilation), axis=taps) / count

    def vjp(g: Any) -> tuple[Any]:
        share = g / count
        grad = np.zeros(padded.shape, g.dtype)
        for _, covered in _offsets(windows, strides, dilation, out.shape[1:-1]):
            grad[(slice(None), *covered)] += share
        return (_crop(grad, widths, xv.shape[1:-1]),)

    return record(out, (x,), vjp)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    dims = np.shape(value_of(key))
    factor = 1 / math.sqrt(dims[-1]) if scale is None else float(scale)
    swap = (*range(len(dims) - 2), len(dims) - 1, len(dims) - 2)
    scores = multiply(matmul(query, transpose(key, swap)), factor)
    keep = None if mask is None else np.asarray(value_of(mask), dtype=bool)
    if causal:
        queries, keys = np.shape(value_of(scores))[-2:]
        below = np.tril(np.ones((queries, keys), dtype=bool))
        keep = below if keep is None else keep & below
    probabilities = softmax(scores, -1) if keep is None else masked_softmax(scores, keep)
    return matmul(probabilities, value)
