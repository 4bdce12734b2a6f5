"""Realistic mixed-precision bugs, one per class, for the seeded-fault suite.

Each is the numpy reference with one fault in its emulation of mixed precision or in its
loss scaler, of the kind the ``mixed_precision`` kit family is there to catch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.precision import LossScaler


class PrecisionIgnored(NumpyBackend):
    """Accepts a mixed precision and computes in float32 anyway (no speed, no warning)."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        self._rounding = None


class ScaleGrowsOneLate(NumpyBackend):
    """Doubles the loss scale after growth_interval + 1 finite updates (an off-by-one)."""

    def __init__(self, model: Any, options: Any = None) -> None:
        super().__init__(model, options)
        rule = self.options.loss_scaler
        slower = LossScaler(rule.initial_scale, rule.growth_interval + 1)
        self.options = dataclasses.replace(self.options, loss_scaler=slower)
        self.loss_scale.rule = slower


class GradientsLeftScaled(NumpyBackend):
    """Updates with the scaled gradients: the unscaling before the update is forgotten."""

    def step(self, lr: float) -> None:
        if self.loss_scale.active:
            for g in self.grads.values():
                g *= self.loss_scale.scale  # undoes the unscaling that step does
        super().step(lr)


class ScalerNotRestored(NumpyBackend):
    """Saves the loss scaler's state but starts from the initial scale after loading."""

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        if self.loss_scale.active:
            self.loss_scale.scale, self.loss_scale.good_steps = self.loss_scale.rule.initial_state()
