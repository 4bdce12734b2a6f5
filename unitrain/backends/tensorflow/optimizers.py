"""The optimizer step of the TensorFlow adapter, run inside ``tf.function`` bodies.

Every optimizer runs by its own :meth:`~unitrain.optim.AbstractOptimizer.update`, written once
in :mod:`unitrain.ops`, not by ``keras.optimizers``: Keras' SGD keeps the learning rate inside
the momentum buffer and decouples weight decay, and its Adam puts epsilon outside the bias
correction, which misses the torch-semantics reference of :mod:`unitrain.optim` by 1e-2 to
0.4 once the learning rate changes every step (see
``shared/anchors/optimizer-schedule-parity.md``). SGD, the benchmarks' optimizer, keeps a
native form (:data:`OPTIMIZERS`) that updates the parameter in place with ``assign_sub``,
which the rule in ops, assigning ``p - lr * d``, cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import ops, optim
from unitrain.backends.tensorflow import ops as tensorflow_ops

__all__ = [
    "all_finite",
    "clip_coefficient",
    "OPTIMIZERS",
    "global_norm",
    "in_ops",
    "rule_for",
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
    """Apply ``spec``'s update to ``params`` and ``slots``: its native form from
    :data:`OPTIMIZERS`, else its update in ops (:func:`in_ops`).

    Args:
        spec: the optimizer description.
        params: the variables to update.
        grads: one gradient per parameter (already clipped).
        slots: per-parameter state by slot name (``spec.state_slots``).
        step: int64 scalar, updates applied before this one.
        lr: learning rate, a scalar tensor of the parameters' dtype (never a constant, so a new
            value every step does not retrace).
    """
    rule_for(spec)(spec, params, grads, slots, step, lr)


def in_ops(
    spec: optim.AbstractOptimizer,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    """Any optimizer's own update, written in ops, run on each variable and assigned back."""
    count = step + 1
    with ops.using(tensorflow_ops):
        for index, (p, g) in enumerate(zip(params, grads, strict=True)):
            mine = {slot: variables[index] for slot, variables in slots.items()}
            values = {slot: variable.read_value() for slot, variable in mine.items()}
            new_p, updated = spec.update(p.read_value(), g, values, lr, count)
            for slot, value in updated.items():
                mine[slot].assign(value)
            p.assign(new_p)


def _sgd(
    spec: optim.SGD,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    # The rule's arithmetic with the parameter updated in place by assign_sub: assigning
    # p - lr * d as the rule in ops does made a W1 train step ~7 % slower (median of 6
    # interleaved runs of 200 steps, CPU).
    for index, (p, g) in enumerate(zip(params, grads, strict=True)):
        dtype = p.dtype
        if spec.weight_decay:
            g = g + tf.constant(spec.weight_decay, dtype) * p
        direction = g
        if spec.momentum:
            mu = tf.constant(spec.momentum, dtype)
            buffer = mu * slots["momentum"][index] + g
            slots["momentum"][index].assign(buffer)
            direction = g + mu * buffer if spec.nesterov else buffer
        p.assign_sub(lr * direction)


#: ``rule(spec, params, grads, slots, step, lr)``: one update of the variables in place.
_Rule = Callable[..., None]

#: Optimizer type -> its native form on TensorFlow. A type missing here runs its update in
#: ops (:func:`in_ops`).
OPTIMIZERS: dict[type[optim.AbstractOptimizer], _Rule] = {optim.SGD: _sgd}


def rule_for(spec: optim.AbstractOptimizer) -> _Rule:
    """The native form of ``spec`` from :data:`OPTIMIZERS`, else its update in ops.

    Raises:
        ConfigError: the optimizer has neither (only a numpy ``reference_update``).
    """
    return optim.implementation(OPTIMIZERS, spec, "tensorflow", in_ops)
