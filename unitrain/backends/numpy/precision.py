"""Mixed precision in numpy: values rounded to a low-precision dtype, kept in float32.

numpy has no bfloat16, so a bfloat16 value is a float32 whose low 16 bits are rounded away
(to nearest, ties to even), exactly the set of values a bfloat16 holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["rounding"]


def _round_float16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _round_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(a), a, rounded.view(np.float32))


_ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "float32": None,
    "bfloat16": _round_bfloat16,
    "float16": _round_float16,
}


def rounding(dtype: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The rounding of compute dtype ``dtype`` (``None`` for float32, which needs none).

    Examples:
        >>> import numpy as np
        >>> rounding("bfloat16")(np.float32([1.00390625]))  # halfway: ties to even
        array([1.], dtype=float32)
        >>> rounding("float32") is None
        True
    """
    return _ROUNDING[dtype]
