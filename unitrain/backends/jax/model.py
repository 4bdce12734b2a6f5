"""Models and losses of the JAX backend: native models, losses, params pytrees by name.

A JAX model here is a pure function and its params pytree; a model with state (BatchNorm
statistics, counters: anything not trained by the optimizer) has a state pytree too and an
apply that returns the new state beside the outputs. :class:`.layers.PortableModule` builds the
function of a portable model (any :mod:`unitrain.models` layer); :class:`JaxModel` carries a
user's own. Inside the backend every model is called in the stateful form
(:data:`StatefulApplyFn`); a stateless one gets an empty state that costs nothing.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from unitrain import ConfigError, losses, ops
from unitrain.backends.jax import ops as jax_ops
from unitrain.backends.jax.layers import PortableModule
from unitrain.models import MLP

__all__ = [
    "ApplyFn",
    "JaxModel",
    "NativeModel",
    "StatefulApplyFn",
    "as_native_model",
    "dropout_key",
    "portable_dropout_key",
    "flatten_params",
    "is_flat_dict",
    "is_portable",
    "loss_function",
    "mlp_apply",
    "shape_template",
    "state_names",
    "unflatten_params",
]

#: ``apply(params, x, *, train, rng) -> outputs``; ``rng`` is a JAX key in train mode, else None.
ApplyFn = Callable[..., jax.Array]
#: ``apply(params, state, x, *, train, rng) -> (outputs, new_state)``.
StatefulApplyFn = Callable[..., tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class JaxModel:
    """A native JAX model: a pure apply function, its initial parameters and optional state.

    Without state, ``apply(params, x, *, train, rng)`` returns the model's outputs. With
    state (``state`` not None), ``apply(params, state, x, *, train, rng)`` returns
    ``(outputs, new_state)``: the backend keeps ``new_state`` after every train-mode forward
    (as torch updates BatchNorm buffers in its forward) and drops it in eval mode, so
    evaluation never changes the state. ``rng`` is a JAX PRNG key derived from ``(seed,
    step, micro_batch)`` in train mode (use it for dropout) and None in eval mode. A plain
    tuple ``(apply, params)`` is accepted wherever a stateless JaxModel is.

    Args:
        apply: the pure function.
        params: a pytree (usually a dict name -> array) of floating arrays, trained by the
            optimizer; its flattened key paths, joined by dots, are the names in the state
            dict.
        state: None, or a pytree of arrays the optimizer never touches (BatchNorm running
            statistics, counters); saved, restored and compared like the parameters, under
            its own dotted names, which must differ from the parameters'.

    Examples:
        >>> import numpy as np
        >>> model = JaxModel(lambda p, x, *, train, rng: x @ p["w"], {"w": np.zeros((3, 2))})
        >>> flatten_params(model.params)["w"].shape
        (3, 2)
        >>> def apply(p, s, x, *, train, rng):
        ...     return x @ p["w"], {"calls": s["calls"] + 1} if train else s
        >>> JaxModel(apply, {"w": np.zeros((3, 2))}, {"calls": np.int32(0)}).stateful
        True
    """

    apply: Callable[..., Any]
    params: Any
    state: Any = None

    @property
    def stateful(self) -> bool:
        """Whether the model carries state (and ``apply`` takes and returns it)."""
        return self.state is not None


class NativeModel(NamedTuple):
    """A native model in the backend's terms: the stateful apply, params, state."""

    apply: StatefulApplyFn
    params: Any
    state: Any


def mlp_apply(spec: MLP) -> ApplyFn:
    """Deprecated: the stateless apply of ``spec``; use :class:`.layers.PortableModule`.

    Every portable model, the MLP included, now runs through :class:`.layers.PortableModule`
    (stateful form, the same dropout masks as this function drew); this stays for code that
    imported it.
    """
    warnings.warn(
        "unitrain.backends.jax.model.mlp_apply is deprecated: use "
        "unitrain.backends.jax.layers.PortableModule(model), which runs any portable model "
        "and returns (outputs, new_state)",
        DeprecationWarning,
        stacklevel=2,
    )
    stateful = PortableModule(spec)

    def apply(params: Mapping[str, jax.Array], x: jax.Array, *, train: bool, rng: Any) -> Any:
        # Without a key it never dropped; an MLP has no state, so that is eval mode.
        return stateful(params, {}, x, train=train and rng is not None, rng=rng)[0]

    return apply


