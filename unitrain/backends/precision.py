"""Precision policy: matmul precision, mixed precision, and the one dynamic loss scaler.

Three separate choices, each a :class:`~unitrain.training.config.TrainerConfig` field:

- ``deterministic`` picks kernels (same numbers run after run);
- ``matmul_precision`` picks how float32 matmuls are computed: ``"highest"`` (true float32,
  the default, so every backend computes the same numbers), ``"high"`` (TF32 on NVIDIA
  tensor cores: 10-bit mantissa inputs, float32 accumulation) or ``"medium"`` (bfloat16
  passes). These are the names ``torch.set_float32_matmul_precision`` and JAX's
  ``default_matmul_precision`` use. On a CPU every choice computes in float32;
- ``precision`` picks mixed precision with Lightning's names: ``"32"`` (plain float32),
  ``"bf16-mixed"`` or ``"16-mixed"``: float32 master weights and optimizer state, the
  forward and backward computed in bfloat16 or float16.

Float16 gradients underflow, so ``"16-mixed"`` multiplies the loss by a dynamic scale and
divides the gradients by it before the update. :class:`LossScaler` is that rule, defined
here once; :func:`next_loss_scale` is its update written against a ``where`` function so
every backend runs this very code on its own arrays (numpy, torch, jax, tensorflow) and the
numpy form, in float32 and int32 only, is the reference the conformance kit compares against.
Other libraries differ here (torch's GradScaler starts at 2**16 with no upper bound; Keras'
LossScaleOptimizer starts at 2**15 and can reach infinity), which is why the rule is pinned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from unitrain._errors import ConfigError

__all__ = [
    "GOOD_STEPS_KEY",
    "MATMUL_PRECISIONS",
    "MAX_LOSS_SCALE",
    "PRECISIONS",
    "SCALE_KEY",
    "LossScaler",
    "ScalerStep",
    "check_matmul_precision",
    "check_precision",
    "compute_dtype",
    "next_loss_scale",
    "reference_trajectory",
    "require_precision",
    "take_scaler_state",
]

MATMUL_PRECISIONS = ("highest", "high", "medium")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")

#: The largest power of two float32 holds; the scale stops here instead of becoming inf.
MAX_LOSS_SCALE = 2.0**127

#: Checkpoint names of the scaler's state (``optimizer.`` prefix in a state dict): float32
#: scale and int64 count of consecutive finite steps. Present only under ``"16-mixed"``.
SCALE_KEY, GOOD_STEPS_KEY = "loss_scale", "loss_scale_good_steps"


def check_matmul_precision(value: Any) -> str:
    """Return ``value`` if it names a matmul precision, else raise a ConfigError saying which do."""
    if value not in MATMUL_PRECISIONS:
        raise ConfigError(
            f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {value!r}; "
            "'highest' computes float32 matmuls in float32 (the same numbers on every backend)"
        )
    return str(value)


#: Other spellings of a precision (Lightning's older names among them) and what to write.
_RENAMED = {
    "16": "'16-mixed'",
    "fp16": "'16-mixed'",
    "bf16": "'bf16-mixed'",
    "32-true": "'32'",
    "64": "dtype='float64' with precision '32'",
    "64-true": "dtype='float64' with precision '32'",
}


def check_precision(value: Any) -> str:
    """``value`` as a precision name, else a ConfigError saying which names there are.

    The integer 32 (as a TOML recipe or ``--set config.precision=32`` writes it) is "32".

    Examples:
        >>> check_precision(32), check_precision("bf16-mixed")
        ('32', 'bf16-mixed')
    """
    if isinstance(value, int) and not isinstance(value, bool) and value == 32:
        return "32"
    if value not in PRECISIONS:
        renamed = _RENAMED.get(str(value))
        hint = f"; for {value!r} write {renamed}" if renamed else ""
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {value!r}{hint}")
    return str(value)


def compute_dtype(precision: str) -> str:
    """The dtype the forward and backward compute in under ``precision``.

    Examples:
        >>> compute_dtype("bf16-mixed"), compute_dtype("16-mixed"), compute_dtype("32")
        ('bfloat16', 'float16', 'float32')
    """
    return {"32": "float32", "bf16-mixed": "bfloat16", "16-mixed": "float16"}[
        check_precision(precision)
    ]


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """The dynamic loss-scaling rule of ``precision="16-mixed"``.

    Each update: if every gradient is finite, the update is applied and the count of
    consecutive finite updates grows; when it reaches ``growth_interval`` the scale doubles
    (capped at :data:`MAX_LOSS_SCALE`, so it is never infinite) and the count restarts. If a
    gradient is NaN or infinite, the update is skipped, the scale halves (never below 1) and
    the count restarts. Scales are powers of two, so scaling and unscaling are exact.

    Args:
        initial_scale: the first scale; a power of two in ``[1, 2**127]``.
        growth_interval: consecutive finite updates before the scale doubles.

    Examples:
        >>> LossScaler().initial_scale == 2**16, LossScaler().growth_interval
        (True, 2000)
    """

    initial_scale: float = 2.0**16
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        scale = self.initial_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not 1 <= scale <= MAX_LOSS_SCALE
            or np.frexp(scale)[0] != 0.5
        ):
            raise ConfigError(
                f"LossScaler: initial_scale must be a power of two in [1, 2**127], got {scale=!r}"
            )
        if (
            isinstance(self.growth_interval, bool)
            or not isinstance(self.growth_interval, int)
            or self.growth_interval < 1
        ):
            raise ConfigError(
                f"LossScaler: growth_interval must be an int >= 1, got {self.growth_interval=!r}"
            )

    def initial_state(self) -> tuple[np.float32, np.int32]:
        """``(scale, good_steps)`` before the first update, as float32 and int32 scalars."""
        return np.float32(self.initial_scale), np.int32(0)


def next_loss_scale(
    rule: LossScaler, scale: Any, good_steps: Any, finite: Any, where: Callable[..., Any]
) -> tuple[Any, Any]:
    """The scaler's state after one update: ``(scale, good_steps)``; the one definition.

    Args:
        rule: the :class:`LossScaler`.
        scale: the current scale, a float32 scalar of the caller's array library.
        good_steps: consecutive finite updates so far, an int32 scalar of that library.
        finite: whether every gradient of this update was finite, a boolean scalar.
        where: the library's ``where(condition, x, y)`` (``numpy.where``, ``torch.where``,
            ``jax.numpy.where``, ``tf.where``), so no backend re-implements the rule.

    Examples:
        >>> rule = LossScaler(initial_scale=4.0, growth_interval=2)
        >>> next_loss_scale(rule, np.float32(4), np.int32(1), np.bool_(True), np.where)
        (array(8., dtype=float32), array(0, dtype=int32))
        >>> next_loss_scale(rule, np.float32(1), np.int32(1), np.bool_(False), np.where)
        (array(1., dtype=float32), array(0, dtype=int32))
    """
    counted = good_steps + 1
    grow = counted >= rule.growth_interval
    halved = scale * 0.5
    # At the cap, twice half the scale is the cap again; no product ever overflows to inf.
    grown = where(grow, where(scale < MAX_LOSS_SCALE, scale, halved) * 2.0, scale)
    # Scales are powers of two >= 1, so halving below 1 means the scale is 1: keep it.
    shrunk = where(halved < 1.0, scale, halved)
    new_scale = where(finite, grown, shrunk)
    new_good = where(finite & ~grow, counted, counted * 0)
    return new_scale, new_good


@dataclasses.dataclass(frozen=True)
class ScalerStep:
    """One update of the numpy reference: the scale it used, whether it applied, and after."""

    scale_used: float
    applied: bool
    scale_after: float
    good_steps_after: int


def reference_trajectory(rule: LossScaler, finite_flags: Iterable[bool]) -> list[ScalerStep]:
    """The scaler's states over updates whose gradients are finite or not, in numpy float32.

    Examples:
        >>> steps = reference_trajectory(LossScaler(4.0, growth_interval=2), [1, 1, 0, 1])
        >>> [(s.scale_used, s.applied, s.scale_after) for s in steps]
        [(4.0, True, 4.0), (4.0, True, 8.0), (8.0, False, 4.0), (4.0, True, 4.0)]
    """
    scale, good = rule.initial_state()
    trajectory = []
    for finite in finite_flags:
        new_scale, new_good = next_loss_scale(rule, scale, good, np.bool_(finite), np.where)
        trajectory.append(ScalerStep(float(scale), bool(finite), float(new_scale), int(new_good)))
        scale, good = np.float32(new_scale), np.int32(new_good)
    return trajectory


def require_precision(backend: str, declared: Iterable[str], precision: str, device: str) -> None:
    """Raise a ConfigError unless a backend declared ``precision`` for ``device``."""
    declared = tuple(declared)
    if precision != "32" and precision not in declared:
        raise ConfigError(
            f"the {backend} backend trains in precision {declared} on {device}, got "
            f"precision={precision!r}; use one of those or precision='32'"
        )


def take_scaler_state(optimizer_state: dict[str, Any]) -> tuple[np.float32, np.int32]:
    """Pop the scaler's entries from a state dict's optimizer part, checked, as float32/int32.

    Raises:
        ConfigError: the scale is not a power of two in ``[1, 2**127]`` or the count of
            finite updates is negative: not a state the rule can reach.
    """
    scale = np.float32(optimizer_state.pop(SCALE_KEY))
    good = int(optimizer_state.pop(GOOD_STEPS_KEY))
    if not 1 <= scale <= MAX_LOSS_SCALE or np.frexp(scale)[0] != 0.5 or not 0 <= good < 2**31:
        raise ConfigError(
            f"optimizer.{SCALE_KEY}={float(scale)!r} with optimizer.{GOOD_STEPS_KEY}={good} is "
            "not a loss-scaler state (a power of two in [1, 2**127] and a count >= 0); was "
            "the checkpoint edited?"
        )
    return scale, np.int32(good)
