"""Dense layers, activations, reshaping and the composites that chain or join layers."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from unitrain.models import (
    GELU,
    MLP,
    Concatenate,
    Dropout,
    Flatten,
    GatedMLP,
    Identity,
    Initialized,
    Linear,
    ReLU,
    Reshape,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Tanh,
)
from unitrain.onnx_export._graph import Converter, Graph, Value

__all__ = ["CONVERTERS", "activation"]


def linear(graph: Graph, prefix: str, x: Value, out_features: int, bias: bool) -> Value:
    """``x @ weight (+ bias)`` over the last axis: the canonical ``(in, out)`` weight is
    what ``MatMul`` multiplies by."""
    x = graph.channels_last(x, prefix)
    y = graph.op("MatMul", [x.name, graph.weight(prefix, "weight")], prefix)
    if bias:
        y = graph.op("Add", [y, graph.weight(prefix, "bias")], prefix)
    return Value(y, (*x.shape[:-1], out_features))


def _linear(graph: Graph, layer: Linear, prefix: str, x: Value) -> Value:
    return linear(graph, prefix, x, layer.out_features, layer.bias)


def activation(graph: Graph, name: str, prefix: str, x: Value) -> Value:
    """Activation ``name`` (as MLP and TransformerBlock name them) of ``x``, any layout."""
    if name in ("relu", "tanh", "sigmoid"):
        op_type = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[name]
        return dataclasses.replace(x, name=graph.op(op_type, [x.name], prefix))
    if name == "silu":
        gate = graph.op("Sigmoid", [x.name], prefix)
        return dataclasses.replace(x, name=graph.op("Mul", [x.name, gate], prefix))
    assert name == "gelu", name
    # The exact erf form, x * (1 + erf(x / sqrt 2)) / 2 (ONNX's Gelu operator needs opset 20).
    scaled = graph.op("Mul", [x.name, graph.scalar(1 / math.sqrt(2), prefix)], prefix)
    one_plus = graph.op("Add", [graph.op("Erf", [scaled], prefix), graph.scalar(1, prefix)], prefix)
    half = graph.op("Mul", [x.name, graph.scalar(0.5, prefix)], prefix)
    return dataclasses.replace(x, name=graph.op("Mul", [half, one_plus], prefix))


_ACTIVATION_NAMES: dict[type, str] = {
    ReLU: "relu",
    Tanh: "tanh",
    Sigmoid: "sigmoid",
    SiLU: "silu",
    GELU: "gelu",
}


def _activation_layer(graph: Graph, layer: Any, prefix: str, x: Value) -> Value:
    return activation(graph, _ACTIVATION_NAMES[type(layer)], prefix, x)


def _unchanged(graph: Graph, layer: Any, prefix: str, x: Value) -> Value:
    return x  # Dropout only drops in train mode; an export is evaluation


def _flatten(graph: Graph, layer: Flatten, prefix: str, x: Value) -> Value:
    x = graph.channels_last(x, prefix)  # unitrain flattens in channels-last order
    return Value(graph.op("Flatten", [x.name], prefix, axis=1), (math.prod(x.shape),))


def _reshape(graph: Graph, layer: Reshape, prefix: str, x: Value) -> Value:
    x = graph.channels_last(x, prefix)
    shape = layer.output_shape(x.shape)
    y = graph.op("Reshape", [x.name, graph.ints((-1, *shape), prefix)], prefix)
    return Value(y, shape)


def _chain(graph: Graph, layer: Any, prefix: str, x: Value) -> Value:
    return graph.chain(layer, prefix, x)


def _residual(graph: Graph, layer: Residual, prefix: str, x: Value) -> Value:
    branch = graph.chain(layer, prefix, x)
    x, branch = graph.same_layout([x, branch], prefix)
    return dataclasses.replace(x, name=graph.op("Add", [x.name, branch.name], prefix))


def _concatenate(graph: Graph, layer: Concatenate, prefix: str, x: Value) -> Value:
    names = layer.child_names()
    outputs = [graph.channels_last(graph.child(layer, prefix, n, x), prefix) for n in names]
    axis = layer.axis if layer.axis < 0 else layer.axis + 1
    y = graph.op("Concat", [o.name for o in outputs], prefix, axis=axis)
    return Value(y, layer.output_shape(x.shape))


def _gated_mlp(graph: Graph, layer: GatedMLP, prefix: str, x: Value) -> Value:
    gate = activation(graph, layer.activation, prefix, graph.child(layer, prefix, "gate", x))
    up = graph.child(layer, prefix, "up", x)
    product = Value(graph.op("Mul", [gate.name, up.name], prefix), up.shape)
    return graph.child(layer, prefix, "down", product)


CONVERTERS: dict[type, Converter] = {
    Linear: _linear,
    **dict.fromkeys(_ACTIVATION_NAMES, _activation_layer),
    Dropout: _unchanged,
    Identity: _unchanged,
    Flatten: _flatten,
    Reshape: _reshape,
    Sequential: _chain,
    MLP: _chain,
    Initialized: _chain,
    Residual: _residual,
    Concatenate: _concatenate,
    GatedMLP: _gated_mlp,
}