def with_state(apply: ApplyFn) -> StatefulApplyFn:
    """``apply`` in the stateful form, passing an (empty) state through unchanged."""

    def stateful(params: Any, state: Any, x: jax.Array, *, train: bool, rng: Any) -> Any:
        return apply(params, x, train=train, rng=rng), state

    return stateful


def as_native_model(model: Any) -> NativeModel:
    """A :class:`JaxModel` or an ``(apply, params)`` tuple as a :class:`NativeModel`."""
    if isinstance(model, tuple) and len(model) == 2 and callable(model[0]):
        model = JaxModel(model[0], model[1])
    if not isinstance(model, JaxModel):
        raise ConfigError(
            "the jax backend trains a unitrain.models model (MLP, ...), a "
            "backends.jax.JaxModel(apply, params[, state]) or a tuple (apply, params), "
            f"got {type(model).__name__}"
        )
    if not model.stateful:
        return NativeModel(with_state(model.apply), model.params, {})
    clash = sorted(set(flatten_params(model.params)) & set(flatten_params(model.state)))
    if clash:
        raise ConfigError(
            f"JaxModel: state names {clash} are also parameter names; the state dict holds "
            "both under model.<name>, so rename one of them"
        )
    return NativeModel(model.apply, model.params, model.state)


def dropout_key(seed: jax.Array, step: jax.Array, micro_batch: Any) -> jax.Array:
    """The PRNG key of one forward pass, from ``(seed, step, micro_batch)`` alone.

    All three may be traced, so a new step never recompiles. ``seed`` is a uint32 pair (low
    and high words), so seeds wider than 32 bits are not truncated.
    """
    key = jax.random.fold_in(jax.random.key(seed[0]), seed[1])
    return jax.random.fold_in(jax.random.fold_in(key, step), micro_batch)


def portable_dropout_key(seed: jax.Array, step: jax.Array, micro_batch: Any) -> jax.Array:
    """The portable key of one forward pass (``ops.random.stream_key(seed, step,
    micro_batch)``, an int32 pair), from the traced seed words (low, high), step and
    micro-batch: the key numpy, torch and TensorFlow derive from the same numbers."""
    words = jax.lax.bitcast_convert_type(jnp.stack([seed[1], seed[0]]), jnp.int32)
    with ops.using(jax_ops):
        return ops.random.stream_key(words, step, micro_batch)


def loss_function(loss: Any) -> tuple[Callable[[jax.Array, jax.Array], jax.Array], bool]:
    """``(loss_fn(outputs, targets) -> scalar, takes class labels)`` for a
    :mod:`unitrain.losses` loss, its type name, or a native callable.

    A loss runs its own code in ops, traced by these ops into the jitted functions. A label
    outside ``[0, classes)`` makes cross-entropy NaN, which the non-finite guard skips and the
    Trainer's policy reports: a check on the host would wait for the device every step.
    """
    loss = losses.resolve_loss(loss)
    if not isinstance(loss, losses.AbstractLoss):
        return loss, False  # a native callable
    written = loss

    def generic(outputs: jax.Array, targets: jax.Array) -> jax.Array:
        with ops.using(jax_ops):  # while tracing: the compiled code holds jax's ops alone
            result: jax.Array = written(outputs, targets)
        return result

    return generic, loss.takes_labels


def _key_name(entry: Any) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def flatten_params(params: Any) -> dict[str, Any]:
    """``{dotted name: leaf}`` of a params pytree; a flat dict keeps its own keys.

    Examples:
        >>> list(flatten_params({"a": {"w": 1, "b": 2}, "c": [3]}))
        ['a.b', 'a.w', 'c.0']
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in leaves}


def unflatten_params(template: Any, flat: Mapping[str, Any]) -> Any:
    """A pytree shaped like ``template`` whose leaves are ``flat``'s values, by name."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = [".".join(_key_name(k) for k in path) for path, _ in leaves]
    return jax.tree_util.tree_unflatten(treedef, [flat[name] for name in names])


def is_flat_dict(params: Any) -> bool:
    return isinstance(params, Mapping) and not any(
        isinstance(v, (Mapping, list, tuple)) for v in params.values()
    )


def is_portable(model: Any) -> bool:
    """Whether ``model`` is a :mod:`unitrain.models` description (weights drawn in numpy)."""
    return all(callable(getattr(model, name, None)) for name in ("init_params", "init_state"))


def state_names(tree: Any) -> list[str]:
    """State-dict names in the model's own order (layer by layer for a portable model), not in
    the sorted order of a JAX dict pytree."""
    return list(tree) if is_flat_dict(tree) else list(flatten_params(tree))


def shape_template(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
