"""The two Keras layers Keras lacks for a portable layer: positions added to a sequence.

Both are registered for serialization under the package ``unitrain``, so a ``.keras``
file that holds them loads once this module is imported (``import
unitrain.native_export.keras_layers``), or with them as ``custom_objects``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from unitrain.models._sinusoidal import _table

__all__ = ["LearnedPositions", "SinusoidalPositions"]


@keras.saving.register_keras_serializable(package="unitrain")
class LearnedPositions(keras.layers.Layer):
    """Adds the first ``L`` rows of a learned ``(max_len, dim)`` table to ``(N, L, dim)``."""

    def __init__(self, max_len: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_len, self.dim = max_len, dim
        self.table = self.add_weight(shape=(max_len, dim), initializer="zeros", name="table")

    def call(self, x: Any) -> Any:
        return x + self.table[: keras.ops.shape(x)[1]]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "max_len": self.max_len, "dim": self.dim}


@keras.saving.register_keras_serializable(package="unitrain")
class SinusoidalPositions(keras.layers.Layer):
    """Adds the fixed sine/cosine signal of ``length`` positions to ``(N, length, dim)``."""

    def __init__(self, length: int, dim: int, base: float = 10000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length, self.dim, self.base = length, dim, base
        self.signal = np.asarray(_table(length, dim, float(base)), np.float32)

    def call(self, x: Any) -> Any:
        return x + keras.ops.convert_to_tensor(self.signal, x.dtype)

    def get_config(self) -> dict[str, Any]:
        config = {"length": self.length, "dim": self.dim, "base": self.base}
        return {**super().get_config(), **config}
