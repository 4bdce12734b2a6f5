"""The TensorFlow backend's precision policy: TF32 switch, compute casts, the loss scaler.

- ``matmul_precision``: TensorFlow has one process-wide switch,
  ``enable_tensor_float_32_execution``; "high" and "medium" both turn TF32 on (TensorFlow
  has no bfloat16-pass float32 matmul), "highest" turns it off.
- Mixed precision casts the float32 variables and inputs to the compute dtype inside the traced
  loss (:class:`.layers.PortableModule` reads its parameters in it), so the gradients come back
  to float32 through the casts and the master weights and optimizer slots stay float32. A native
  Keras model carries its own dtype policy (``keras.mixed_precision``), so it is refused here
  rather than cast behind its back.
- ``"16-mixed"``: the scale and the count of finite updates are device variables, advanced
  in-graph by :func:`unitrain.backends.precision.next_loss_scale` on ``tf.where``; the rest of
  the scaler (when it runs, its checkpoint entries) is
  :class:`~unitrain.backends.common.loss_scale.AbstractLossScale`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from unitrain.backends.common.loss_scale import AbstractLossScale
from unitrain.backends.protocol import BackendOptions

__all__ = ["LossScale", "set_matmul_precision"]

COMPUTE_DTYPES = {"bf16-mixed": tf.bfloat16, "16-mixed": tf.float16}


def set_matmul_precision(precision: str) -> None:
    """Apply ``matmul_precision`` (process-wide in TensorFlow)."""
    tf.config.experimental.enable_tensor_float_32_execution(precision != "highest")


class LossScale(AbstractLossScale):
    """The ``"16-mixed"`` loss scaler of one backend, as device variables (inactive otherwise).

    Args:
        options: the backend's options (``precision`` and ``loss_scaler``).
    """

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options, tf.where)
        scale, good = self.rule.initial_state()
        self.scale = tf.Variable(scale, trainable=False, name="loss_scale")
        self.good_steps = tf.Variable(good, trainable=False, name="loss_scale_good_steps")

    def _read(self) -> tuple[tf.Tensor, tf.Tensor]:
        return self.scale.read_value(), self.good_steps.read_value()

    def _write(self, scale: Any, good_steps: Any) -> None:
        self.scale.assign(scale)
        self.good_steps.assign(good_steps)

    def scaled(self, loss: tf.Tensor) -> tf.Tensor:
        """``loss`` times the scale (traced), or ``loss`` itself when inactive."""
        return loss * self.scale.read_value() if self.active else loss

    def unscaled(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """``grads`` divided by the scale (exact: a power of two)."""
        if not self.active:
            return grads
        inverse = 1.0 / self.scale.read_value()
        return [g * inverse for g in grads]
