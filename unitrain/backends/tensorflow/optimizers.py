"""The optimizer step of the TensorFlow adapter, run inside ``tf.function`` bodies.

Every optimizer runs by its own :meth:`~unitrain.optim.AbstractOptimizer.update`, written once
in :mod:`unitrain.ops`, not by ``keras.optimizers``: Keras' SGD keeps the learning rate inside
the momentum buffer and decouples weight decay, and its Adam puts epsilon outside the bias
correction, which misses the torch-semantics reference of :mod:`unitrain.optim` by 1e-2 to
0.4 once the learning rate changes every step (see
``shared/anchors/optimizer-schedule-parity.md``). SGD, the benchmarks' optimizer, keeps a
native form (:data:`OPTIMIZERS`) that updates the parameter in place with ``assign_sub``,
which the rule in ops, assigning ``p - lr * d``, cannot.

Parameter groups (:class:`unitrain.optim.Group`) are applied by both: each variable runs its
group's options at its group's learning rate, the variable found by its own name, which is
its canonical name (checked by :func:`bind`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import ConfigError, ops, optim
from unitrain.backends.tensorflow import ops as tensorflow_ops

__all__ = [
    "all_finite",
    "bind",
    "clip_coefficient",
    "OPTIMIZERS",
    "global_norm",
    "in_ops",
    "optimizer_for",
    "update_parameters",
]


_Options = TypeVar("_Options")


def bind(options: _Options, model: Any, params: Mapping[str, tf.Variable]) -> _Options:
    """``options`` with its optimizer resolved for ``model`` (:func:`unitrain.optim.bind_options`),
    checked to run here over ``params`` (variables by canonical name).

    Raises:
        ConfigError: the optimizer cannot run here (only a numpy ``reference_update``), a group
            matches no parameter, or the optimizer has groups and a variable's own name is not
            its canonical name (a ``tf.Module`` whose variables were named otherwise).
    """
    options = optim.bind_options(options, model)
    spec = options.optimizer  # type: ignore[attr-defined]
    optimizer_for(spec)  # refuse, now, one that cannot run
    if spec.groups:
        for name, variable in params.items():
            if _name_of(variable) != name:
                raise ConfigError(
                    f"parameter groups on the tensorflow backend find each variable by its own "
                    f"name, and the variable at {name!r} is named {variable.name!r}; name the "
                    "model's variables as their state-dict names, or train without groups"
                )
        optim.parameter_groups(spec, params)  # a pattern that matches nothing fails here
    return options


def _name_of(variable: tf.Variable) -> str:
    """The canonical name of a variable: Keras writes its path with ``/`` (``dense/kernel:0``)."""
    return variable.name.rpartition(":")[0].replace("/", ".")


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
    optimizer_for(spec)(spec, params, grads, slots, step, lr)


def in_ops(
    spec: optim.AbstractOptimizer,
    params: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    slots: dict[str, list[tf.Variable]],
    step: tf.Tensor,
    lr: tf.Tensor,
) -> None:
    """Any optimizer's own update, written in ops, run on each variable (with its group's
    options and learning rate) and assigned back."""
    count = step + 1
    names = [_name_of(p) for p in params]
    with ops.using(tensorflow_ops):
        for rule, group_lr, index in optim.each_parameter_rule(spec, names, lr):
            p, g = params[index], grads[index]
            mine = {slot: variables[index] for slot, variables in slots.items()}
            values = {slot: variable.read_value() for slot, variable in mine.items()}
            new_p, updated = rule.update(p.read_value(), g, values, group_lr, count)
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
    names = [_name_of(p) for p in params]
    for options, group_lr, index in optim.each_parameter_rule(spec, names, lr):
        rule = cast(optim.SGD, options)  # a group of an SGD is an SGD
        p, g, dtype = params[index], grads[index], params[index].dtype
        if rule.weight_decay:
            g = g + tf.constant(rule.weight_decay, dtype) * p
        direction = g
        if rule.momentum:
            mu = tf.constant(rule.momentum, dtype)
            buffer = mu * slots["momentum"][index] + g
            slots["momentum"][index].assign(buffer)
            direction = g + mu * buffer if rule.nesterov else buffer
        p.assign_sub(group_lr * direction)


#: ``rule(spec, params, grads, slots, step, lr)``: one update of the variables in place.
_Rule = Callable[..., None]

#: Optimizer type -> its native form on TensorFlow. A type missing here runs its update in
#: ops (:func:`in_ops`).
OPTIMIZERS: dict[type[optim.AbstractOptimizer], _Rule] = {optim.SGD: _sgd}


def optimizer_for(spec: optim.AbstractOptimizer) -> _Rule:
    """The native form of ``spec`` from :data:`OPTIMIZERS`, else its update in ops.

    Raises:
        ConfigError: the optimizer has neither (only a numpy ``reference_update``).
    """
    return optim.implementation(OPTIMIZERS, spec, "tensorflow", in_ops)
