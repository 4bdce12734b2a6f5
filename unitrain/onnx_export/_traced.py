"""Layers of your own, exported op by op: their forward run once on symbolic tensors.

A layer with no converter of its own but a ``forward`` written in :mod:`unitrain.ops` is run
in eval mode with this module's ops active: each op call (and each array operator) adds its
ONNX nodes and returns a :class:`Symbolic` tensor. Children of a built-in type go through
their converters. An op with no mapping here raises ConfigError naming the op and the layer,
so nothing is exported that does not compute what the layer computes.

The batch axis is free: ``ops.shape(x)[0]`` is a marker that ``reshape`` keeps as the batch
axis; arithmetic on it is refused where it would fix the batch size into the graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models import AbstractLayer, Pass, Scope
from unitrain.onnx_export._graph import Graph, Value, join
from unitrain.onnx_export._symbolic import Symbolic, example_shape, kind_of
from unitrain.onnx_export._tracer import Tracer

__all__ = ["convert_by_ops"]


class _Weights(Mapping[str, Any]):
    """The model's tensors as Symbolic initializers, made when a layer reads them."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __getitem__(self, name: str) -> Symbolic:
        graph = self.tracer.graph
        array = graph.array(name, "")
        return Symbolic(self.tracer, graph.weight(name, ""), array.shape, kind_of(array.dtype))

    def __iter__(self) -> Iterator[str]:
        return iter(self.tracer.graph.weights)

    def __len__(self) -> int:
        return len(self.tracer.graph.weights)


class _TracingScope(Scope):
    """A Scope whose children of a built-in type go through their converters."""

    def call(self, name: str, *inputs: Any) -> Any:
        layer = self.layer.child(name)
        tracer: Tracer = ops.current()
        prefix = join(self._prefix, name)
        if layer is None or type(layer) not in tracer.graph.converters or len(inputs) != 1:
            outer = tracer.layer, tracer.prefix
            if layer is not None:  # its ops are named after it, and errors name it
                tracer.layer, tracer.prefix = layer, prefix
            try:
                return super().call(name, *inputs)
            finally:
                tracer.layer, tracer.prefix = outer
        x = tracer.tensor(inputs[0])
        graph = tracer.graph
        out = graph.layer(layer, prefix, Value(x.name, example_shape(x)))
        out = graph.channels_last(out, tracer.prefix)
        return Symbolic(tracer, out.name, (None, *out.shape))


def convert_by_ops(graph: Graph, layer: AbstractLayer, prefix: str, x: Value) -> Value:
    """``layer``'s forward traced op by op into ``graph`` (eval mode)."""
    x = graph.channels_last(x, prefix)
    tracer = Tracer(graph, layer, prefix)
    weights = _Weights(tracer)
    run = Pass(weights, weights, training=False)
    token = ops.enter(tracer)  # type: ignore[arg-type]
    try:
        out = layer.forward(
            _TracingScope(layer, run, prefix), Symbolic(tracer, x.name, (None, *x.shape))
        )
    finally:
        ops.leave(token)
    out = tracer.tensor(out)
    if not out.shape or out.shape[0] is not None or out.kind != "float":
        raise ConfigError(
            f"export_onnx: {type(layer).__name__} (at {prefix or 'the top'}) gave no float "
            "tensor with a batch axis; a layer's output keeps the batch axis of its input"
        )
    return Value(out.name, example_shape(out))
