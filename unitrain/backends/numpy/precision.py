"""Mixed precision in numpy: values rounded to a low-precision dtype, kept in float32.

numpy has no bfloat16, so a bfloat16 value is a float32 whose low 16 bits are rounded away
(to nearest, ties to even), exactly the set of values a bfloat16 holds. Between layers the
rounding is an op of the reference's graph (:func:`round_between_layers`), so the gradient
flowing back between two layers is rounded as well, as a low-precision kernel writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain.backends.numpy._ops_array import record, value_of

__all__ = ["round_between_layers", "rounding"]

Rounding = Callable[[np.ndarray], np.ndarray]


def _round_float16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _round_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(a), a, rounded.view(np.float32))


_ROUNDING: dict[str, Rounding | None] = {
    "float32": None,
    "bfloat16": _round_bfloat16,
    "float16": _round_float16,
}


def rounding(dtype: str) -> Rounding | None:
    """The rounding of compute dtype ``dtype`` (``None`` for float32, which needs none).

    Examples:
        >>> import numpy as np
        >>> rounding("bfloat16")(np.float32([1.00390625]))  # halfway: ties to even
        array([1.], dtype=float32)
        >>> rounding("float32") is None
        True
    """
    return _ROUNDING[dtype]


def round_between_layers(round_: Rounding, x: Any) -> Any:
    """``x`` (a layer's output) rounded by ``round_``; its gradient is rounded on the way back.

    What is not a float32 array (token ids) passes unchanged. On an untracked ``x`` (eval
    mode) this is the plain rounding.
    """
    value = value_of(x)
    if not (isinstance(value, np.ndarray) and value.dtype == np.float32):
        return x
    return record(round_(value), (x,), lambda cotangent: (round_(cotangent),))
