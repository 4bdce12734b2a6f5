"""Optimizers of the JAX backend: optax where it matches the reference, by hand where not.

SGD is optax's own ``chain(add_decayed_weights(wd), sgd(lr, momentum, nesterov))``: its
``trace`` is torch's ``b = mu * b + g`` (and ``g + mu * b`` for Nesterov), so it equals the
reference of :mod:`unitrain.optim`. Adam and AdamW are :func:`torch_adam`, because
``optax.adam`` computes ``1 - b2**t`` from a float32 ``b2`` (0.999 rounds to 0.99900001), a
1.3e-5 relative error in the bias correction that drifts 2.7e-6 from the float64 reference
over 100 steps. Lion is optax's own parts. RMSprop is written here (its state a
:class:`SlotState`): optax's ``scale_by_rms`` puts eps inside the square root by default and
``optax.rmsprop`` applies the LR before the momentum trace.

:func:`build_optimizer` returns a function of the learning rate, which the jitted update
calls with its traced ``lr`` argument: a new learning rate every step never recompiles, and
the optimizer state holds only the moment buffers (no learning-rate or count leaves, as
``optax.inject_hyperparams`` would add: each leaf of the donated state costs ~0.7 µs per call).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from unitrain import optim

__all__ = [
    "OPTIMIZERS",
    "SlotState",
    "TorchAdamState",
    "build_optimizer",
    "export_slots",
    "guarded_update",
    "import_slots",
    "torch_adam",
]


class TorchAdamState(NamedTuple):
    """State of :func:`torch_adam`: updates applied, first and second moments."""

    updates: jax.Array  # int32 updates applied; not ``count``, which would shadow tuple.count
    exp_avg: Any
    exp_avg_sq: Any


def _log_beta(beta: float) -> np.float32:
    # log(0) is -inf, and -expm1(t * -inf) = 1 is exactly 1 - 0**t for t >= 1.
    return np.float32(math.log(beta) if beta > 0 else -math.inf)


def torch_adam(
    learning_rate: Any,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
) -> optax.GradientTransformation:
    """Adam (L2 weight decay) or AdamW (decoupled) with torch's formulas, as an optax transform.

    The bias corrections are computed in-graph as ``1 - b**t = -expm1(t * log(b))`` with
    ``log(b)`` taken in float64 on the host: within 3.3e-7 relative of the float64 value for
    every ``t`` up to 200,000 (measured; ``1 - float32(b)**t`` is 2e-5 off for b = 0.999),
    and no host round trip is needed to know how many updates were skipped.

    Args:
        learning_rate: the step size (the jitted update's traced float32 ``lr`` argument).
        beta1: decay of the first moment.
        beta2: decay of the second moment.
        eps: added to ``sqrt(v) / sqrt(1 - beta2**t)``.
        weight_decay: L2 term added to the gradient (Adam) or decoupled decay (AdamW).
        decoupled: AdamW's ``p -= lr * (u + wd * p)`` instead of Adam's coupled L2 term.

    Returns:
        The transformation; its updates are added to the parameters by
        :func:`optax.apply_updates`.
    """
    log_beta1, log_beta2 = _log_beta(beta1), _log_beta(beta2)

    def init(params: Any) -> TorchAdamState:
        return TorchAdamState(
            updates=jnp.zeros((), jnp.int32),
            exp_avg=jax.tree.map(jnp.zeros_like, params),
            exp_avg_sq=jax.tree.map(jnp.zeros_like, params),
        )

    def update(grads: Any, state: TorchAdamState, params: Any = None) -> tuple[Any, Any]:
        count = state.updates + 1
        t = count.astype(jnp.float32)
        bias_correction1 = -jnp.expm1(t * log_beta1)
        sqrt_bias_correction2 = jnp.sqrt(-jnp.expm1(t * log_beta2))

        # Same operations in the same order as unitrain.optim._adam_update.
        if weight_decay and not decoupled:
            grads = jax.tree.map(lambda g, p: g + weight_decay * p, grads, params)
        exp_avg = jax.tree.map(lambda m, g: beta1 * m + (1.0 - beta1) * g, state.exp_avg, grads)
        exp_avg_sq = jax.tree.map(
            lambda v, g: beta2 * v + (1.0 - beta2) * (g * g), state.exp_avg_sq, grads
        )

        def step(m: jax.Array, v: jax.Array, p: jax.Array) -> jax.Array:
            direction = (m / bias_correction1) / (jnp.sqrt(v) / sqrt_bias_correction2 + eps)
            if decoupled and weight_decay:
                direction = direction + weight_decay * p
            return -learning_rate * direction

        updates = jax.tree.map(step, exp_avg, exp_avg_sq, params)
        return updates, TorchAdamState(count, exp_avg, exp_avg_sq)

    return optax.GradientTransformation(init, update)


def _sgd(spec: optim.SGD) -> Callable[[Any], optax.GradientTransformation]:
    def at(learning_rate: Any) -> optax.GradientTransformation:
        # optax.sgd's own parts, in one flat chain: leaving out a zero decay and a zero
        # momentum keeps the arithmetic (and the state) exactly the reference's, which
        # skips both when they are zero, and every level of nesting in the state is a
        # pytree node that each jitted call flattens and rebuilds (wrapping optax.sgd
        # in a chain cost ~4 µs of a ~20 µs W2 step).
        parts = [optax.add_decayed_weights(spec.weight_decay)] if spec.weight_decay else []
        if spec.momentum:
            parts.append(optax.trace(decay=spec.momentum, nesterov=spec.nesterov))
        parts.append(optax.scale_by_learning_rate(learning_rate))
        return parts[0] if len(parts) == 1 else optax.chain(*parts)

    return at


def _adam(spec: optim.AbstractAdam) -> Callable[[Any], optax.GradientTransformation]:
    def at(learning_rate: Any) -> optax.GradientTransformation:
        return torch_adam(
            learning_rate,
            beta1=spec.beta1,
            beta2=spec.beta2,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            decoupled=spec.decoupled,
        )

    return at


class SlotState(NamedTuple):
    """State of the transforms written here for optimizers optax has no torch-exact form of:
    one params-shaped pytree per slot the optimizer declares."""

    slots: dict[str, Any]


def _slot_state(spec: optim.AbstractOptimizer, params: Any) -> SlotState:
    return SlotState({slot: jax.tree.map(jnp.zeros_like, params) for slot in spec.state_slots})


def _rmsprop(spec: optim.RMSprop) -> Callable[[Any], optax.GradientTransformation]:
    # torch's definition: optax's scale_by_rms puts eps inside the square root by default, and
    # optax.rmsprop traces the momentum after scaling by the LR (the Keras convention).
    alpha, eps, momentum, decay = spec.alpha, spec.eps, spec.momentum, spec.weight_decay

    def at(learning_rate: Any) -> optax.GradientTransformation:
        def update(grads: Any, state: SlotState, params: Any = None) -> tuple[Any, Any]:
            if decay:
                grads = jax.tree.map(lambda g, p: g + decay * p, grads, params)
            old, new = state.slots, {}
            new["square_avg"] = jax.tree.map(
                lambda s, g: alpha * s + (1.0 - alpha) * (g * g), old["square_avg"], grads
            )
            variance = new["square_avg"]
            if spec.centered:
                new["grad_avg"] = jax.tree.map(
                    lambda a, g: alpha * a + (1.0 - alpha) * g, old["grad_avg"], grads
                )
                variance = jax.tree.map(lambda s, a: s - a * a, variance, new["grad_avg"])
            direction = jax.tree.map(lambda g, v: g / (jnp.sqrt(v) + eps), grads, variance)
            if momentum:
                new["momentum"] = jax.tree.map(
                    lambda b, d: momentum * b + d, old["momentum"], direction
                )
                direction = new["momentum"]
            updates = jax.tree.map(lambda d: -learning_rate * d, direction)
            return updates, SlotState(new)

        return optax.GradientTransformation(lambda params: _slot_state(spec, params), update)

    return at


def _lion(spec: optim.Lion) -> Callable[[Any], optax.GradientTransformation]:
    def at(learning_rate: Any) -> optax.GradientTransformation:
        # optax.lion's own parts: the sign of the beta1 interpolation, the momentum's beta2
        # update, then the decay added to the sign before -lr, the reference's one expression.
        parts = [optax.scale_by_lion(b1=spec.beta1, b2=spec.beta2)]
        if spec.weight_decay:
            parts.append(optax.add_decayed_weights(spec.weight_decay))
        parts.append(optax.scale_by_learning_rate(learning_rate))
        return optax.chain(*parts)

    return at


#: Optimizer type -> ``make(spec)``, which returns the transformation at a learning rate.
#: A type missing here is refused.
OPTIMIZERS: dict[type[optim.AbstractOptimizer], Callable[[Any], Any]] = {
    optim.SGD: _sgd,
    optim.Adam: _adam,
    optim.AdamW: _adam,
    optim.RMSprop: _rmsprop,
    optim.Lion: _lion,
}


def build_optimizer(
    spec: optim.AbstractOptimizer,
) -> Callable[[Any], optax.GradientTransformation]:
    """The optax transformation for ``spec`` at a given learning rate (traced or not).

    The state's structure does not depend on the learning rate, so ``init`` may come from
    any value.

    Raises:
        ConfigError: :data:`OPTIMIZERS` has no entry for the optimizer's type.

    Examples:
        >>> opt = build_optimizer(optim.SGD(momentum=0.9))
        >>> state = opt(0.1).init({"w": jnp.zeros(2)})
        >>> [type(node).__name__ for node in jax.tree.leaves(state, is_leaf=_is_slot_node)]
        ['TraceState']
    """
    make: Callable[[Any], Callable[[Any], optax.GradientTransformation]]
    make = optim.implementation(OPTIMIZERS, spec, "jax")
    return make(spec)


def guarded_update(
    optimizer_at: Callable[[Any], optax.GradientTransformation],
    params: Any,
    opt_state: Any,
    grads: Any,
    lr: jax.Array,
    clip_norm: jax.Array | None,
    *,
    branch: bool,
    loss: jax.Array | None = None,
) -> tuple[Any, Any, jax.Array]:
    """Clip, update at ``lr``, and keep the old values if the gradient norm (or ``loss``,
    when given) is not finite.

    The clip coefficient is torch's ``max_norm / (norm + 1e-6)`` clamped at one, and a
    non-finite norm skips; ``clip_norm=None`` leaves the clipping out of the program and
    skips when any gradient element is NaN or infinite. Everything stays on the
    device, so no step waits for the host. The skip is a ``lax.cond`` around the update when
    ``branch`` (on the CPU: the update then writes the donated buffers in place, where
    selecting between new and old values costs a copy of every momentum buffer and ~30 % of
    a small step), else a ``jnp.where`` on every leaf (on accelerators, where a conditional
    would make the host wait for the predicate). Both give the same bits.

    Returns:
        ``(params, opt_state, finite)`` where ``finite`` is a boolean scalar.
    """
    leaves = jax.tree.leaves(grads)
    if clip_norm is not None:
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
        finite = jnp.isfinite(norm)
        coefficient = jnp.minimum(clip_norm / (norm + optim.CLIP_EPSILON), 1.0)
        grads = jax.tree.map(lambda g: g * coefficient, grads)
    else:
        finite = _all_finite(leaves)
    if loss is not None:  # a loss can be NaN with finite gradients (a label out of range)
        finite = finite & jnp.isfinite(loss)
    optimizer = optimizer_at(lr)

    def update(params: Any, opt_state: Any) -> tuple[Any, Any]:
        updates, new_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state

    if branch:
        new_params, new_state = jax.lax.cond(finite, update, lambda *old: old, params, opt_state)
        return new_params, new_state, finite
    new_params, new_state = update(params, opt_state)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_state, opt_state), finite


#: Up to this many gradient elements in all, :func:`_all_finite` checks them in one reduction.
_ONE_REDUCTION_MAX = 1 << 16


def _all_finite(leaves: list[jax.Array]) -> jax.Array:
    """Whether every element of ``leaves`` is finite (a boolean scalar).

    Small models (the cost is per kernel): one ``isfinite`` reduction over the concatenated
    gradients, where a reduction per tensor is ~10 small kernels on the CPU and ~7 µs of a
    ~23 µs step (W2 benchmark). Large models (the cost is per element): one sum per tensor,
    which is NaN or infinite if any element is; XLA's CPU code for the concatenated form is
    slow at that size (2 ms for the 270k gradients of the W1 benchmark, vs ~25 µs).
    """
    if sum(g.size for g in leaves) <= _ONE_REDUCTION_MAX:
        return jnp.all(jnp.isfinite(jnp.concatenate([g.ravel() for g in leaves])))
    return jnp.isfinite(sum(jnp.sum(g) for g in leaves))


#: State node type -> {canonical slot: the node's field that holds it}.
_SLOT_FIELDS: dict[type, dict[str, str]] = {
    optax.TraceState: {"momentum": "trace"},
    TorchAdamState: {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
    optax.ScaleByLionState: {"exp_avg": "mu"},
}
_SLOT_NODES = (*_SLOT_FIELDS, SlotState)


def _is_slot_node(node: Any) -> bool:
    return isinstance(node, _SLOT_NODES)


def export_slots(spec: optim.AbstractOptimizer, opt_state: Any) -> dict[str, Any]:
    """Canonical per-parameter optimizer state: ``{suffix: params-shaped pytree}``."""
    nodes = [n for n in jax.tree.leaves(opt_state, is_leaf=_is_slot_node) if _is_slot_node(n)]
    slots = {}
    for slot in spec.state_slots:
        slots[slot] = next(value for n in nodes if (value := _slot_of(n, slot)) is not None)
    return slots


def _slot_of(node: Any, slot: str) -> Any:
    if isinstance(node, SlotState):
        return node.slots.get(slot)
    field = _SLOT_FIELDS[type(node)].get(slot)
    return None if field is None else getattr(node, field)


def import_slots(opt_state: Any, slots: Mapping[str, Any], step: int) -> Any:
    """``opt_state`` with its moment buffers replaced by ``slots`` and its counter by ``step``.

    The counter gets its own array: the state is donated to each update, and XLA refuses one
    buffer donated twice.
    """

    def replace(node: Any) -> Any:
        if isinstance(node, optax.TraceState):
            return node._replace(trace=slots["momentum"])
        if isinstance(node, SlotState):
            return SlotState({slot: slots[slot] for slot in node.slots})
        if isinstance(node, optax.ScaleByLionState):
            return node._replace(count=jnp.asarray(step, jnp.int32), mu=slots["exp_avg"])
        if isinstance(node, TorchAdamState):
            counter = jnp.asarray(step, jnp.int32)
            return TorchAdamState(counter, slots["exp_avg"], slots["exp_avg_sq"])
        return node

    return jax.tree.map(replace, opt_state, is_leaf=_is_slot_node)
