"""Optimizers of the JAX backend: each optimizer's rule in ops, and optax where it is faster.

Any optimizer runs by its :meth:`~unitrain.optim.AbstractOptimizer.update`, written once in
:mod:`unitrain.ops`, over every leaf of the parameters (:func:`in_ops`): its state is one
params-shaped pytree per declared slot and an int32 count of the updates applied, from which
the rule computes Adam's bias corrections on the device (``-expm1(t * log(beta))``), so no
step needs the host. SGD alone keeps optax's own parts, whose ``trace`` is torch's
``b = mu * b + g`` (and ``g + mu * b`` for Nesterov), the rule's arithmetic exactly.

Parameter groups (:class:`unitrain.optim.Group`) run in ops: each leaf takes its group's
options and learning rate, found by its canonical name when the update is traced, so they
cost nothing per step. optax's SGD, which knows no groups, steps aside for them.

:func:`optimizer_for` returns a function of the learning rate, which the jitted update
calls with its traced ``lr`` argument: a new learning rate every step never recompiles, and
the optimizer state holds only the moment buffers and the count (no learning-rate leaves, as
``optax.inject_hyperparams`` would add: each leaf of the donated state costs ~0.7 µs per call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from unitrain import ops, optim
from unitrain.backends.jax import ops as jax_ops
from unitrain.backends.jax.model import flatten_params

__all__ = [
    "OPTIMIZERS",
    "InOps",
    "InOpsState",
    "optimizer_for",
    "export_slots",
    "guarded_update",
    "import_slots",
    "in_ops",
]


class InOpsState(NamedTuple):
    """State of :func:`in_ops`: updates applied, and one params-shaped pytree per slot."""

    updates: jax.Array  # int32; not ``count``, which would shadow tuple.count
    slots: dict[str, Any]


class InOps(NamedTuple):
    """An optimizer's update in ops at one learning rate: ``init(params)`` gives its state,
    ``apply(grads, state, params)`` the new parameters and state (the rule's own values, not
    optax updates that a sum would round again)."""

    init: Callable[[Any], InOpsState]
    apply: Callable[[Any, InOpsState, Any], tuple[Any, InOpsState]]


def in_ops(spec: optim.AbstractOptimizer) -> Callable[[Any], InOps]:
    """``spec``'s own :meth:`~unitrain.optim.AbstractOptimizer.update`, leaf by leaf (each with
    its group's options and learning rate), as a function of the learning rate."""

    def init(params: Any) -> InOpsState:
        slots = {slot: jax.tree.map(jnp.zeros_like, params) for slot in spec.state_slots}
        return InOpsState(jnp.zeros((), jnp.int32), slots)

    def at(learning_rate: Any) -> InOps:
        def apply(grads: Any, state: InOpsState, params: Any) -> tuple[Any, InOpsState]:
            count = state.updates + 1
            leaves, tree = jax.tree.flatten(params)
            grad_leaves = jax.tree.leaves(grads)  # the same structure, so the same order
            slot_leaves = {slot: jax.tree.leaves(v) for slot, v in state.slots.items()}
            new_leaves: list[Any] = list(leaves)
            new_slots = {slot: list(values) for slot, values in slot_leaves.items()}
            names = list(flatten_params(params))  # the same walk as jax.tree.leaves
            with ops.using(jax_ops):
                for rule, lr, index in optim.each_parameter_rule(spec, names, learning_rate):
                    p, g = leaves[index], grad_leaves[index]
                    mine = {slot: values[index] for slot, values in slot_leaves.items()}
                    new_p, updated = rule.update(p, g, mine, lr, count)
                    new_leaves[index] = new_p.astype(p.dtype)
                    for slot, value in updated.items():
                        new_slots[slot][index] = value.astype(p.dtype)
            slots = {slot: jax.tree.unflatten(tree, values) for slot, values in new_slots.items()}
            return jax.tree.unflatten(tree, new_leaves), InOpsState(count, slots)

        return InOps(init, apply)

    return at


def _sgd(spec: optim.SGD) -> Callable[[Any], optax.GradientTransformation]:
    def at(learning_rate: Any) -> optax.GradientTransformation:
        # optax.sgd's own parts, in one flat chain: leaving out a zero decay and a zero
        # momentum keeps the arithmetic (and the state) exactly the rule's, which skips both
        # when they are zero, and every level of nesting in the state is a pytree node that
        # each jitted call flattens and rebuilds (wrapping optax.sgd in a chain cost ~4 µs
        # of a ~20 µs W2 step).
        parts = [optax.add_decayed_weights(spec.weight_decay)] if spec.weight_decay else []
        if spec.momentum:
            parts.append(optax.trace(decay=spec.momentum, nesterov=spec.nesterov))
        parts.append(optax.scale_by_learning_rate(learning_rate))
        return parts[0] if len(parts) == 1 else optax.chain(*parts)

    return at


#: Optimizer type -> ``make(spec)``, its native form as a function of the learning rate. A
#: type missing here runs its update in ops (:func:`in_ops`).
OPTIMIZERS: dict[type[optim.AbstractOptimizer], Callable[[Any], Any]] = {optim.SGD: _sgd}


def optimizer_for(spec: optim.AbstractOptimizer) -> Callable[[Any], Any]:
    """``spec``'s update at a given learning rate (traced or not): an optax transformation
    from :data:`OPTIMIZERS`, else :class:`InOps` running its update in ops.

    The state's structure does not depend on the learning rate, so ``init`` may come from
    any value.

    Raises:
        ConfigError: the optimizer has no native form here and no update in ops.

    Examples:
        >>> opt = optimizer_for(optim.SGD(momentum=0.9))
        >>> state = opt(0.1).init({"w": jnp.zeros(2)})
        >>> [type(node).__name__ for node in jax.tree.leaves(state, is_leaf=_is_slot_node)]
        ['TraceState']
    """
    make: Callable[[Any], Callable[[Any], Any]]
    make = optim.implementation({} if spec.groups else OPTIMIZERS, spec, "jax", in_ops)
    return make(spec)


def guarded_update(
    optimizer_at: Callable[[Any], Any],
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
        if isinstance(optimizer, InOps):
            return optimizer.apply(grads, opt_state, params)
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
_SLOT_FIELDS: dict[type, dict[str, str]] = {optax.TraceState: {"momentum": "trace"}}
_SLOT_NODES = (*_SLOT_FIELDS, InOpsState)


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
    if isinstance(node, InOpsState):
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
        if isinstance(node, InOpsState):
            counter = jnp.asarray(step, jnp.int32)
            return InOpsState(counter, {slot: slots[slot] for slot in node.slots})
        return node

    return jax.tree.map(replace, opt_state, is_leaf=_is_slot_node)
