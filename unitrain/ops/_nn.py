"""The network ops of the contract: softmax, convolution and its transpose, pooling, attention,
layer normalisation.

They are here, apart from the array operations in :mod:`unitrain.ops`, as each backend keeps
them apart in its ``_ops_nn`` module; :mod:`unitrain.ops` exports them.
"""

from __future__ import annotations

from unitrain.ops._dispatch import current
from unitrain.ops._types import Array, Pairish


def softmax(x: Array, axis: int = -1) -> Array:
    """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the maximum."""
    return current().softmax(x, axis)


def log_softmax(x: Array, axis: int = -1) -> Array:
    """``x - logsumexp(x)`` along ``axis``."""
    return current().log_softmax(x, axis)


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """``x @ weight + bias`` over the last axis of ``x``; ``weight`` is ``(in, out)``.

    One op rather than ``matmul`` and ``+``, so that a backend adds the bias inside the
    product's kernel (torch's ``addmm``), and so that under torch's autocast the output stays
    in the compute dtype (a float32 bias added after a bfloat16 product would promote it).
    """
    return current().linear(x, weight, bias)


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
    bias: Array | None = None,
) -> Array:
    """Cross-correlation over 1 or 2 spatial axes, channels last.

    ``x`` is ``(N, *spatial, C_in)`` and ``kernel`` ``(*window, C_in // groups, C_out)``.
    ``padding`` is zeros on both sides (an int, or one int per spatial axis), ``"valid"``
    (none) or ``"same"``: the output has ``ceil(size / stride)`` positions and the padding
    that takes is split with the extra one after, TensorFlow's rule (torch allows "same"
    only at stride 1; its symmetric padding gives other numbers at stride 2). ``bias``
    ``(C_out,)`` is added to every position, inside the kernel where the backend can.
    """
    return current().conv(x, kernel, stride, padding, dilation, groups, bias)


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    """The gradient of :func:`conv` with respect to its input, as a layer (a "deconvolution").

    ``x`` is ``(N, *spatial, C_in)`` and ``kernel`` ``(*window, C_out, C_in)``: the kernel of
    the :func:`conv` whose input gradient this is. Each output axis has
    ``(size - 1) * stride - 2 * padding + dilation * (window - 1) + output_padding + 1``
    positions, as in torch's ``ConvTranspose``.
    """
    return current().conv_transpose(x, kernel, stride, padding, output_padding, dilation)


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """The maximum over each window of 1 or 2 spatial axes, channels last; ``stride`` None is
    ``window``. Padding never wins (it is -inf). The gradient goes to the first maximum of each
    window, as in torch."""
    return current().max_pool(x, window, stride, padding)


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    """The mean over each window of 1 or 2 spatial axes, channels last; padded positions are
    left out of the count (TensorFlow's rule; torch's ``count_include_pad=False``)."""
    return current().avg_pool(x, window, stride, padding)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """``softmax(query @ key^T * scale + bias) @ value`` over the last two axes.

    ``query`` is ``(..., L, D)``, ``key`` ``(..., S, D)``, ``value`` ``(..., S, Dv)``; ``scale``
    None is ``1 / sqrt(D)``. ``mask`` (bools broadcastable to ``(..., L, S)``) keeps the
    positions where it is true; ``causal`` keeps ``s <= l``. A row that keeps nothing gives
    zeros, not NaN.
    """
    return current().scaled_dot_product_attention(query, key, value, mask, causal, scale)


def layer_norm(
    x: Array, weight: Array | None = None, bias: Array | None = None, eps: float = 1e-5
) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (the biased
    variance), ``weight`` and ``bias`` of the last axis's size or None.

    float16 and bfloat16 inputs are normalised in float32 (statistics in the low dtype lose
    the digits that matter), with ``weight`` and ``bias`` in float32, and the result handed on
    in the input's dtype, as torch's autocast, Keras and Flax do. One op, so that a backend
    with a fused kernel uses it (torch's ``layer_norm``: one kernel forward and one backward,
    where the composed form is eight); :func:`unitrain.ops.composed.layer_norm_of` is the
    composed form.
    """
    return current().layer_norm(x, weight, bias, eps)


def stop_gradient(x: Array) -> Array:
    """``x``, through which no gradient flows."""
    return current().stop_gradient(x)
