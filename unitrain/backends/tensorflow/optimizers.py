"""The optimizer update rules of the TensorFlow adapter, run inside ``tf.function`` bodies.

The update rules are written by hand instead of using ``keras.optimizers``: Keras' SGD keeps
the learning rate inside the momentum buffer and decouples weight decay, and its Adam puts
epsilon outside the bias correction, which misses the torch-semantics reference of
:mod:`unitrain.optim` by 1e-2 to 0.4 once the learning rate changes every step (see
``shared/anchors/optimizer-schedule-parity.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import optim

__all__ = [
    "OPTIMIZERS",
    "all_finite",
    "clip_coefficient",
    "global_norm",
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
    """Apply the reference update of ``spec`` to ``params`` and ``slots``, by its table entry.

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


def rule_for(spec: optim.AbstractOptimizer) -> _Rule:
    """The update rule of ``spec`` from :data:`OPTIMIZERS`.

    Raises:
        ConfigError: the table has no entry for the optimizer's type.
    """
    return optim.implementation(OPTIMIZERS, spec, "tensorflow")


def _sgd(
    spec: optim.SGD,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
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
        p.assign_sub(lr * direction)  # in place: no p - lr * d temporary to copy back


def _adam(
    spec: optim.AbstractAdam,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    # Bias corrections in float64, like the reference's Python floats, then cast once: in
    # float32, 1 - b2**t alone is 1.3e-5 relative off and breaks the 1e-6 bar.
    t = tf.cast(step + 1, tf.float64)
    bias_correction1 = 1.0 - tf.pow(tf.constant(spec.beta1, tf.float64), t)
    sqrt_bias_correction2 = tf.sqrt(1.0 - tf.pow(tf.constant(spec.beta2, tf.float64), t))
    decoupled = spec.decoupled
    for index, (p, g) in enumerate(zip(params, grads, strict=True)):
        dtype = p.dtype
        if spec.weight_decay and not decoupled:
            g = g + tf.constant(spec.weight_decay, dtype) * p
        exp_avg, exp_avg_sq = slots["exp_avg"][index], slots["exp_avg_sq"][index]
        m = tf.constant(spec.beta1, dtype) * exp_avg + tf.constant(1.0 - spec.beta1, dtype) * g
        v = tf.constant(spec.beta2, dtype) * exp_avg_sq + tf.constant(1.0 - spec.beta2, dtype) * (
            g * g
        )
        exp_avg.assign(m)
        exp_avg_sq.assign(v)
        denominator = tf.sqrt(v) / tf.cast(sqrt_bias_correction2, dtype) + tf.constant(
            spec.eps, dtype
        )
        direction = (m / tf.cast(bias_correction1, dtype)) / denominator
        if decoupled and spec.weight_decay:
            direction = direction + tf.constant(spec.weight_decay, dtype) * p
        p.assign_sub(lr * direction)


def _rmsprop(
    spec: optim.RMSprop,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    # torch's definition (Keras's RMSprop puts eps inside the square root).
    for index, (p, g) in enumerate(zip(params, grads, strict=True)):
        dtype = p.dtype
        alpha, one_minus = tf.constant(spec.alpha, dtype), tf.constant(1.0 - spec.alpha, dtype)
        if spec.weight_decay:
            g = g + tf.constant(spec.weight_decay, dtype) * p
        square_avg = alpha * slots["square_avg"][index] + one_minus * (g * g)
        slots["square_avg"][index].assign(square_avg)
        if spec.centered:
            grad_avg = alpha * slots["grad_avg"][index] + one_minus * g
            slots["grad_avg"][index].assign(grad_avg)
            square_avg = square_avg - grad_avg * grad_avg
        direction = g / (tf.sqrt(square_avg) + tf.constant(spec.eps, dtype))
        if spec.momentum:
            direction = tf.constant(spec.momentum, dtype) * slots["momentum"][index] + direction
            slots["momentum"][index].assign(direction)
        p.assign_sub(lr * direction)


def _lion(
    spec: optim.Lion,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    # Keras's Lion decays the weights in a separate assignment; the reference decays them in
    # the update's expression.
    for index, (p, g) in enumerate(zip(params, grads, strict=True)):
        dtype = p.dtype
        m = slots["exp_avg"][index]
        beta1, beta2 = spec.beta1, spec.beta2
        interpolation = tf.constant(beta1, dtype) * m + tf.constant(1.0 - beta1, dtype) * g
        direction = tf.sign(interpolation)
        if spec.weight_decay:
            direction = direction + tf.constant(spec.weight_decay, dtype) * p
        m.assign(tf.constant(beta2, dtype) * m + tf.constant(1.0 - beta2, dtype) * g)
        p.assign_sub(lr * direction)


#: ``rule(spec, params, grads, slots, step, lr)``: one update of the variables in place.
_Rule = Callable[..., None]

#: Optimizer type -> its update rule on TensorFlow. A type missing here is refused.
OPTIMIZERS: dict[type[optim.AbstractOptimizer], _Rule] = {
    optim.SGD: _sgd,
    optim.Adam: _adam,
    optim.AdamW: _adam,
    optim.RMSprop: _rmsprop,
    optim.Lion: _lion,
}
