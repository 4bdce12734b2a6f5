"""The window arithmetic the contract's convolutions and pools share, framework-free.

Every backend's ``_ops_nn`` reads its per-axis settings and "same" padding from here, so the
contract's rules (one int for every spatial axis or one per axis; TensorFlow's "same") are
written once.

Examples:
    >>> per_axis(2, 2, "stride"), same_padding(7, 3, 2, 1)
    ((2, 2), (1, 1))
    >>> same_padding(6, 3, 2, 1)  # the odd one goes after
    (0, 1)
"""

from __future__ import annotations

from typing import Any

__all__ = ["per_axis", "same_padding"]


def per_axis(value: Any, count: int, name: str) -> tuple[int, ...]:
    """An int, or a sequence of ``count`` ints, as ``count`` ints (one per spatial axis)."""
    if isinstance(value, int) or hasattr(value, "__index__"):
        return (int(value),) * count
    values = tuple(map(int, value))
    if len(values) != count:
        raise ValueError(f"{name} needs one value per spatial axis ({count}), got {value!r}")
    return values


def same_padding(size: int, window: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis: ``ceil(size / stride)`` outputs, and the odd
    one of the padding that takes goes after."""
    total = max((-(-size // stride) - 1) * stride + (window - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2
