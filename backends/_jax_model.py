"""Models and losses of the JAX backend: the portable MLP as a pure function, native models.

A JAX model here is a pure function ``apply(params, x, *, train, rng) -> outputs`` and its
params pytree. :func:`mlp_apply` builds that function for :class:`unitrain.models.MLP`;
:class:`JaxModel` carries a user's own.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from unitrain._errors import ConfigError
from unitrain.models import MLP

__all__ = [
    "ApplyFn",
    "JaxModel",
    "as_apply_and_params",
    "dropout_key",
    "flatten_params",
    "loss_function",
    "mlp_apply",
    "unflatten_params",
]

#: ``apply(params, x, *, train, rng) -> outputs``; ``rng`` is a JAX key in train mode, else None.
ApplyFn = Callable[..., jax.Array]

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # the exact erf form
    "sigmoid": jax.nn.sigmoid,
}


@dataclasses.dataclass(frozen=True)
class JaxModel:
    """A native JAX model: a pure apply function and its initial parameters.

    ``apply(params, x, *, train, rng)`` returns the model's outputs; ``rng`` is a JAX PRNG key
    derived from ``(seed, step, micro_batch)`` in train mode (use it for dropout) and None in
    eval mode. A plain tuple ``(apply, params)`` is accepted wherever a JaxModel is.

    Args:
        apply: the pure function.
        params: a pytree (usually a dict name -> array) of floating arrays; its flattened key
            paths, joined by dots, are the names in the state dict.

    Examples:
        >>> model = JaxModel(lambda p, x, *, train, rng: x @ p["w"], {"w": np.zeros((3, 2))})
        >>> flatten_params(model.params)["w"].shape
        (3, 2)
    """

    apply: ApplyFn
    params: Any


def mlp_apply(spec: MLP) -> ApplyFn:
    """The pure apply function of ``spec`` over canonical ``layers.{i}.weight/bias`` params.

    Dropout keeps an activation where a uniform draw is below ``1 - dropout`` and scales the
    survivors by ``1 / (1 - dropout)``, as the numpy reference does; the masks come from
    ``jax.random`` (not numpy's stream), so they differ from other backends' masks.
    """
    activation = _ACTIVATIONS[spec.activation]
    last, keep = spec.num_layers - 1, 1.0 - spec.dropout

    def apply(params: Mapping[str, jax.Array], x: jax.Array, *, train: bool, rng: Any) -> Any:
        h = x
        for i in range(spec.num_layers):
            h = h @ params[f"layers.{i}.weight"] + params[f"layers.{i}.bias"]
            if i == last:
                return h
            h = activation(h)
            if train and spec.dropout and rng is not None:
                draw = jax.random.uniform(jax.random.fold_in(rng, i), h.shape, h.dtype)
                h = h * ((draw < keep).astype(h.dtype) / keep)
        raise AssertionError("unreachable")

    return apply


def as_apply_and_params(model: Any, seed: int) -> tuple[ApplyFn, Any, bool]:
    """``(apply, params, portable)`` for an MLP, a :class:`JaxModel` or an ``(apply, params)``."""
    if isinstance(model, MLP):
        return mlp_apply(model), model.init_params(seed, np.float32), True
    if isinstance(model, JaxModel):
        return model.apply, model.params, False
    if isinstance(model, tuple) and len(model) == 2 and callable(model[0]):
        return model[0], model[1], False
    raise ConfigError(
        "the jax backend trains unitrain.models.MLP, a backends.jax.JaxModel(apply, params) or "
        f"a tuple (apply, params), got {type(model).__name__}"
    )


def dropout_key(seed: jax.Array, step: jax.Array, micro_batch: Any) -> jax.Array:
    """The PRNG key of one forward pass, from ``(seed, step, micro_batch)`` alone.

    All three may be traced, so a new step never recompiles. ``seed`` is a uint32 pair (low
    and high words), so seeds wider than 32 bits are not truncated.
    """
    key = jax.random.fold_in(jax.random.key(seed[0]), seed[1])
    return jax.random.fold_in(jax.random.fold_in(key, step), micro_batch)


def _cross_entropy(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(outputs, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[:, None], axis=1))


def _mse(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    diff = outputs - targets.reshape(outputs.shape)
    return jnp.mean(diff * diff)


def loss_function(loss: Any) -> tuple[Callable[[jax.Array, jax.Array], jax.Array], bool]:
    """``(loss_fn(outputs, targets) -> scalar, is_classification)`` for a name or a callable."""
    if loss == "cross_entropy":
        return _cross_entropy, True
    if loss == "mse":
        return _mse, False
    if callable(loss):
        return loss, False
    raise ConfigError(f"unknown loss {loss!r}; choose 'cross_entropy', 'mse' or a callable")


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
