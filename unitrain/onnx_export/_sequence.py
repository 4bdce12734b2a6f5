"""Embeddings, attention and Transformer blocks on ``(N, L)`` ids and ``(N, L, D)`` features.

The sequence length is the one the model was exported for (position tables, causal masks
and rotary angles are constants of that length); the batch axis stays free.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from unitrain.models import (
    Embedding,
    MultiHeadAttention,
    PositionalEmbedding,
    SinusoidalPositionalEmbedding,
    TransformerBlock,
)
from unitrain.models._sequence import _rotary_tables
from unitrain.onnx_export._dense import activation, linear
from unitrain.onnx_export._graph import Converter, Graph, Value, join

__all__ = ["CONVERTERS"]


def _embedding(graph: Graph, layer: Embedding, prefix: str, x: Value) -> Value:
    y = graph.op("Gather", [graph.weight(prefix, "weight"), x.name], prefix, axis=0)
    return Value(y, (*x.shape, layer.dim))


def _positional_embedding(graph: Graph, layer: PositionalEmbedding, prefix: str, x: Value) -> Value:
    length = x.shape[0]
    table = graph.weight(prefix, "weight", f"[:{length}]", graph.array(prefix, "weight")[:length])
    return dataclasses.replace(x, name=graph.op("Add", [x.name, table], prefix))


def _sinusoidal(graph: Graph, layer: SinusoidalPositionalEmbedding, prefix: str, x: Value) -> Value:
    table = graph.constant(layer.table(x.shape[0]), f"{prefix or 'model'}/positions")
    return dataclasses.replace(x, name=graph.op("Add", [x.name, table], prefix))


def _rotate(graph: Graph, y: str, length: int, size: int, prefix: str) -> str:
    """Rotary positions of ``y`` ``(N, H, L, size)``: ``y * cos + [-second, first] * sin``."""
    cos, sin = _rotary_tables(length, size, 10000.0)
    half = size // 2
    first = graph.op(
        "Slice",
        [y, graph.ints((0,), prefix), graph.ints((half,), prefix), graph.ints((3,), prefix)],
        prefix,
    )
    second = graph.op(
        "Slice",
        [y, graph.ints((half,), prefix), graph.ints((size,), prefix), graph.ints((3,), prefix)],
        prefix,
    )
    turned = graph.op("Concat", [graph.op("Neg", [second], prefix), first], prefix, axis=-1)
    cos_name = graph.constant(cos, f"{prefix or 'model'}/rotary_cos")
    sin_name = graph.constant(sin, f"{prefix or 'model'}/rotary_sin")
    return graph.op(
        "Add",
        [graph.op("Mul", [y, cos_name], prefix), graph.op("Mul", [turned, sin_name], prefix)],
        prefix,
    )


def _attention(graph: Graph, layer: MultiHeadAttention, prefix: str, x: Value) -> Value:
    length, heads, size = x.shape[0], layer.heads, layer.head_dim

    def heads_of(part: str) -> str:  # (N, L, E) -> (N, H, L, Dh)
        y = linear(graph, join(prefix, part), x, layer.dim, layer.bias).name
        split = graph.op("Reshape", [y, graph.ints((-1, length, heads, size), prefix)], prefix)
        y = graph.op("Transpose", [split], prefix, perm=[0, 2, 1, 3])
        return _rotate(graph, y, length, size, prefix) if layer.rotary and part != "value" else y

    q, k, v = heads_of("query"), heads_of("key"), heads_of("value")
    keys = graph.op("Transpose", [k], prefix, perm=[0, 1, 3, 2])
    scores = graph.op("MatMul", [q, keys], prefix)
    scores = graph.op("Div", [scores, graph.scalar(math.sqrt(size), prefix)], prefix)
    if layer.causal:  # position i sees positions j <= i
        allowed = graph.constant(
            np.tril(np.ones((length, length), bool)), f"{prefix or 'model'}/causal"
        )
        scores = graph.op("Where", [allowed, scores, graph.scalar(-np.inf, prefix)], prefix)
    weights = graph.op("Softmax", [scores], prefix, axis=-1)
    mixed = graph.op("MatMul", [weights, v], prefix)
    mixed = graph.op("Transpose", [mixed], prefix, perm=[0, 2, 1, 3])
    merged = graph.op("Reshape", [mixed, graph.ints((-1, length, layer.dim), prefix)], prefix)
    return linear(graph, join(prefix, "out"), Value(merged, x.shape), layer.dim, layer.bias)


def _transformer_block(graph: Graph, layer: TransformerBlock, prefix: str, x: Value) -> Value:
    def call(name: str, h: Value) -> Value:
        return graph.child(layer, prefix, name, h)

    def add(a: Value, b: Value) -> Value:
        return dataclasses.replace(a, name=graph.op("Add", [a.name, b.name], prefix))

    def feed_forward(h: Value) -> Value:
        return call("fc2", activation(graph, layer.activation, prefix, call("fc1", h)))

    x = graph.channels_last(x, prefix)
    if layer.norm == "post":
        x = call("norm1", add(x, call("attention", x)))
        return call("norm2", add(x, feed_forward(x)))
    x = add(x, call("attention", call("norm1", x)))
    return add(x, feed_forward(call("norm2", x)))


CONVERTERS: dict[type, Converter] = {
    Embedding: _embedding,
    PositionalEmbedding: _positional_embedding,
    SinusoidalPositionalEmbedding: _sinusoidal,
    MultiHeadAttention: _attention,
    TransformerBlock: _transformer_block,
}
