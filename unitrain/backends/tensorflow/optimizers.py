"""The optimizer step of the TensorFlow adapter, run inside ``tf.function`` bodies.

Every optimizer runs by its own :meth:`~unitrain.optim.AbstractOptimizer.update`, written once
in :mod:`unitrain.ops`, not by ``keras.optimizers``: Keras' SGD keeps the learning rate inside
the momentum buffer and decouples weight decay, and its Adam puts epsilon outside the bias
correction, which misses the torch-semantics reference of :mod:`unitrain.optim` by 1e-2 to
0.4 once the learning rate changes every step (see
``shared/anchors/optimizer-schedule-parity.md``). In a graph the rule in ops costs what a
hand-written one did: the same kernels, assigned in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import ops, optim
from unitrain.backends.tensorflow import ops as tensorflow_ops

__all__ = [
    "all_finite",
    "clip_coefficient",
    "check_runnable",
    "global_norm",
    "update_parameters",
]


def global_norm(grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """The L2 norm of all gradients as a float64 scalar.

    Each tensor's sum of squares is taken in its own dtype and the sum over tensors in
    float64, as :func:`unitrain.optim.global_norm` does (``np.vdot`` per tensor, then Python
    floats), so the clipping coefficient and the finite check agree with the reference.
    """
    squares = [tf.cast(tf.reduce_sum(g * g), tf.float64) for g in grads]
    return tf.sqrt(tf.add_n(squares))


def all_finite(grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """Whether every gradient element is finite, as a boolean scalar.

    A NaN or an infinity anywhere makes its tensor's sum NaN or infinite, so one reduction
    per tensor answers it, where the norm squares each tensor into a temporary first: an
    extra write and read of all the gradients (~5 % of a W1 step when clipping is off).
    """
    sums = [tf.cast(tf.reduce_sum(g), tf.float64) for g in grads]
    return tf.math.is_finite(tf.add_n(sums))


def clip_coefficient(norm: tf.Tensor, max_norm: float, dtype: tf.DType) -> tf.Tensor:
    """``min(max_norm / (norm + 1e-6), 1)`` in float64, cast to ``dtype`` (torch's formula)."""
    coefficient = tf.constant(max_norm, tf.float64) / (norm + optim.CLIP_EPSILON)
    return tf.cast(tf.minimum(coefficient, 1.0), dtype)


def update_parameters(
    spec: optim.AbstractOptimizer,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    """Apply ``spec``'s update to ``params`` and ``slots``, assigning the new values.

    Args:
        spec: the optimizer description.
        params: the variables to update.
        grads: one gradient per parameter (already clipped).
        slots: per-parameter state by slot name (``spec.state_slots``).
        step: int64 scalar, updates applied before this one.
        lr: learning rate, a scalar tensor of the parameters' dtype (never a constant, so a new
            value every step does not retrace).
    """
    count = step + 1
    with ops.using(tensorflow_ops):
        for index, (p, g) in enumerate(zip(params, grads, strict=True)):
            mine = {slot: variables[index] for slot, variables in slots.items()}
            values = {slot: variable.read_value() for slot, variable in mine.items()}
            new_p, updated = spec.update(p.read_value(), g, values, lr, count)
            for slot, value in updated.items():
                mine[slot].assign(value)
            p.assign(new_p)


def check_runnable(spec: optim.AbstractOptimizer) -> None:
    """Refuse, now, an optimizer that has no update in ops (only a numpy reference_update).

    Raises:
        ConfigError: naming the optimizer and what to write.
    """
    optim.implementation({}, spec, "tensorflow", update_parameters)
