"""Sharded training: parameters, gradients and optimizer state split over the workers.

Data-parallel workers (:mod:`unitrain.backends.strategy`) each hold the whole model, its
gradients and its optimizer state. Sharded workers hold ``1/N`` of each (ZeRO-3 / FSDP): a
layer's full parameters exist only while it computes. The arithmetic is the data-parallel
one — every worker takes its slice of the global batch, the gradients are reduced to the
global batch's mean — so a sharded run equals one worker's within float tolerance, and the
quantities that decide an update are computed on the full (global) tensors: the clip norm
and the non-finite guard see every shard, so every worker clips by the same factor and skips
the same updates.

``Trainer(strategy=Sharded())`` (or ``unitrain train --workers N --shard``, which sets
:data:`SHARD_ENV` for the workers it starts) asks the backend for its engine's sharded
strategy (:class:`ShardedParallel`): torch's FSDP2 (``fully_shard``) over the workers
torchrun started; JAX's ``NamedSharding`` over one process's local devices, or over the
launched processes (one device each, each update one program over them). A backend that
cannot shard says why (:func:`sharded_strategy_for`;
TensorFlow's own reason in its backend).

Checkpoints keep the one-directory format, with no gather where the engine allows: each
worker writes its own rows of the sharded tensors (the backend's ``local_state_dict`` and
the strategy's ``exchange``; see :mod:`unitrain.training._saving`), so a sharded run's
checkpoint never passes through one process, and it resumes on any worker count, sharded or
not, and on any backend. JAX within one process writes full tensors; launched JAX
processes write their own rows.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Protocol, runtime_checkable

from unitrain._errors import ConfigError

__all__ = [
    "SHARD_ENV",
    "Sharded",
    "ShardedParallel",
    "ShardingUnsupported",
    "shard_requested",
    "sharded_strategy_for",
]

#: Set to ``1`` in a launched worker's environment to train sharded without a code change.
SHARD_ENV = "UNITRAIN_SHARD"


class ShardingUnsupported(ConfigError):
    """The backend's engine cannot shard a model over workers at all (as opposed to this
    process not being set up for it); the message says why and what to use instead."""


@dataclasses.dataclass(frozen=True)
class Sharded:
    """A request to split parameters, gradients and optimizer state over workers.

    Args:
        workers: how many workers share the model; None takes the launcher's worker count
            (torchrun's ``WORLD_SIZE``) or, for a backend that shards over local devices,
            every local device.

    Examples:
        >>> Sharded(2)
        Sharded(workers=2)
        >>> Sharded(0)
        Traceback (most recent call last):
        ...
        unitrain._errors.ConfigError: Sharded: workers must be an int >= 1 or None, got workers=0
    """

    workers: int | None = None

    def __post_init__(self) -> None:
        workers = self.workers
        if workers is not None and (
            isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
        ):
            raise ConfigError(f"Sharded: workers must be an int >= 1 or None, got {workers=}")


@runtime_checkable
class ShardedParallel(Protocol):
    """Optional backend method: the engine's strategy that shards the model over workers."""

    def sharded_strategy(self, workers: int | None) -> Any:
        """A Strategy sharding parameters, gradients and optimizer state over ``workers``;
        raises ConfigError (saying why) where this process cannot, ShardingUnsupported
        where the engine cannot."""
        ...


def shard_requested() -> bool:
    """Whether the launcher asked its workers to train sharded (``SHARD_ENV=1``)."""
    return os.environ.get(SHARD_ENV, "") == "1"


def sharded_strategy_for(backend: Any, request: Sharded) -> Any:
    """The backend's sharded strategy for ``request``.

    Raises:
        ShardingUnsupported: the backend has no sharded engine (it may say why itself).
        ConfigError: this process cannot shard (not launched, another worker count).
    """
    if not isinstance(backend, ShardedParallel):
        name = getattr(backend, "name", type(backend).__name__)
        raise ShardingUnsupported(
            f"the {name} backend cannot shard a model over workers; use the torch or jax "
            "backend for Sharded(), or train data-parallel (every worker holds the whole "
            "model) with strategy=None under a launcher"
        )
    return backend.sharded_strategy(request.workers)
