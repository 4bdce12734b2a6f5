"""Image layers on channels-last inputs ``(N, H, W, C)``: convolution and pooling."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from unitrain import ops
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

__all__ = ["AvgPool2d", "Conv2d", "GlobalAvgPool", "MaxPool2d", "window_output"]


def window_output(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    """Output length of a sliding window (no dilation, floor mode), or 0 if none fits."""
    span = size + 2 * padding - kernel
    return span // stride + 1 if span >= 0 else 0


def _image_shape(layer: AbstractLayer, shape: Shape, channels: int | None) -> tuple[int, int]:
    if len(shape) != 3 or (channels is not None and shape[2] != channels):
        raise layer._refuse(shape, f"(height, width, {channels if channels else 'channels'})")
    return shape[0], shape[1]


@dataclasses.dataclass(frozen=True)
class Conv2d(AbstractLayer, type_name="conv2d"):
    """2-D cross-correlation with kernel ``(kh, kw, in_channels, out_channels)`` and a bias.

    Padding is explicit zeros on every side (``padding`` rows above and below, columns left
    and right): TensorFlow's "SAME" pads asymmetrically when the stride is 2, which gives the
    same output shape but other numbers, so it is not offered.

    Args:
        in_channels: channels of the input (its last axis).
        out_channels: channels of the output.
        kernel_size: int or ``(kh, kw)``.
        stride: int or ``(sh, sw)``.
        padding: int or ``(ph, pw)``, zeros added on both sides.

    Examples:
        >>> conv = Conv2d(1, 6, kernel_size=3, padding=1)
        >>> conv.param_shapes()
        {'weight': (3, 3, 1, 6), 'bias': (6,)}
        >>> conv.output_shape((8, 8, 1))
        (8, 8, 6)
    """

    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int = 1
    padding: tuple[int, int] | int = 0

    def __post_init__(self) -> None:
        set_checked(self, "in_channels", check_int("Conv2d", "in_channels", self.in_channels))
        set_checked(self, "out_channels", check_int("Conv2d", "out_channels", self.out_channels))
        set_checked(self, "kernel_size", check_pair("Conv2d", "kernel_size", self.kernel_size))
        set_checked(self, "stride", check_pair("Conv2d", "stride", self.stride))
        set_checked(self, "padding", check_pair("Conv2d", "padding", self.padding, minimum=0))

    @property
    def fan_in(self) -> int:
        """Inputs read by one output value: ``kh * kw * in_channels``."""
        kh, kw = as_pair(self.kernel_size)
        return kh * kw * self.in_channels

    def own_param_shapes(self) -> dict[str, Shape]:
        kh, kw = as_pair(self.kernel_size)
        return {
            "weight": (kh, kw, self.in_channels, self.out_channels),
            "bias": (self.out_channels,),
        }

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shapes = self.own_param_shapes()
        return {name: uniform_fan_in(rng, shape, self.fan_in) for name, shape in shapes.items()}

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.conv(
            x,
            scope.param("weight"),
            as_pair(self.stride),
            as_pair(self.padding),
            bias=scope.param("bias"),
        )

    def _output_shape(self, shape: Shape) -> Shape:
        height, width = _image_shape(self, shape, self.in_channels)
        sizes = [
            window_output(size, k, s, p)
            for size, k, s, p in zip(
                (height, width),
                as_pair(self.kernel_size),
                as_pair(self.stride),
                as_pair(self.padding),
            )
        ]
        if 0 in sizes:
            raise self._refuse(shape, f"at least the kernel {self.kernel_size} after padding")
        return (sizes[0], sizes[1], self.out_channels)


class _Pool(AbstractLayer):
    """A window reduction per channel, no padding, stride defaulting to the window size."""

    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int | None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        set_checked(self, "kernel_size", check_pair(owner, "kernel_size", self.kernel_size))
        stride = self.kernel_size if self.stride is None else self.stride
        set_checked(self, "stride", check_pair(owner, "stride", stride))

    def _output_shape(self, shape: Shape) -> Shape:
        height, width = _image_shape(self, shape, None)
        kh, kw = as_pair(self.kernel_size)
        sh, sw = as_pair(self.stride)
        out = (window_output(height, kh, sh), window_output(width, kw, sw))
        if 0 in out:
            raise self._refuse(shape, f"at least the window {self.kernel_size}")
        return (*out, shape[2])


@dataclasses.dataclass(frozen=True)
class MaxPool2d(_Pool, type_name="max_pool2d"):
    """The maximum over each window; the gradient goes to the first maximum (as in torch).

    Examples:
        >>> MaxPool2d(2).output_shape((8, 8, 6))
        (4, 4, 6)
    """

    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int | None = None

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.max_pool(x, as_pair(self.kernel_size), as_pair(self.stride))


@dataclasses.dataclass(frozen=True)
class AvgPool2d(_Pool, type_name="avg_pool2d"):
    """The mean over each window (no padding, so every window is full)."""

    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int | None = None

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.avg_pool(x, as_pair(self.kernel_size), as_pair(self.stride))


@dataclasses.dataclass(frozen=True)
class GlobalAvgPool(AbstractLayer, type_name="global_avg_pool"):
    """The mean over height and width: ``(H, W, C) -> (C,)``."""

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.mean(x, axis=(1, 2))

    def _output_shape(self, shape: Shape) -> Shape:
        _image_shape(self, shape, None)
        return (shape[2],)
