"""ConvTranspose2d: the gradient of a convolution as a layer, to upsample images."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import (
    AbstractLayer,
    Shape,
    as_pair,
    check_int,
    check_pair,
    set_checked,
)
from unitrain.models._basic import uniform_fan_in
from unitrain.models._scope import Scope

__all__ = ["ConvTranspose2d"]


@dataclasses.dataclass(frozen=True)
class ConvTranspose2d(AbstractLayer, type_name="conv_transpose2d"):
    """A transposed convolution ("deconvolution") as ``torch.nn.ConvTranspose2d`` computes it.

    Kernel ``(kh, kw, out_channels, in_channels)``: the kernel of the :class:`Conv2d` from
    ``out_channels`` to ``in_channels`` whose input gradient this layer is. Each output axis
    has ``(size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1``
    positions. Initial values follow torch's: uniform in ``±1/sqrt(out_channels * kh * kw)``.

    Examples:
        >>> up = ConvTranspose2d(8, 4, kernel_size=2, stride=2)
        >>> up.param_shapes()
        {'weight': (2, 2, 4, 8), 'bias': (4,)}
        >>> up.output_shape((5, 5, 8))
        (10, 10, 4)
    """

    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int = 1
    padding: tuple[int, int] | int = 0
    output_padding: tuple[int, int] | int = 0
    dilation: tuple[int, int] | int = 1
    bias: bool = True

    def __post_init__(self) -> None:
        owner = "ConvTranspose2d"
        set_checked(self, "in_channels", check_int(owner, "in_channels", self.in_channels))
        set_checked(self, "out_channels", check_int(owner, "out_channels", self.out_channels))
        for name in ("kernel_size", "stride", "dilation"):
            set_checked(self, name, check_pair(owner, name, getattr(self, name)))
        for name in ("padding", "output_padding"):
            set_checked(self, name, check_pair(owner, name, getattr(self, name), minimum=0))
        pairs = zip(as_pair(self.output_padding), as_pair(self.stride), as_pair(self.dilation))
        if any(o >= max(s, d) for o, s, d in pairs):
            raise ConfigError(
                f"{owner}: output_padding must be smaller than stride or dilation, got "
                f"output_padding={self.output_padding}, stride={self.stride}"
            )
        if not isinstance(self.bias, bool):
            raise ConfigError(f"{owner}: bias must be a bool, got {self.bias!r}")

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {
            "weight": (*as_pair(self.kernel_size), self.out_channels, self.in_channels)
        }
        if self.bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        fan_in = self.out_channels * math.prod(as_pair(self.kernel_size))
        return {
            name: uniform_fan_in(rng, shape, fan_in)
            for name, shape in self.own_param_shapes().items()
        }

    def forward(self, scope: Scope, x: Any) -> Any:
        out = ops.conv_transpose(
            x,
            scope.param("weight"),
            self.stride,
            self.padding,
            self.output_padding,
            self.dilation,
        )
        return ops.add(out, scope.param("bias")) if self.bias else out

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 3 or shape[2] != self.in_channels:
            raise self._refuse(shape, f"(height, width, {self.in_channels})")
        settings = (self.kernel_size, self.stride, self.padding, self.output_padding)
        kernel, stride, padding, extra = (as_pair(value) for value in settings)
        dilation = as_pair(self.dilation)
        sizes = tuple(
            (shape[axis] - 1) * stride[axis]
            - 2 * padding[axis]
            + dilation[axis] * (kernel[axis] - 1)
            + extra[axis]
            + 1
            for axis in range(2)
        )
        if min(sizes) < 1:
            raise self._refuse(shape, "enough positions for the padding")
        return (*sizes, self.out_channels)
