"""The graph under construction: values with their shapes, nodes, initializers and names.

Every name is made from the layer's canonical name and a counter that restarts for each
graph, so the same model and weights give the same nodes in the same order, and the same
bytes, whichever backend wrote the checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from unitrain.models import AbstractLayer, Shape

__all__ = ["Graph", "Value", "join"]


@dataclasses.dataclass(frozen=True)
class Value:
    """A tensor of the graph: its name and the shape of one example in unitrain's layout.

    ``channels_first`` says that the tensor itself holds the channels (the last axis of
    ``shape``) right after the batch axis, as ONNX's image operators want them; consecutive
    image layers keep that layout instead of transposing back and forth.
    """

    name: str
    shape: Shape
    channels_first: bool = False


#: ``convert(graph, layer, prefix, x) -> output``: how one layer type becomes nodes.
Converter = Callable[["Graph", Any, str, Value], Value]


def join(prefix: str, name: str) -> str:
    """A child's canonical prefix, as the models name parameters (a "" child is transparent)."""
    if not name:
        return prefix
    return f"{prefix}.{name}" if prefix else name


class Graph:
    """Nodes and initializers of one exported model, built layer by layer.

    Args:
        weights: the model's parameters and state under canonical names.
        converters: how each layer type becomes nodes.
        fallback: how a layer of any other type does (its forward traced op by op).
    """

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        converters: Mapping[type, Converter],
        fallback: Converter,
    ) -> None:
        self.weights, self.converters, self.fallback = weights, converters, fallback
        self.nodes: list[Any] = []
        self.initializers: dict[str, np.ndarray] = {}
        self._counter = 0

    def layer(self, layer: AbstractLayer, prefix: str, x: Value) -> Value:
        """The nodes of ``layer`` (canonical name ``prefix``) applied to ``x``."""
        converter = self.converters.get(type(layer), self.fallback)
        return converter(self, layer, prefix, x)

    def child(self, layer: AbstractLayer, prefix: str, name: str, x: Value) -> Value:
        """The nodes of ``layer``'s child ``name`` applied to ``x``."""
        child = layer.child(name)
        assert child is not None, f"{layer.describe()} has no child {name!r}"
        return self.layer(child, join(prefix, name), x)

    def chain(self, layer: AbstractLayer, prefix: str, x: Value) -> Value:
        """``layer``'s children one after the other on ``x``."""
        for name in layer.child_names():
            x = self.child(layer, prefix, name, x)
        return x

    # -- initializers ---------------------------------------------------------------------------

    def array(self, prefix: str, local: str) -> np.ndarray:
        """Parameter or state ``local`` of the layer at ``prefix``, as stored."""
        return np.asarray(self.weights[join(prefix, local)])

    def weight(self, prefix: str, local: str, transform: str = "", array: Any = None) -> str:
        """The initializer of parameter or state ``local`` of the layer at ``prefix``, in
        float32; ``transform`` names a rearranged copy, made from ``array``."""
        name = join(prefix, local)
        value = self.weights[name] if array is None else array
        return self.constant(np.asarray(value), f"{name}{':' if transform else ''}{transform}")

    def constant(self, value: np.ndarray, name: str) -> str:
        """An initializer named ``name`` (float arrays become float32)."""
        if value.dtype.kind == "f":
            value = value.astype(np.float32)
        self.initializers[name] = np.ascontiguousarray(value)
        return name

    def ints(self, values: Sequence[int], prefix: str) -> str:
        """An int64 initializer (shapes, axes) named after the layer and a counter."""
        return self.constant(np.asarray(values, np.int64), self.name_for(prefix, "ints"))

    def scalar(self, value: float, prefix: str) -> str:
        """A float32 scalar initializer."""
        return self.constant(np.asarray(value, np.float32), self.name_for(prefix, "scalar"))

    # -- nodes ----------------------------------------------------------------------------------

    def op(self, op_type: str, inputs: Sequence[str], prefix: str, **attributes: Any) -> str:
        """Add one node; return its (only) output's name."""
        return self.op_outputs(op_type, inputs, prefix, 1, **attributes)[0]

    def op_outputs(
        self, op_type: str, inputs: Sequence[str], prefix: str, count: int, **attributes: Any
    ) -> list[str]:
        """Add one node with ``count`` outputs; return their names."""
        from onnx import helper

        name = self.name_for(prefix, op_type)
        outputs = [name] if count == 1 else [f"{name}:{i}" for i in range(count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name, **attributes))
        return outputs

    def name_for(self, prefix: str, kind: str) -> str:
        """A new node or constant name: the layer's prefix, the kind and a counter."""
        self._counter += 1
        return f"{prefix or 'model'}/{kind}_{self._counter}"

    # -- layouts --------------------------------------------------------------------------------

    def channels_first(self, x: Value, prefix: str) -> Value:
        """``x`` with its channels right after the batch axis (ONNX's image layout)."""
        rank = len(x.shape) + 1
        if x.channels_first or rank < 3:
            return dataclasses.replace(x, channels_first=rank >= 3)
        perm = [0, rank - 1, *range(1, rank - 1)]
        return Value(self.op("Transpose", [x.name], prefix, perm=perm), x.shape, True)

    def channels_last(self, x: Value, prefix: str) -> Value:
        """``x`` in unitrain's layout, channels last."""
        if not x.channels_first:
            return x
        rank = len(x.shape) + 1
        perm = [0, *range(2, rank), 1]
        return Value(self.op("Transpose", [x.name], prefix, perm=perm), x.shape, False)

    def same_layout(self, values: Sequence[Value], prefix: str) -> list[Value]:
        """``values`` in one layout: channels first only if all of them already are."""
        if all(v.channels_first for v in values):
            return list(values)
        return [self.channels_last(v, prefix) for v in values]
