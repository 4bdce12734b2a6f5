"""The walk over a model description that every native export shares: one builder per
layer type, looked up in a table, and one clear refusal for a type the table lacks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from unitrain._errors import ConfigError
from unitrain.models import AbstractLayer
from unitrain.onnx_export import CONVERTERS as ONNX_CONVERTERS
from unitrain.onnx_export._graph import join

__all__ = ["Builder", "Walker", "join"]

#: ``build(walker, layer, prefix, *inputs)``: one layer type in one framework.
Builder = Callable[..., Any]


class Walker:
    """Builds ``framework``'s form of each layer from ``builders``, reading ``weights``
    (canonical names) as float32."""

    def __init__(
        self,
        framework: str,
        builders: Mapping[type, Builder],
        weights: Mapping[str, np.ndarray],
    ) -> None:
        self.framework, self.builders, self.weights = framework, builders, weights

    def build(self, layer: AbstractLayer, prefix: str, *inputs: Any) -> Any:
        """``layer`` (canonical name ``prefix``) in the framework."""
        builder = self.builders.get(type(layer))
        if builder is None:
            raise self.refuse(layer, prefix, self._missing_reason(layer))
        return builder(self, layer, prefix, *inputs)

    def child(self, layer: AbstractLayer, prefix: str, name: str, *inputs: Any) -> Any:
        """``layer``'s child ``name`` in the framework."""
        child = layer.child(name)
        assert child is not None, f"{layer.describe()} has no child {name!r}"
        return self.build(child, join(prefix, name), *inputs)

    def array(self, prefix: str, local: str) -> np.ndarray:
        """Parameter or state ``local`` of the layer at ``prefix`` in float32."""
        return np.asarray(self.weights[join(prefix, local)], np.float32)

    def refuse(self, layer: AbstractLayer, prefix: str, reason: str) -> ConfigError:
        """The error for a layer this framework cannot express faithfully."""
        where = f"'{prefix}'" if prefix else "the top"
        return ConfigError(
            f"export_native: {layer.describe()} (at {where}) has no {self.framework} form: {reason}"
        )

    def _missing_reason(self, layer: AbstractLayer) -> str:
        if type(layer) in ONNX_CONVERTERS:
            return (
                "docs/export.md lists the layers each framework takes; export_onnx writes "
                "every built-in layer"
            )
        return (
            "a layer of your own is written in unitrain.ops, not in the framework's layers; "
            "export it with export_onnx (traced op by op), or write it as a "
            f"{self.framework} layer and load its weights by their canonical names"
        )
