"""The TensorFlow adapter's network ops: convolutions, pooling and attention, channels last.

:mod:`.ops` imports them, so that it holds the whole contract. They live apart because they
share one job, fitting the contract's window arguments (an int or one per spatial axis,
explicit padding) to TensorFlow's 2-D ops. What was checked against TensorFlow 2.21's CPU
kernels, and where an op is written here so that it agrees:

- ``max_pool``'s gradient goes to the first maximum of each window (``MaxPoolGrad`` on CPU,
  the select-and-scatter of XLA).
- The CPU kernels have no gradient for a grouped or a dilated convolution and no dilated
  transposed convolution at all: those are compiled with XLA (:func:`conv`).
- Pooling ops have no explicit padding: it is added with ``tf.pad`` (-inf for the maximum,
  left out of the mean's count).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from unitrain.ops import Array, Pairish
from unitrain.ops.windows import per_axis


def _spatial_axes(x: Array) -> int:
    count = x.shape.rank - 2
    if count not in (1, 2):
        raise ValueError(f"expected (N, *spatial, C) with 1 or 2 spatial axes, got {x.shape}")
    return count


def _lifted(x: Array, kernel: Array, count: int) -> tuple[Array, Array]:
    """A 1-D image and kernel as 2-D ones of height 1 (TensorFlow's own ``conv1d`` does the
    same), so one op serves both."""
    return (x[:, None], kernel[None]) if count == 1 else (x, kernel)


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
    bias: Array | None = None,
) -> Array:
    """``tf.nn.conv2d`` (1-D as 2-D of height 1), the padding passed to the op.

    ``"same"`` is TensorFlow's own ``SAME`` (``ceil(size / stride)`` outputs, the extra
    padding after, the window's dilated extent counted); ``groups`` is the ratio of ``x``'s
    channels to the kernel's input channels, which is how the op tells a grouped convolution.
    TensorFlow's CPU kernels have no gradient for a grouped or a dilated convolution, so those
    are compiled with XLA (on every device: which one runs the op is not known here).
    """
    count = _spatial_axes(x)
    if x.shape[-1] is not None and x.shape[-1] != kernel.shape[-2] * groups:
        raise ValueError(
            f"conv with groups={groups} needs C_in = kernel.shape[-2] * groups, got x with "
            f"{x.shape[-1]} channels and a kernel of shape {kernel.shape}"
        )
    lift = (1,) * (2 - count)  # the height of a 1-D image
    strides = (1, *lift, *per_axis(stride, count, "stride"), 1)
    dilations = (1, *lift, *per_axis(dilation, count, "dilation"), 1)
    pads: str | tuple[tuple[int, int], ...]
    if isinstance(padding, str):
        if padding.lower() not in ("same", "valid"):
            raise ValueError(f'conv padding is "same", "valid" or ints, got {padding!r}')
        pads = padding.upper()
    else:
        widths = tuple((p, p) for p in per_axis(padding, count, "padding"))
        pads = ((0, 0), *((0, 0),) * len(lift), *widths, (0, 0))
    native = groups == 1 and max(dilations) == 1
    run = _conv2d if native else _conv2d_compiled
    out = run(*_lifted(x, kernel, count), strides, pads, dilations)
    out = out[:, 0] if count == 1 else out
    return out if bias is None else out + bias


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """``tf.matmul`` on a matrix, ``tf.tensordot`` over the last axis of more axes."""
    out = tf.matmul(x, weight) if x.shape.rank == 2 else tf.tensordot(x, weight, axes=1)
    return out if bias is None else out + bias


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    """``tf.nn.conv2d_transpose`` (the input gradient of ``conv``) sized as the contract says.

    The op is told the forward convolution's padding: ``padding`` before and ``padding -
    output_padding`` after on each axis, which maps the output size back to ``x``'s. Where
    ``output_padding`` exceeds ``padding`` the last rows lie beyond every window: zeros. A
    dilated one is compiled with XLA, as in ``conv``.
    """
    count = _spatial_axes(x)
    strides = per_axis(stride, count, "stride")
    pads = per_axis(padding, count, "padding")
    extras = per_axis(output_padding, count, "output_padding")
    dilations = per_axis(dilation, count, "dilation")
    spatial = zip(x.shape[1:-1], kernel.shape[:count], strides, pads, extras, dilations)
    sizes = [(n - 1) * s - 2 * p + d * (k - 1) + 1 + e for n, k, s, p, e, d in spatial]
    beyond = [max(e - p, 0) for p, e in zip(pads, extras)]
    lift = (1,) * (2 - count)
    widths = tuple((p, p - e + b) for p, e, b in zip(pads, extras, beyond))
    run = _conv2d_transpose if max(dilations) == 1 else _conv2d_transpose_compiled
    out = run(
        *_lifted(x, kernel, count),
        (*lift, *[size - b for size, b in zip(sizes, beyond)], kernel.shape[-2]),
        (1, *lift, *strides, 1),
        ((0, 0), *((0, 0),) * len(lift), *widths, (0, 0)),
        (1, *lift, *dilations, 1),
    )
    if any(beyond):
        out = tf.pad(out, [[0, 0], *[[0, 0]] * len(lift), *[[0, b] for b in beyond], [0, 0]])
    return out[:, 0] if count == 1 else out


def _conv2d(x: Array, kernel: Array, strides: Any, pads: Any, dilations: Any) -> Array:
    pads = pads if isinstance(pads, str) else [list(pair) for pair in pads]
    return tf.nn.conv2d(x, kernel, list(strides), pads, dilations=list(dilations))


def _conv2d_transpose(
    x: Array, kernel: Array, sizes: Any, strides: Any, pads: Any, dilations: Any
) -> Array:
    """The transposed convolution to ``(N, *sizes)``: the batch is read from ``x`` in the graph
    (a constant once XLA knows the shapes), the rest is static."""
    size = tf.concat([tf.shape(x)[:1], tf.constant(sizes, tf.int32)], 0)
    pads = [list(pair) for pair in pads]
    return tf.nn.conv2d_transpose(x, kernel, size, list(strides), pads, dilations=list(dilations))


# Settings are tuples, so that each traces (and compiles) once per value.
_conv2d_compiled = tf.function(_conv2d, jit_compile=True, autograph=False)
_conv2d_transpose_compiled = tf.function(_conv2d_transpose, jit_compile=True, autograph=False)


def _pool_settings(
    x: Array, window: Pairish, stride: Pairish | None, padding: Pairish
) -> tuple[tuple[int, ...], tuple[int, ...], list[list[int]] | None]:
    """The windows, strides and (when there is padding) the pad widths of a pooling."""
    count = _spatial_axes(x)
    windows = per_axis(window, count, "window")
    strides = windows if stride is None else per_axis(stride, count, "stride")
    pads = per_axis(padding, count, "padding")
    widths = [[0, 0], *[[p, p] for p in pads], [0, 0]] if any(pads) else None
    return windows, strides, widths


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """``tf.nn.max_pool`` over ``x`` padded with -inf. Its gradient goes to the first maximum
    of each window (``MaxPoolGrad`` on CPU; XLA's select-and-scatter keeps the first too)."""
    windows, strides, widths = _pool_settings(x, window, stride, padding)
    if widths is not None:
        lowest = -math.inf if x.dtype.is_floating else x.dtype.min
        x = tf.pad(x, widths, constant_values=tf.constant(lowest, x.dtype))
    return tf.nn.max_pool(x, windows, strides, "VALID")


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """``tf.nn.avg_pool`` over ``x`` padded with zeros, divided by the same pool of a padded
    mask of ones: each window's sum over the count of its real positions."""
    windows, strides, widths = _pool_settings(x, window, stride, padding)
    if widths is None:
        return tf.nn.avg_pool(x, windows, strides, "VALID")
    share = tf.nn.avg_pool(tf.pad(tf.ones_like(x[:1, ..., :1]), widths), windows, strides, "VALID")
    return tf.nn.avg_pool(tf.pad(x, widths), windows, strides, "VALID") / share


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """The attention written out. With a mask, the softmax is taken over the kept scores only
    (the others are -inf before ``exp``, so no gradient passes them) and a row that keeps
    nothing divides zeros by one. A causal mask alone keeps at least the first score of every
    row, so it takes ``tf.nn.softmax`` of the masked scores: one kernel where the general form
    runs six."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = tf.linalg.matmul(query, key, transpose_b=True) * scale
    keep = mask
    if causal:
        rows = tf.range(tf.shape(scores)[-2])[:, None]
        lower = tf.math.greater_equal(rows, tf.range(tf.shape(scores)[-1]))
        keep = lower if keep is None else tf.math.logical_and(keep, lower)
    never = tf.constant(-math.inf, scores.dtype)
    if mask is None:  # every row keeps a score (the first, when causal)
        masked = scores if keep is None else tf.where(keep, scores, never)
        return tf.linalg.matmul(tf.nn.softmax(masked, -1), value)
    peak = tf.math.reduce_max(tf.where(keep, scores, never), -1, keepdims=True)
    peak = tf.stop_gradient(tf.where(tf.math.is_finite(peak), peak, tf.zeros_like(peak)))
    weights = tf.math.exp(tf.where(keep, scores - peak, never))
    total = tf.math.reduce_sum(weights, -1, keepdims=True)
    weights = weights / tf.where(total > 0, total, tf.ones_like(total))
    return tf.linalg.matmul(weights, value)
