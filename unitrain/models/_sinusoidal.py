"""SinusoidalPositionalEmbedding: the fixed position signal of "Attention Is All You Need"."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._scope import Scope

__all__ = ["SinusoidalPositionalEmbedding"]


@dataclasses.dataclass(frozen=True)
class SinusoidalPositionalEmbedding(AbstractLayer, type_name="sinusoidal_positional_embedding"):
    """Add ``sin(t / base ** (2i / dim))`` to feature ``2i`` and the cosine to ``2i + 1`` of
    position ``t`` of ``(L, dim)`` inputs (Vaswani et al. 2017); no parameters, any length.

    Examples:
        >>> SinusoidalPositionalEmbedding(8).param_shapes()
        {}
    """

    dim: int
    base: float = 10000.0

    def __post_init__(self) -> None:
        owner = "SinusoidalPositionalEmbedding"
        set_checked(self, "dim", check_int(owner, "dim", self.dim))
        if self.dim % 2:
            raise ConfigError(f"{owner}: dim must be even, got dim={self.dim}")
        check_float(owner, "base", self.base, low=1.0, low_open=True, rule="> 1")

    def table(self, length: int) -> np.ndarray:
        """The ``(length, dim)`` signal in float64, made once per length (do not change it)."""
        return _table(length, self.dim, float(self.base))

    def forward(self, scope: Scope, x: Any) -> Any:
        return x + ops.asarray(self.table(ops.shape(x)[1]), ops.dtype(x))

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(length, {self.dim})")
        return shape


@functools.lru_cache(maxsize=64)
def _table(length: int, dim: int, base: float) -> np.ndarray:
    angles = np.arange(length)[:, None] / base ** (np.arange(0, dim, 2) / dim)
    out = np.empty((length, dim))
    out[:, 0::2], out[:, 1::2] = np.sin(angles), np.cos(angles)
    return out
