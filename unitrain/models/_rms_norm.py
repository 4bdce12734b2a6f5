"""RMSNorm: scale each position by the root mean square of its features (Zhang and Sennrich)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from unitrain import ops
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._norm import wide
from unitrain.models._scope import Scope

__all__ = ["RMSNorm"]


@dataclasses.dataclass(frozen=True)
class RMSNorm(AbstractLayer, type_name="rms_norm"):
    """``x * rsqrt(mean(x**2) + eps) * weight`` over the last axis; no centring, no bias.

    As in ``torch.nn.RMSNorm`` and LLaMA; ``eps`` defaults to LLaMA's 1e-6 (torch's default
    is the dtype's machine epsilon). The statistic is taken in float32 under mixed precision
    and the output handed on in the input's dtype. Parameter ``weight`` starts at ones.

    Examples:
        >>> RMSNorm(8).param_shapes()
        {'weight': (8,)}
    """

    num_features: int
    eps: float = 1e-6

    def __post_init__(self) -> None:
        set_checked(self, "num_features", check_int("RMSNorm", "num_features", self.num_features))
        eps = check_float("RMSNorm", "eps", self.eps, low=0.0, low_open=True, rule="> 0")
        set_checked(self, "eps", eps)

    def own_param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.num_features,)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"weight": np.ones(self.num_features)}

    def forward(self, scope: Scope, x: Any) -> Any:
        low, x = ops.dtype(x), wide(x)
        scale = ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.eps)
        weight = ops.cast(scope.param("weight"), ops.dtype(x))
        return ops.cast(x * scale * weight, low)

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.num_features:
            raise self._refuse(shape, f"(..., {self.num_features})")
        return shape
