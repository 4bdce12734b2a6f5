"""Reshape, Identity and Upsample: layers that move values without parameters."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, as_pair, check_pair, set_checked
from unitrain.models._scope import Scope

__all__ = ["Identity", "Reshape", "Upsample"]


@dataclasses.dataclass(frozen=True)
class Reshape(AbstractLayer, type_name="reshape"):
    """Give each example a new shape of the same size, in row-major (channels-last) order;
    one entry may be -1 (``keras.layers.Reshape``; the batch axis is kept).

    Examples:
        >>> Reshape((4, 4, 2)).output_shape((32,))
        (4, 4, 2)
        >>> Reshape((-1, 8)).output_shape((4, 4))
        (2, 8)
    """

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list)) else None
        if not shape or any(
            isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1) for n in shape
        ):
            raise ConfigError(
                f"Reshape: shape must be a non-empty list of positive ints (one may be -1), "
                f"got shape={self.shape!r}"
            )
        if shape.count(-1) > 1:
            raise ConfigError(f"Reshape: at most one entry may be -1, got shape={shape}")
        set_checked(self, "shape", shape)

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.reshape(x, (-1, *self._output_shape(tuple(ops.shape(x)[1:]))))

    def _output_shape(self, shape: Shape) -> Shape:
        size, known = math.prod(shape), -math.prod(self.shape)
        if -1 in self.shape:
            if known and size % known == 0:
                return tuple(size // known if n == -1 else n for n in self.shape)
        elif math.prod(self.shape) == size:
            return self.shape
        raise self._refuse(shape, f"of a size that fills {self.shape}")


@dataclasses.dataclass(frozen=True)
class Identity(AbstractLayer, type_name="identity"):
    """The input, unchanged: a branch of :class:`Concatenate` that carries the input (a skip
    connection)."""

    def forward(self, scope: Scope, x: Any) -> Any:
        return x

    def _output_shape(self, shape: Shape) -> Shape:
        return shape


@dataclasses.dataclass(frozen=True)
class Upsample(AbstractLayer, type_name="upsample"):
    """Repeat each pixel ``scale`` times along height and width (nearest neighbour):
    ``(H, W, C) -> (H * sh, W * sw, C)``, as ``torch.nn.Upsample(mode="nearest")`` and
    ``keras.layers.UpSampling2D`` do for integer factors.

    Examples:
        >>> Upsample(2).output_shape((3, 4, 5))
        (6, 8, 5)
    """

    scale: tuple[int, int] | int = 2

    def __post_init__(self) -> None:
        set_checked(self, "scale", check_pair("Upsample", "scale", self.scale))

    def forward(self, scope: Scope, x: Any) -> Any:
        (sh, sw), (height, width, channels) = as_pair(self.scale), ops.shape(x)[1:]
        spread = ops.reshape(x, (-1, height, 1, width, 1, channels))
        batch = ops.shape(x)[0]
        spread = ops.broadcast_to(spread, (batch, height, sh, width, sw, channels))
        return ops.reshape(spread, (-1, height * sh, width * sw, channels))

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 3:
            raise self._refuse(shape, "(height, width, channels)")
        sh, sw = as_pair(self.scale)
        return (shape[0] * sh, shape[1] * sw, shape[2])
