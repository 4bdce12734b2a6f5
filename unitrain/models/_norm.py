"""Normalisation layers, with the conventions pinned where frameworks differ."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from unitrain import ops
from unitrain._errors import DataError
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._basic import check_bool
from unitrain.models._scope import Scope

__all__ = ["BatchNorm", "LayerNorm"]


def wide(x: Any) -> Any:
    """``x`` in float32 when it is bfloat16 or float16 (mixed precision), else unchanged.

    Normalisation reduces in it and hands its output on in the input's own dtype, as torch's
    autocast, Keras and Flax do: statistics taken in bfloat16 lose digits that the running
    averages keep.
    """
    return ops.cast(x, "float32") if ops.dtype(x) in ("bfloat16", "float16") else x


def scale_shift(scope: Scope, normalised: Any, low: str) -> Any:
    """``normalised * weight + bias`` in ``normalised``'s dtype, handed on in ``low``."""
    dtype = ops.dtype(normalised)
    weight, bias = ops.cast(scope.param("weight"), dtype), ops.cast(scope.param("bias"), dtype)
    return ops.cast(normalised * weight + bias, low)


def _check_eps(owner: str, eps: object) -> float:
    return check_float(owner, "eps", eps, low=0.0, low_open=True, rule="a finite float > 0")


@dataclasses.dataclass(frozen=True)
class BatchNorm(AbstractLayer, type_name="batch_norm"):
    """Normalise each channel (the last axis) over the batch and every other axis.

    PyTorch's convention, pinned for every backend: in train mode the batch is normalised
    with its biased variance, and the running statistics move by ``momentum`` towards the
    batch's mean and *unbiased* variance (``M / (M - 1)`` times the biased one, ``M`` values
    per channel). Keras' ``momentum=0.9`` is this ``momentum=0.1``, and Keras keeps the biased
    variance. Evaluation normalises with the running statistics and changes nothing.

    Parameters ``weight`` (ones) and ``bias`` (zeros); state ``running_mean`` (zeros) and
    ``running_var`` (ones), in the parameter dtype.

    Args:
        num_features: channels (the size of the last axis).
        momentum: weight of the new batch in the running statistics, in (0, 1].
        eps: added to the variance before the square root.
    """

    num_features: int
    momentum: float = 0.1
    eps: float = 1e-5

    def __post_init__(self) -> None:
        set_checked(self, "num_features", check_int("BatchNorm", "num_features", self.num_features))
        momentum = check_float(
            "BatchNorm",
            "momentum",
            self.momentum,
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=False,
            rule="in (0, 1]",
        )
        set_checked(self, "momentum", momentum)
        set_checked(self, "eps", _check_eps("BatchNorm", self.eps))

    def own_param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.num_features,), "bias": (self.num_features,)}

    def own_state_shapes(self) -> dict[str, Shape]:
        return {"running_mean": (self.num_features,), "running_var": (self.num_features,)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"weight": np.ones(self.num_features), "bias": np.zeros(self.num_features)}

    def _init_own_state(self) -> dict[str, np.ndarray]:
        return {
            "running_mean": np.zeros(self.num_features),
            "running_var": np.ones(self.num_features),
        }

    def forward(self, scope: Scope, x: Any) -> Any:
        low, x = ops.dtype(x), wide(x)
        axes = tuple(range(len(ops.shape(x)) - 1))
        if scope.training:
            mean, var = ops.moments(x, axes)  # the biased variance: what the batch is scaled by
            count = _values_per_channel(self, ops.shape(x))
            _move(scope, "running_mean", mean, self.momentum)
            _move(scope, "running_var", var * (count / (count - 1)), self.momentum)  # unbiased
        else:
            dtype = ops.dtype(x)
            mean = ops.cast(scope.state("running_mean"), dtype)
            var = ops.cast(scope.state("running_var"), dtype)
        return scale_shift(scope, (x - mean) * ops.rsqrt(var + self.eps), low)

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.num_features:
            raise self._refuse(shape, f"(..., {self.num_features})")
        return shape


def _move(scope: Scope, name: str, batch: Any, momentum: float) -> None:
    """Move running statistic ``name`` by ``momentum`` towards ``batch``, in its own dtype."""
    old = scope.state(name)
    moved = (1 - momentum) * ops.cast(old, ops.dtype(batch)) + momentum * batch
    scope.set_state(name, ops.cast(moved, ops.dtype(old)))


def _values_per_channel(layer: BatchNorm, shape: tuple[int, ...]) -> int:
    """How many values a channel's batch statistics are taken over; at least two."""
    count = 1
    for size in shape[:-1]:
        count *= size
    if count < 2:
        raise DataError(
            f"BatchNorm({layer.num_features}) in train mode needs more than one value per "
            f"channel, got input shape {tuple(shape)}; use a larger batch"
        )
    return count


@dataclasses.dataclass(frozen=True)
class LayerNorm(AbstractLayer, type_name="layer_norm"):
    """Normalise each position over its last axis: ``(x - mean) * rsqrt(var + eps) * w + b``.

    ``eps`` defaults to torch's 1e-5 (Keras uses 1e-3) and sits inside the square root
    (``1 / (std + eps)`` differs by up to 8e-2 for rows of small spread). The variance is the
    biased one. ``bias=False`` leaves ``b`` out (no ``bias`` parameter), as GPT models written
    with torch's ``nn.LayerNorm(bias=False)`` do.
    """

    num_features: int
    eps: float = 1e-5
    bias: bool = True

    def __post_init__(self) -> None:
        set_checked(self, "num_features", check_int("LayerNorm", "num_features", self.num_features))
        set_checked(self, "eps", _check_eps("LayerNorm", self.eps))
        check_bool("LayerNorm", "bias", self.bias)

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.num_features,)}
        return {**shapes, "bias": (self.num_features,)} if self.bias else shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        values = {"weight": np.ones(self.num_features), "bias": np.zeros(self.num_features)}
        return values if self.bias else {"weight": values["weight"]}

    def forward(self, scope: Scope, x: Any) -> Any:
        bias = scope.param("bias") if self.bias else None
        return ops.layer_norm(x, scope.param("weight"), bias, self.eps)

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.num_features:
            raise self._refuse(shape, f"(..., {self.num_features})")
        return shape
