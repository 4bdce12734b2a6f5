"""checkpoints (continued): loading a state dict is strict.

A missing key, an extra key or an array of another shape or dtype (even one that would
broadcast) is refused and leaves the backend's state as it was: a partial or coerced load
would resume a run from numbers nobody saved. Same family as :mod:`.checkpoints`, whose
``trained`` backends these checks load into.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._probes import copy_state
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier_data
from unitrain.conformance.checks.checkpoints import trained


@check(
    "checkpoints",
    "rejects_missing_key",
    guards="a partial load that keeps old values for missing keys",
)
def rejects_missing_key(ctx: Context) -> None:
    """load_state_dict refuses a state with a key missing (no silent partial load)."""
    backend = trained(ctx, optim.SGD(momentum=0.9))
    state = backend.state_dict()
    for key in ("model.layers.1.bias", "optimizer.layers.0.weight.momentum"):
        broken = {k: v for k, v in state.items() if k != key}
        try:
            backend.load_state_dict(broken)
        except Exception:
            continue
        ctx.require(False, f"load_state_dict accepted a state without {key!r}")


@check(
    "checkpoints",
    "rejects_wrong_shape",
    guards="arrays of another shape accepted",
)
def rejects_wrong_shape(ctx: Context) -> None:
    """load_state_dict refuses a state whose tensor has the wrong shape."""
    backend = trained(ctx, optim.SGD())
    state = backend.state_dict()
    state["model.layers.0.weight"] = np.zeros((7, 16), state["model.layers.0.weight"].dtype)
    try:
        backend.load_state_dict(state)
    except Exception:
        return
    ctx.require(False, "load_state_dict accepted a (7, 16) tensor for a (6, 16) weight")


def _refused(ctx: Context, backend: Any, state: dict[str, np.ndarray], what: str) -> None:
    """``load_state_dict(state)`` must raise and leave the backend's state as it was."""
    before = copy_state(backend.state_dict())
    try:
        backend.load_state_dict(state)
    except Exception:
        ctx.require_identical(f"state after refusing {what}", backend.state_dict(), before)
        return
    ctx.require(False, f"load_state_dict accepted {what}; it must refuse it, changing nothing")


@check(
    "checkpoints",
    "rejects_broadcastable_shape",
    guards="a (1, n) row, a scalar or a transposed array broadcast or reshaped into place",
)
def rejects_broadcastable_shape(ctx: Context) -> None:
    """load_state_dict refuses arrays that would broadcast or reshape into place.

    A ``(1, n)`` row for a ``(k, n)`` weight, a scalar for a bias or a momentum buffer, and a
    transposed weight (same size): each is refused, and the state is left unchanged.
    """
    backend = trained(ctx, optim.SGD(momentum=0.9))
    state = backend.state_dict()
    weight, bias = state["model.layers.0.weight"], state["model.layers.1.bias"]
    momentum = state["optimizer.layers.0.bias.momentum"]
    cases = {
        "model.layers.0.weight": (
            weight[:1],
            f"a {weight[:1].shape} row for a {weight.shape} weight",
        ),
        "model.layers.1.bias": (bias[0], f"a scalar for a {bias.shape} bias"),
        "optimizer.layers.0.bias.momentum": (
            momentum[0],
            f"a scalar for a {momentum.shape} momentum buffer",
        ),
        "model.layers.1.weight": (
            np.ascontiguousarray(state["model.layers.1.weight"].T),
            "a transposed (3, 16) array for a (16, 3) weight",
        ),
    }
    for key, (value, what) in cases.items():
        _refused(ctx, backend, {**copy_state(state), key: np.asarray(value)}, what)


@check(
    "checkpoints",
    "rejects_extra_key",
    guards="keys of another model or optimizer silently ignored",
)
def rejects_extra_key(ctx: Context) -> None:
    """load_state_dict refuses a state with keys the model and optimizer do not have."""
    backend = trained(ctx, optim.SGD(momentum=0.9))
    state = backend.state_dict()
    extras = {
        "model.layers.2.weight": np.zeros((3, 3), ctx.state_dtype),
        "optimizer.layers.0.weight.exp_avg": np.zeros_like(state["model.layers.0.weight"]),
        "model.running_mean": np.zeros(16, ctx.state_dtype),
    }
    for key, value in extras.items():
        _refused(ctx, backend, {**copy_state(state), key: value}, f"the extra key {key!r}")


@check(
    "checkpoints",
    "state_dict_is_a_copy",
    guards="state_dict or load_state_dict aliasing the caller's arrays",
)
def state_dict_is_a_copy(ctx: Context) -> None:
    """Arrays returned by state_dict, or passed to load_state_dict, are not aliased.

    Three ways: a state dict taken before one more update must not change with it (arrays
    that are views of the backend's own memory, a CPU tensor's or a device buffer's, do);
    writing into returned arrays, or into arrays given to load_state_dict, must not change
    the backend.
    """
    backend = trained(ctx, optim.SGD(momentum=0.9))
    returned = backend.state_dict()
    kept = copy_state(returned)
    x, y = classifier_data(ctx, 3)
    ctx.update(backend, (x[:8], y[:8]), 0.05)
    ctx.require_identical(
        "a state_dict() taken before one more update, after it",
        returned,
        kept,
        "the update wrote into arrays state_dict() had returned: they share the backend's "
        "memory (a view of a CPU tensor or of a device buffer) instead of being copies",
    )
    before = copy_state(backend.state_dict())
    returned = backend.state_dict()
    for value in returned.values():
        if value.ndim:
            value[...] = 123.0
    ctx.require_identical(
        "state after mutating state_dict()'s arrays", backend.state_dict(), before
    )
    given = copy_state(before)
    backend.load_state_dict(given)
    for value in given.values():
        if value.ndim:
            value[...] = -7.0
    ctx.require_identical(
        "state after mutating load_state_dict()'s input", backend.state_dict(), before
    )
