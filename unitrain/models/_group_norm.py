"""GroupNorm: normalise groups of channels over each example, as in Wu and He (2018)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._norm import scale_shift, wide
from unitrain.models._scope import Scope

__all__ = ["GroupNorm"]


@dataclasses.dataclass(frozen=True)
class GroupNorm(AbstractLayer, type_name="group_norm"):
    """Split the channels (the last axis) into ``groups`` and normalise each group of each
    example over its channels and every position: ``(x - mean) * rsqrt(var + eps) * w + b``.

    ``torch.nn.GroupNorm`` and ``keras.layers.GroupNormalization``: the variance is the
    biased one, statistics never depend on the batch, train and eval mode compute the same.
    ``groups=1`` normalises each example over everything (LayerNorm over all axes);
    ``groups=num_channels`` is InstanceNorm. Parameters ``weight`` (ones) and ``bias``
    (zeros) per channel.

    Examples:
        >>> GroupNorm(2, 6).output_shape((4, 4, 6))
        (4, 4, 6)
    """

    groups: int
    num_channels: int
    eps: float = 1e-5

    def __post_init__(self) -> None:
        set_checked(self, "groups", check_int("GroupNorm", "groups", self.groups))
        set_checked(self, "num_channels", check_int("GroupNorm", "num_channels", self.num_channels))
        if self.num_channels % self.groups:
            raise ConfigError(
                f"GroupNorm: num_channels must be a multiple of groups, got "
                f"num_channels={self.num_channels}, groups={self.groups}"
            )
        eps = check_float("GroupNorm", "eps", self.eps, low=0.0, low_open=True, rule="> 0")
        set_checked(self, "eps", eps)

    def own_param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.num_channels,), "bias": (self.num_channels,)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"weight": np.ones(self.num_channels), "bias": np.zeros(self.num_channels)}

    def forward(self, scope: Scope, x: Any) -> Any:
        low, x = ops.dtype(x), wide(x)
        shape = ops.shape(x)
        grouped = ops.reshape(x, (-1, *shape[1:-1], self.groups, self.num_channels // self.groups))
        axes = (*range(1, len(shape) - 1), len(shape))  # positions and the group's channels
        mean, var = ops.moments(grouped, axes, keepdims=True)
        normalised = ops.reshape((grouped - mean) * ops.rsqrt(var + self.eps), (-1, *shape[1:]))
        return scale_shift(scope, normalised, low)

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.num_channels:
            raise self._refuse(shape, f"(..., {self.num_channels})")
        return shape
