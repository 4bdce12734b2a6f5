"""Normalisation layers in eval mode.

BatchNorm becomes ``BatchNormalization`` with the running statistics as they are in the
checkpoint (not folded into the convolution before it): the file then holds the trained
statistics under their canonical names, and the graph computes what ``predict`` computes,
``(x - mean) / sqrt(var + eps) * weight + bias``, with no rounding of a folded kernel.
"""

from __future__ import annotations

import dataclasses

from unitrain.models import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from unitrain.onnx_export._graph import Converter, Graph, Value

__all__ = ["CONVERTERS"]


def _batch_norm(graph: Graph, layer: BatchNorm, prefix: str, x: Value) -> Value:
    x = graph.channels_first(x, prefix)  # BatchNormalization's channels are axis 1
    inputs = [x.name] + [
        graph.weight(prefix, name) for name in ("weight", "bias", "running_mean", "running_var")
    ]
    y = graph.op("BatchNormalization", inputs, prefix, epsilon=layer.eps)
    return dataclasses.replace(x, name=y)


def _layer_norm(graph: Graph, layer: LayerNorm, prefix: str, x: Value) -> Value:
    x = graph.channels_last(x, prefix)
    inputs = [x.name, graph.weight(prefix, "weight")]
    if layer.bias:  # LayerNormalization's bias input is optional
        inputs.append(graph.weight(prefix, "bias"))
    y = graph.op("LayerNormalization", inputs, prefix, axis=-1, epsilon=layer.eps)
    return dataclasses.replace(x, name=y)


def _reciprocal_root(graph: Graph, variance: str, eps: float, prefix: str) -> str:
    """``1 / sqrt(variance + eps)``."""
    shifted = graph.op("Add", [variance, graph.scalar(eps, prefix)], prefix)
    return graph.op("Reciprocal", [graph.op("Sqrt", [shifted], prefix)], prefix)


def _rms_norm(graph: Graph, layer: RMSNorm, prefix: str, x: Value) -> Value:
    x = graph.channels_last(x, prefix)
    square = graph.op("Mul", [x.name, x.name], prefix)
    mean = graph.op("ReduceMean", [square, graph.ints((-1,), prefix)], prefix, keepdims=1)
    scaled = graph.op("Mul", [x.name, _reciprocal_root(graph, mean, layer.eps, prefix)], prefix)
    y = graph.op("Mul", [scaled, graph.weight(prefix, "weight")], prefix)
    return dataclasses.replace(x, name=y)


def _group_norm(graph: Graph, layer: GroupNorm, prefix: str, x: Value) -> Value:
    # As the layer computes it: (N, *positions, groups, channels per group), statistics over
    # the positions and the group's channels, the biased variance.
    x = graph.channels_last(x, prefix)
    positions = x.shape[:-1]
    grouped_shape = (-1, *positions, layer.groups, layer.num_channels // layer.groups)
    grouped = graph.op("Reshape", [x.name, graph.ints(grouped_shape, prefix)], prefix)
    axes = graph.ints((*range(1, len(positions) + 1), len(positions) + 2), prefix)
    mean = graph.op("ReduceMean", [grouped, axes], prefix, keepdims=1)
    centred = graph.op("Sub", [grouped, mean], prefix)
    variance = graph.op(
        "ReduceMean", [graph.op("Mul", [centred, centred], prefix), axes], prefix, keepdims=1
    )
    normalised = graph.op(
        "Mul", [centred, _reciprocal_root(graph, variance, layer.eps, prefix)], prefix
    )
    flat = graph.op("Reshape", [normalised, graph.ints((-1, *x.shape), prefix)], prefix)
    scaled = graph.op("Mul", [flat, graph.weight(prefix, "weight")], prefix)
    return dataclasses.replace(
        x, name=graph.op("Add", [scaled, graph.weight(prefix, "bias")], prefix)
    )


CONVERTERS: dict[type, Converter] = {
    BatchNorm: _batch_norm,
    LayerNorm: _layer_norm,
    RMSNorm: _rms_norm,
    GroupNorm: _group_norm,
}
