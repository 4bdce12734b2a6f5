"""The ``"16-mixed"`` loss scaler's state, kept once for the adapters that hold it in objects.

The rule is :class:`unitrain.backends.precision.LossScaler` and its update
:func:`~unitrain.backends.precision.next_loss_scale`. What every adapter also did the same
way, and now does here: the scaler is active under ``"16-mixed"`` only; it starts from the
rule's initial state; after each update it advances through ``next_loss_scale`` on the
framework's own ``where``; its state-dict entries are a float32 scale and an int64 count;
loading checks them (:func:`~unitrain.backends.precision.take_scaler_state`). An adapter
says only where the two numbers live, in :meth:`AbstractLossScale._read` and
:meth:`AbstractLossScale._write`: numpy scalars (numpy), host tensors (torch), device
variables (TensorFlow). Each adapter names its subclass ``LossScale``, in its ``precision``
module.

JAX keeps the scaler's state inside the donated device state of its jitted update (the
``log2`` of the scale among the counters, see :mod:`unitrain.backends.jax.compiled`), where no
Python object can hold it between calls; it runs the same ``next_loss_scale``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unitrain.backends.precision import (
    GOOD_STEPS_KEY,
    SCALE_KEY,
    next_loss_scale,
    take_scaler_state,
)
from unitrain.backends.protocol import BackendOptions

__all__ = ["AbstractLossScale"]


class AbstractLossScale:
    """The loss scaler of one backend: active under ``"16-mixed"``, inactive otherwise.

    A subclass holds the rule's initial state (``rule.initial_state()``) where it keeps the
    two numbers, then reads and writes them through :meth:`_read` and :meth:`_write`.

    Args:
        options: the backend's options (``precision`` and ``loss_scaler``).
        where: the framework's ``where(condition, x, y)``, on which the rule is computed.

    Attributes:
        rule: the :class:`~unitrain.backends.precision.LossScaler`.
        active: whether the scaler runs (``precision="16-mixed"``).
    """

    def __init__(self, options: BackendOptions, where: Callable[..., Any]) -> None:
        self.rule = options.loss_scaler
        self.active = options.precision == "16-mixed"
        self._where = where

    def _read(self) -> tuple[Any, Any]:
        """``(scale, good_steps)`` as the framework holds them."""
        raise NotImplementedError

    def _write(self, scale: Any, good_steps: Any) -> None:
        """Hold ``scale`` and ``good_steps`` (numpy scalars or the framework's values)."""
        raise NotImplementedError

    def advance(self, finite: Any) -> None:
        """Advance the state after an update whose gradients were ``finite`` or not (a boolean
        scalar of the framework)."""
        if self.active:
            self._write(*next_loss_scale(self.rule, *self._read(), finite, self._where))

    def state(self) -> dict[str, np.ndarray]:
        """The scaler's state-dict entries under the ``optimizer.`` prefix (none when
        inactive)."""
        if not self.active:
            return {}
        scale, good = self._read()
        return {
            SCALE_KEY: np.array(np.asarray(scale), np.float32),
            GOOD_STEPS_KEY: np.array(np.asarray(good), np.int64),
        }

    def load(self, optimizer_state: dict[str, Any]) -> None:
        """Take the scaler's entries out of ``optimizer_state``, checked, and hold them."""
        if self.active:
            self._write(*take_scaler_state(optimizer_state))
