"""The torch adapter's network ops: convolutions, pooling and attention, channels last.

:mod:`.ops` imports them, so that it holds the whole contract. They live apart because they
share one job, fitting the contract's layouts to torch's: images moved to channels-first
order, kernels permuted to torch's, padding that torch's layers refuse added with ``F.pad``.
What was checked against torch's kernels:

- ``max_pool`` sends the gradient to the first maximum of a window, as torch's kernels do.
- ``scaled_dot_product_attention`` mends rows that keep nothing around torch's fused kernel,
  whose answer for them depends on the kernel chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from unitrain.ops import Array, Pairish
from unitrain.ops.windows import per_axis, same_padding

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
    bias: Array | None = None,
) -> Array:
    """torch's conv; ``"same"`` pads as TensorFlow does (extra one after) with ``F.pad`` when
    the two sides differ, through the conv's own padding when they do not."""
    function = _spatial_function(_CONV, x, "conv")
    inputs = x.movedim(-1, 1)
    if padding == "same":
        spatial = x.ndim - 2
        strides, dilations = (
            per_axis(stride, spatial, "stride"),
            per_axis(dilation, spatial, "dilation"),
        )
        pads = [
            same_padding(n, k, s, d)
            for n, k, s, d in zip(x.shape[1:-1], kernel.shape[:spatial], strides, dilations)
        ]
        before, after = [b for b, _ in pads], [a for _, a in pads]
        if before == after:
            padding = tuple(before)
        else:
            inputs, padding = _pad_spatial(inputs, before, after, 0.0), 0
    elif padding == "valid":
        padding = 0
    out = function(inputs, _torch_kernel(kernel), bias, stride, padding, dilation, groups)
    return out.movedim(1, -1)


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """``addmm`` (``mm`` without a bias) over the rows of ``x`` flattened to a matrix.

    One kernel for product and bias, and under autocast all three operands are cast to the
    compute dtype, so the output stays bfloat16/float16 as ``nn.Linear``'s does; a separate
    ``+ bias`` would add the float32 bias and promote every later op to float32 (a pre-LN
    Transformer step on the CPU took 1.2x the time under bf16-mixed).
    """
    rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
    out = torch.mm(rows, weight) if bias is None else torch.addmm(bias, rows, weight)
    return out if x.ndim == 2 else out.view(*x.shape[:-1], weight.shape[1])


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
    windows, pads = per_axis(window, x.ndim - 2, "window"), per_axis(padding, x.ndim - 2, "padding")
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
    windows, pads = per_axis(window, x.ndim - 2, "window"), per_axis(padding, x.ndim - 2, "padding")
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


def layer_norm(
    x: Array, weight: Array | None = None, bias: Array | None = None, eps: float = 1e-5
) -> Array:
    """``F.layer_norm``: one kernel forward and one backward, where the composed form runs
    eight of each. float16 and bfloat16 go through it in float32 and come back in their own
    dtype, the contract's rule (autocast alone would hand on float32)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        weight = None if weight is None else weight.to(torch.float32)
        bias = None if bias is None else bias.to(torch.float32)
        return F.layer_norm(x.to(torch.float32), x.shape[-1:], weight, bias, eps).to(x.dtype)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
