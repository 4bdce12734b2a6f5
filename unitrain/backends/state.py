"""Helpers for the flat ``{"model.<name>": array, "optimizer.<name>": array}`` state layout.

Every backend returns its state in this layout, so checkpoints, comparisons and cross-backend
loading need no knowledge of any framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from unitrain._errors import ConfigError

__all__ = ["check_state", "pack_tensors", "split_state", "unpack_tensors"]


def split_state(
    state: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Split a state dict into ``(model, optimizer)`` dicts with the prefixes removed.

    Examples:
        >>> split_state({"model.w": 1, "optimizer.step": 2})
        ({'w': 1}, {'step': 2})
    """
    model, optimizer = {}, {}
    for key, value in state.items():
        prefix, _, name = key.partition(".")
        if prefix == "model":
            model[name] = value
        elif prefix == "optimizer":
            optimizer[name] = value
        else:
            raise ConfigError(f"state key {key!r} must start with 'model.' or 'optimizer.'")
    return model, optimizer


def check_state(expected: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`ConfigError` unless ``state`` has exactly the keys and shapes expected.

    The message lists missing and unexpected keys and every shape mismatch, which is what a
    user needs to see when a checkpoint of another model or optimizer is loaded.
    """
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{key}: expected shape {tuple(np.shape(expected[key]))}, got {tuple(np.shape(state[key]))}"
        for key in expected
        if key in state and np.shape(expected[key]) != np.shape(state[key])
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if wrong:
            parts.append("shape mismatches: " + "; ".join(wrong))
        raise ConfigError(
            "state does not fit this model and optimizer: "
            + ", ".join(parts)
            + ". Was it saved from a different model or optimizer?"
        )


_TENSOR_TAG = "__tensor__"


def pack_tensors(value: Any, prefix: str, tensors: dict[str, np.ndarray]) -> Any:
    """Replace numpy arrays inside JSON-like ``value`` by references, collecting them.

    Callback states are JSON data, but some hold arrays (early stopping's best weights).
    Arrays move into ``tensors`` under dotted names derived from where they sat, and a
    ``{"__tensor__": name}`` marker takes their place; :func:`unpack_tensors` reverses it.

    Examples:
        >>> tensors = {}
        >>> pack_tensors({"best": 1.0, "w": np.zeros(2)}, "cb", tensors)
        {'best': 1.0, 'w': {'__tensor__': 'cb.w'}}
        >>> list(tensors)
        ['cb.w']
    """
    if isinstance(value, np.ndarray):
        tensors[prefix] = value
        return {_TENSOR_TAG: prefix}
    if isinstance(value, dict):
        return {k: pack_tensors(v, f"{prefix}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [pack_tensors(v, f"{prefix}.{i}", tensors) for i, v in enumerate(value)]
    return value


def unpack_tensors(value: Any, tensors: Mapping[str, np.ndarray]) -> Any:
    """Put the arrays collected by :func:`pack_tensors` back in place."""
    if isinstance(value, dict):
        if set(value) == {_TENSOR_TAG}:
            name = value[_TENSOR_TAG]
            if name not in tensors:
                raise ConfigError(f"callback state refers to a tensor {name!r} that is missing")
            return tensors[name]
        return {k: unpack_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [unpack_tensors(v, tensors) for v in value]
    return value
