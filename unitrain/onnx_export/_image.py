"""Convolutions, pooling and upsampling: ONNX's channels-first operators on unitrain's
channels-last tensors, with kernels rearranged from the canonical layouts."""

from __future__ import annotations

from collections.abc import Sequence

from unitrain.models import (
    AvgPool2d,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    GlobalAvgPool,
    MaxPool2d,
    Upsample,
)
from unitrain.models._base import as_pair
from unitrain.onnx_export._graph import Converter, Graph, Value

__all__ = ["CONVERTERS", "conv_padding", "same_padding"]


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis, the odd one after, as the layer computes it."""
    out = -(-size // stride)
    total = max((out - 1) * stride + dilation * (kernel - 1) + 1 - size, 0)
    return total // 2, total - total // 2


def _per_axis(value: object) -> list[int]:
    """A conv field normalised to one int per spatial axis (a tuple) as a list."""
    assert isinstance(value, tuple), "fields are normalised to tuples in __post_init__"
    return [int(n) for n in value]


def conv_padding(layer: Conv2d | Conv1d, spatial: Sequence[int]) -> list[tuple[int, int]]:
    """The zeros ``(before, after)`` a convolution adds on each spatial axis of an input
    whose spatial sizes are ``spatial``: explicit, none (``"valid"``) or TensorFlow's
    ``"same"`` (the native exports pad the same way as this file's ``Conv`` nodes)."""
    kernel_size, stride, dilation = (
        _per_axis(getattr(layer, name)) for name in ("kernel_size", "stride", "dilation")
    )
    if layer.padding == "same":
        return [
            same_padding(size, k, s, d)
            for size, k, s, d in zip(spatial, kernel_size, stride, dilation)
        ]
    sizes = [0] * layer.rank if layer.padding == "valid" else _per_axis(layer.padding)
    return [(p, p) for p in sizes]


def _conv(graph: Graph, layer: Conv2d | Conv1d, prefix: str, x: Value) -> Value:
    kernel_size, stride, dilation = (
        _per_axis(getattr(layer, name)) for name in ("kernel_size", "stride", "dilation")
    )
    pairs = conv_padding(layer, x.shape[:-1])
    # (*window, in / groups, out) -> (out, in / groups, *window)
    kernel = graph.array(prefix, "weight")
    order = (layer.rank + 1, layer.rank, *range(layer.rank))
    inputs = [
        graph.channels_first(x, prefix).name,
        graph.weight(prefix, "weight", "oihw", kernel.transpose(order)),
    ]
    if layer.bias:
        inputs.append(graph.weight(prefix, "bias"))
    y = graph.op(
        "Conv",
        inputs,
        prefix,
        kernel_shape=kernel_size,
        strides=stride,
        dilations=dilation,
        group=layer.groups,
        pads=[before for before, _ in pairs] + [after for _, after in pairs],
    )
    return Value(y, layer.output_shape(x.shape), True)


def _conv_transpose(graph: Graph, layer: ConvTranspose2d, prefix: str, x: Value) -> Value:
    # (kh, kw, out, in) -> ONNX's (in, out, kh, kw)
    kernel = graph.array(prefix, "weight")
    inputs = [
        graph.channels_first(x, prefix).name,
        graph.weight(prefix, "weight", "iohw", kernel.transpose(3, 2, 0, 1)),
    ]
    if layer.bias:
        inputs.append(graph.weight(prefix, "bias"))
    padding = list(as_pair(layer.padding))
    y = graph.op(
        "ConvTranspose",
        inputs,
        prefix,
        kernel_shape=list(as_pair(layer.kernel_size)),
        strides=list(as_pair(layer.stride)),
        dilations=list(as_pair(layer.dilation)),
        pads=padding + padding,
        output_padding=list(as_pair(layer.output_padding)),
    )
    return Value(y, layer.output_shape(x.shape), True)


def _pool(graph: Graph, layer: MaxPool2d | AvgPool2d, prefix: str, x: Value) -> Value:
    op_type = "MaxPool" if isinstance(layer, MaxPool2d) else "AveragePool"
    y = graph.op(
        op_type,
        [graph.channels_first(x, prefix).name],
        prefix,
        kernel_shape=list(as_pair(layer.kernel_size)),
        strides=list(as_pair(layer.stride)),
    )
    return Value(y, layer.output_shape(x.shape), True)


def _global_avg_pool(graph: Graph, layer: GlobalAvgPool, prefix: str, x: Value) -> Value:
    axes = (2, 3) if x.channels_first else (1, 2)
    y = graph.op("ReduceMean", [x.name, graph.ints(axes, prefix)], prefix, keepdims=0)
    return Value(y, layer.output_shape(x.shape))


def _upsample(graph: Graph, layer: Upsample, prefix: str, x: Value) -> Value:
    # Each pixel repeated, as the layer's forward does it: (N, H, 1, W, 1, C) broadcast to
    # (N, H, sh, W, sw, C), exact in any runtime (Resize's coordinate rules are not needed).
    x = graph.channels_last(x, prefix)
    (height, width, channels), (sh, sw) = x.shape, as_pair(layer.scale)
    spread = graph.op(
        "Reshape", [x.name, graph.ints((-1, height, 1, width, 1, channels), prefix)], prefix
    )
    target = graph.ints((1, height, sh, width, sw, channels), prefix)
    spread = graph.op("Expand", [spread, target], prefix)
    out = layer.output_shape(x.shape)
    return Value(graph.op("Reshape", [spread, graph.ints((-1, *out), prefix)], prefix), out)


CONVERTERS: dict[type, Converter] = {
    Conv2d: _conv,
    Conv1d: _conv,
    ConvTranspose2d: _conv_transpose,
    MaxPool2d: _pool,
    AvgPool2d: _pool,
    GlobalAvgPool: _global_avg_pool,
    Upsample: _upsample,
}
