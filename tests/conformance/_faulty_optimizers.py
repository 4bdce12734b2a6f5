"""Seeded faults in RMSprop and Lion, each a slip a hand-written adapter could make.

They follow ``_faulty_backends._UpdateRule``: the numpy reference backend, with one optimizer
type's update replaced by the faulty one.
``tests/conformance/test_conformance_faults.py`` shows the kit fails each on the check named
beside it and passes the good numpy backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from _faulty_backends import _UpdateRule

from unitrain import optim
from unitrain.backends.numpy import NumpyBackend


class RMSpropEpsInsideSqrt(_UpdateRule):
    """RMSprop dividing by ``sqrt(s + eps)`` instead of torch's ``sqrt(s) + eps``."""

    overrides = (optim.RMSprop,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        g = g + spec.weight_decay * p
        s = spec.alpha * self.opt_state[f"{name}.square_avg"] + (1 - spec.alpha) * g * g
        self.opt_state[f"{name}.square_avg"] = s
        return p - lr * g / np.sqrt(s + spec.eps)


class RMSpropCenteredIgnored(_UpdateRule):
    """Centered RMSprop run as the plain one (the running mean kept but never subtracted)."""

    overrides = (optim.RMSprop,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        slots = {slot: self.opt_state[f"{name}.{slot}"] for slot in spec.state_slots}
        plain = optim.RMSprop(alpha=spec.alpha, eps=spec.eps, momentum=spec.momentum)
        param, updated = plain.reference_update(p, g, slots, lr, t)
        self.opt_state.update({f"{name}.{slot}": value for slot, value in updated.items()})
        return param


class LionSignOfBeta2(_UpdateRule):
    """Lion taking the step's sign of the beta2 interpolation (the momentum's own update)."""

    overrides = (optim.Lion,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        m = spec.beta2 * self.opt_state[f"{name}.exp_avg"] + (1 - spec.beta2) * g
        self.opt_state[f"{name}.exp_avg"] = m
        return p - lr * (np.sign(m) + spec.weight_decay * p)


class LionDecayWithoutLr(_UpdateRule):
    """Lion decaying the weights by ``wd * p`` per update, not ``lr * wd * p``."""

    overrides = (optim.Lion,)

    def update(self, spec: Any, name: str, p: np.ndarray, g: np.ndarray, lr: float, t: int) -> Any:
        m = self.opt_state[f"{name}.exp_avg"]
        direction = np.sign(spec.beta1 * m + (1 - spec.beta1) * g)
        self.opt_state[f"{name}.exp_avg"] = spec.beta2 * m + (1 - spec.beta2) * g
        return p - lr * direction - spec.weight_decay * p


class SquareAvgNotRestored(NumpyBackend):
    """Loads RMSprop's ``square_avg`` as zeros (a slot the adapter forgets to restore)."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        forgotten = {
            key: np.zeros_like(value) if key.endswith(".square_avg") else value
            for key, value in state.items()
        }
        super().load_state_dict(forgotten)
