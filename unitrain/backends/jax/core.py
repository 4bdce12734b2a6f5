"""Device, determinism and host-conversion helpers of the JAX adapter."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from unitrain import ConfigError

__all__ = [
    "ResidentScalar",
    "host_batch",
    "host_lrs",
    "request_deterministic_gpu_ops",
    "resolve_device",
    "state_array",
    "structured_batch",
]


def state_array(value: Any) -> np.ndarray:
    """A model-state leaf on the host: floats in float32 (x64 is off), integers in int32."""
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    if array.dtype.kind in "iub":
        return array.astype(np.int32 if array.dtype.kind != "b" else np.bool_)
    raise ConfigError(f"model state must hold numbers, got an array of {array.dtype}")


def host_lrs(lrs: Any) -> np.ndarray:
    lrs = np.asarray(lrs, np.float32)
    if lrs.ndim != 1:
        raise ConfigError(f"lrs must be a 1-D array of learning rates, got shape {lrs.shape}")
    return lrs


def resolve_device(device: str) -> Any:
    if device not in ("cpu", "gpu", "auto"):
        raise ConfigError(f"unknown device {device!r}; choose 'cpu', 'gpu' or 'auto'")
    if device != "cpu":
        try:
            return jax.local_devices(backend="gpu")[0]
        except RuntimeError:
            if device == "gpu":
                raise ConfigError(
                    "device='gpu' but jax sees no GPU (install jax[cuda12] for CUDA); "
                    "use 'cpu' or 'auto'"
                ) from None
    return jax.local_devices(backend="cpu")[0]  # a worker's own, under jax.distributed


def request_deterministic_gpu_ops() -> None:
    """Ask XLA for deterministic GPU kernels; only possible before JAX starts its backends."""
    try:  # no public API tells whether the backends have started
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # pragma: no cover - a future jax moved it; precision still applies
        return
    flag = "--xla_gpu_deterministic_ops=true"
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags and not backends_are_initialized():
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


_FLOAT32 = np.dtype(np.float32)


def host_batch(x: Any, y: Any, tokens: bool, classification: bool) -> tuple[Any, Any]:
    """A batch as jit arguments: float32 inputs (int32 token ids), int32 class labels.

    Host arrays of the right dtypes go to the jitted functions as they are: jit copies them to
    the device of the (committed) state in its C++ fast path, quicker than a ``device_put``
    here, and turns int64 labels into int32 there too (x64 is off), cheaper than ``astype``.
    """
    if tokens and not isinstance(x, jax.Array):
        x = np.asarray(x, np.int32)  # ids in range: the model's InputCheck has seen them
    if (
        type(x) is np.ndarray
        and type(y) is np.ndarray
        and (x.dtype is _FLOAT32 or tokens)  # dtypes are singletons; == would coerce
        and (y.dtype.kind == "i" if classification else y.dtype is _FLOAT32)
    ):
        return x, y
    if not isinstance(x, jax.Array):
        # A float64 value past float32's range becomes inf, as on the other backends: the
        # non-finite guard and the Trainer's policy deal with it, so numpy need not warn.
        with np.errstate(over="ignore"):
            x = np.asarray(x, np.float32)
    if not isinstance(y, jax.Array):
        y = np.asarray(y)
        if classification or np.issubdtype(y.dtype, np.integer):
            y = y.astype(np.int32, copy=False)
        elif np.issubdtype(y.dtype, np.floating):
            y = y.astype(np.float32, copy=False)
    return x, y


def structured_batch(batch: Any) -> tuple[Any, Any]:
    """A structured batch (tuples or dicts of arrays, sample weights) as jit arguments:
    ``(inputs, losses.BatchView(inputs, targets, sample_weight))``, integer leaves as int32
    (token ids, labels, masks; x64 is off), the others float32."""
    from unitrain import losses
    from unitrain.structure import map_leaves, split_batch

    def leaf(value: Any) -> Any:
        if isinstance(value, jax.Array):
            return value
        array = np.asarray(value)
        if array.dtype.kind in "iu":
            return array.astype(np.int32, copy=False)
        with np.errstate(over="ignore"):
            return array if array.dtype.kind == "b" else array.astype(np.float32, copy=False)

    inputs, targets, weight = split_batch(batch)
    x = map_leaves(leaf, inputs)
    return x, losses.BatchView(
        x, map_leaves(leaf, targets), None if weight is None else leaf(weight)
    )


class ResidentScalar:
    """A float as a jit argument: a device scalar kept while the value stays the same.

    A host scalar costs a transfer in every call (~3 µs on CPU) and ``device_put`` costs more
    (~19 µs), so the device copy is made on the second call in a row with one value: constant
    and step schedules then pass a resident scalar, and a schedule that changes every update
    pays no more than the plain transfer.

    Args:
        put: places a host value on the device(s) the state lives on.
    """

    def __init__(self, put: Callable[[Any], Any]) -> None:
        self._put = put
        self._previous = self._cached = float("nan")
        self._device: Any = None

    def __call__(self, value: float) -> Any:
        """``value`` as a jit argument."""
        if value == self._cached:
            return self._device
        if value == self._previous:
            self._cached, self._device = value, self._put(np.float32(value))
            return self._device
        self._previous = value
        return np.float32(value)
