"""Conv1d: a cross-correlation along sequences ``(N, L, C)``, channels last."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from unitrain.models._conv import _Conv

__all__ = ["Conv1d"]


@dataclasses.dataclass(frozen=True)
class Conv1d(_Conv, type_name="conv1d"):
    """1-D cross-correlation over ``(length, in_channels)`` examples, kernel ``(k, in_channels //
    groups, out_channels)``; the options are :class:`Conv2d`'s, one int each.

    Examples:
        >>> conv = Conv1d(4, 8, kernel_size=3, padding="same")
        >>> conv.param_shapes()
        {'weight': (3, 4, 8), 'bias': (8,)}
        >>> conv.output_shape((10, 4))
        (10, 8)
    """

    rank: ClassVar[int] = 1
    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int | str = 0
    dilation: int = 1
    groups: int = 1
    bias: bool = True
