"""Mixed precision in numpy: values rounded to a low-precision dtype, kept in float32.

numpy has no bfloat16, so a bfloat16 value is a float32 whose low 16 bits are rounded away
(to nearest, ties to even), exactly the set of values a bfloat16 holds. Between layers the
rounding is an op of the reference's graph (:func:`round_between_layers`), so the gradient
flowing back between two layers is rounded as well, as a low-precision kernel writes it.

The ``"16-mixed"`` loss scaler is :class:`LossScale`: its state as float32 and int32 numpy
scalars, the rest of it shared with the other adapters
(:class:`~unitrain.backends.common.loss_scale.AbstractLossScale`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain.backends.common.loss_scale import AbstractLossScale
from unitrain.backends.numpy._ops_array import record, value_of
from unitrain.backends.protocol import BackendOptions

__all__ = ["LossScale", "round_between_layers", "rounding"]

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


class LossScale(AbstractLossScale):
    """The ``"16-mixed"`` loss scaler of the reference, as numpy scalars (inactive otherwise).

    Attributes:
        scale: the loss scale, a float32 power of two.
        good_steps: consecutive finite updates since the scale last changed, an int32.

    Examples:
        >>> from unitrain.backends.precision import LossScaler
        >>> from unitrain.backends.protocol import BackendOptions
        >>> options = BackendOptions(precision="16-mixed", loss_scaler=LossScaler(4.0, 1))
        >>> scaler = LossScale(options)
        >>> scaler.advance(np.bool_(True))
        >>> float(scaler.scale), {k: float(v) for k, v in scaler.state().items()}
        (8.0, {'loss_scale': 8.0, 'loss_scale_good_steps': 0.0})
    """

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options, np.where)
        self.scale, self.good_steps = self.rule.initial_state()

    def _read(self) -> tuple[np.float32, np.int32]:
        return self.scale, self.good_steps

    def _write(self, scale: Any, good_steps: Any) -> None:
        self.scale, self.good_steps = np.float32(scale), np.int32(good_steps)
