"""Image layers on channels-last inputs ``(N, H, W, C)``: convolution and pooling."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

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

__all__ = ["AvgPool2d", "Conv2d", "GlobalAvgPool", "MaxPool2d", "window_output"]


def window_output(size: int, kernel: int, stride: int, padding: int = 0, dilation: int = 1) -> int:
    """Output length of a sliding window (floor mode), or 0 if none fits."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    return span // stride + 1 if span >= 0 else 0


def _image_shape(layer: AbstractLayer, shape: Shape, channels: int | None) -> tuple[int, int]:
    if len(shape) != 3 or (channels is not None and shape[2] != channels):
        raise layer._refuse(shape, f"(height, width, {channels if channels else 'channels'})")
    return shape[0], shape[1]


def _check_padding(owner: str, padding: object, rank: int) -> str | tuple[int, ...]:
    if isinstance(padding, str):
        if padding.lower() in ("same", "valid"):
            return padding.lower()
        raise ConfigError(f'{owner}: padding must be ints, "same" or "valid", got {padding!r}')
    return _check_per_axis(owner, "padding", padding, rank, minimum=0)


def _check_per_axis(
    owner: str, name: str, value: object, rank: int, minimum: int = 1
) -> tuple[int, ...]:
    """One int per spatial axis: an int, or (for Conv1d) a list of one, as JSON gives back."""
    if rank == 2:
        return check_pair(owner, name, value, minimum=minimum)
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    return (check_int(owner, name, value, minimum=minimum),)


class _Conv(AbstractLayer):
    """A cross-correlation over ``rank`` spatial axes, channels last, with an optional bias.

    Kernels are ``(*window, in_channels // groups, out_channels)``. Padding is zeros on both
    sides (one int, or one per axis), ``"valid"`` (none), or ``"same"``: ``ceil(size /
    stride)`` outputs with the padding that takes split as TensorFlow splits it, the odd one
    after (at stride 2 torch's symmetric padding gives other numbers, so torch refuses "same"
    there and unitrain computes TensorFlow's on every backend).
    """

    rank: ClassVar[int]
    in_channels: int
    out_channels: int
    kernel_size: Any
    stride: Any
    padding: Any
    dilation: Any
    groups: int
    bias: bool

    def __post_init__(self) -> None:
        owner, rank = type(self).__name__, self.rank
        set_checked(self, "in_channels", check_int(owner, "in_channels", self.in_channels))
        set_checked(self, "out_channels", check_int(owner, "out_channels", self.out_channels))
        for name in ("kernel_size", "stride", "dilation"):
            set_checked(self, name, _check_per_axis(owner, name, getattr(self, name), rank))
        set_checked(self, "padding", _check_padding(owner, self.padding, rank))
        set_checked(self, "groups", check_int(owner, "groups", self.groups))
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ConfigError(
                f"{owner}: in_channels and out_channels must be multiples of groups, got "
                f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
                f"groups={self.groups}"
            )
        if not isinstance(self.bias, bool):
            raise ConfigError(f"{owner}: bias must be a bool, got {self.bias!r}")

    @property
    def fan_in(self) -> int:
        """Inputs read by one output value: the window's size times ``in_channels // groups``."""
        return math.prod(self.kernel_size) * (self.in_channels // self.groups)

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {
            "weight": (*self.kernel_size, self.in_channels // self.groups, self.out_channels)
        }
        if self.bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shapes = self.own_param_shapes()
        return {name: uniform_fan_in(rng, shape, self.fan_in) for name, shape in shapes.items()}

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.conv(
            x,
            scope.param("weight"),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            bias=scope.param("bias") if self.bias else None,
        )

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != self.rank + 1 or shape[-1] != self.in_channels:
            axes = ", ".join(("length",) if self.rank == 1 else ("height", "width"))
            raise self._refuse(shape, f"({axes}, {self.in_channels})")
        sizes = []
        for axis, size in enumerate(shape[:-1]):
            kernel, stride = self.kernel_size[axis], self.stride[axis]
            dilation = self.dilation[axis]
            if self.padding == "same":
                sizes.append(-(-size // stride))
                continue
            padding = 0 if self.padding == "valid" else self.padding[axis]
            sizes.append(window_output(size, kernel, stride, padding, dilation))
        if 0 in sizes:
            raise self._refuse(shape, f"at least the kernel {self.kernel_size} after padding")
        return (*sizes, self.out_channels)


@dataclasses.dataclass(frozen=True)
class Conv2d(_Conv, type_name="conv2d"):
    """2-D cross-correlation, kernel ``(kh, kw, in_channels // groups, out_channels)``.

    Args:
        in_channels: channels of the input (its last axis).
        out_channels: channels of the output.
        kernel_size: int or ``(kh, kw)``.
        stride: int or ``(sh, sw)``.
        padding: int or ``(ph, pw)`` zeros on both sides, ``"valid"`` or ``"same"``
            (TensorFlow's rule: the odd row or column of padding goes after).
        dilation: int or ``(dh, dw)``: the spacing of the kernel's taps.
        groups: split the channels into this many independent convolutions.
        bias: whether a bias ``(out_channels,)`` is added.

    Examples:
        >>> conv = Conv2d(1, 6, kernel_size=3, padding=1)
        >>> conv.param_shapes()
        {'weight': (3, 3, 1, 6), 'bias': (6,)}
        >>> conv.output_shape((8, 8, 1))
        (8, 8, 6)
        >>> Conv2d(1, 6, 3, stride=2, padding="same").output_shape((7, 7, 1))
        (4, 4, 6)
    """

    rank: ClassVar[int] = 2
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int] | int
    stride: tuple[int, int] | int = 1
    padding: tuple[int, int] | int | str = 0
    dilation: tuple[int, int] | int = 1
    groups: int = 1
    bias: bool = True


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
