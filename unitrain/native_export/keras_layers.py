"""The Keras layers Keras lacks for a portable layer: positions added to a sequence, attention
with rotary positions, and the saved state a stateful recurrent layer starts from.

All are registered for serialization under the package ``unitrain``, so a ``.keras``
file that holds them loads once this module is imported (``import
unitrain.native_export.keras_layers``), or with them as ``custom_objects``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from unitrain.models._sequence import _rotary_tables
from unitrain.models._sinusoidal import _table

__all__ = ["LearnedPositions", "RotaryAttention", "SavedStates", "SinusoidalPositions"]


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


@keras.saving.register_keras_serializable(package="unitrain")
class RotaryAttention(keras.layers.Layer):
    """Self-attention on ``(N, L, dim)`` with rotary positions (the half-split form, base
    10000) on queries and keys: ``keras.layers.MultiHeadAttention`` has no rotary positions.

    Weights, in ``set_weights`` order: the query, key, value and output kernels ``(dim,
    dim)``, each followed by its bias ``(dim,)`` when ``use_bias``.
    """

    def __init__(self, dim: int, heads: int, causal: bool, use_bias: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dim, self.heads, self.causal, self.use_bias = dim, heads, causal, use_bias
        self.projections = []
        for part in ("query", "key", "value", "out"):
            kernel = self.add_weight(shape=(dim, dim), initializer="zeros", name=f"{part}_kernel")
            bias = (
                self.add_weight(shape=(dim,), initializer="zeros", name=f"{part}_bias")
                if use_bias
                else None
            )
            self.projections.append((kernel, bias))

    def _project(self, x: Any, index: int) -> Any:
        kernel, bias = self.projections[index]
        y = keras.ops.matmul(x, kernel)
        return y if bias is None else y + bias

    def call(self, x: Any) -> Any:
        length, size = x.shape[1], self.dim // self.heads

        def heads_of(y: Any) -> Any:  # (N, L, dim) -> (N, heads, L, size)
            return keras.ops.transpose(
                keras.ops.reshape(y, (-1, length, self.heads, size)), (0, 2, 1, 3)
            )

        cos, sin = (
            keras.ops.convert_to_tensor(t, x.dtype) for t in _rotary_tables(length, size, 10000.0)
        )

        def rotate(y: Any) -> Any:
            first, second = y[..., : size // 2], y[..., size // 2 :]
            return y * cos + keras.ops.concatenate([-second, first], axis=-1) * sin

        q, k, v = (heads_of(self._project(x, i)) for i in range(3))
        scores = keras.ops.matmul(rotate(q), keras.ops.transpose(rotate(k), (0, 1, 3, 2)))
        scores = scores / np.sqrt(size).astype(np.float32)
        if self.causal:
            allowed = np.tril(np.ones((length, length), bool))
            scores = keras.ops.where(allowed, scores, keras.ops.full_like(scores, -1e30))
        mixed = keras.ops.matmul(keras.ops.softmax(scores, axis=-1), v)
        mixed = keras.ops.reshape(keras.ops.transpose(mixed, (0, 2, 1, 3)), (-1, length, self.dim))
        return self._project(mixed, 3)

    def get_config(self) -> dict[str, Any]:
        config = {"dim": self.dim, "heads": self.heads, "causal": self.causal}
        return {**super().get_config(), **config, "use_bias": self.use_bias}


@keras.saving.register_keras_serializable(package="unitrain")
class SavedStates(keras.layers.Layer):
    """The saved state of a stateful recurrent layer (``batch_size`` set), as the
    ``initial_state`` tensors Keras' LSTM and GRU take: each ``(batch_size, hidden)``, the same
    for every call (in eval mode the portable layer reads its state without moving it).
    The input only ties the layer into the graph; its batch must have ``batch_size`` rows."""

    def __init__(self, count: int, batch_size: int, hidden: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.count, self.batch_size, self.hidden = count, batch_size, hidden
        self.saved = [
            self.add_weight(
                shape=(batch_size, hidden), initializer="zeros", trainable=False, name=f"state_{i}"
            )
            for i in range(count)
        ]

    def call(self, x: Any) -> Any:
        return [keras.ops.convert_to_tensor(state) for state in self.saved]

    def get_config(self) -> dict[str, Any]:
        config = {"count": self.count, "batch_size": self.batch_size, "hidden": self.hidden}
        return {**super().get_config(), **config}
