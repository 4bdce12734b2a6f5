"""Sharded JAX: parameters and optimizer state split over one process's local devices.

:class:`LocalSharded` is :class:`.distributed.LocalDevices` with the state sharded instead
of replicated: every array of the backend's device state (parameters, model state, optimizer
slots) whose first axis divides by the device count is placed with a ``NamedSharding`` that
splits that axis over a ``Mesh`` of the devices (each device holds 1/N of it); the rest
(biases of odd sizes, scalars, counters) stays replicated. Each batch is split over the same
devices along its example axis. jit's partitioner (GSPMD) then gathers what a computation
needs and reduces the gradients over the devices, so the update is the global batch's and a
run equals one device's within float tolerance; the clip norm and the non-finite guard are
computed by the same compiled step on the global arrays.

To the Trainer it is one worker. On the CPU the devices come from
``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set before JAX starts
(:func:`.distributed.local_devices_environment`). Across launched processes JAX is not
sharded yet: that needs each update as one program over a mesh spanning the processes, where
launched workers run one program each and sum gradients (:mod:`.distributed`); several forced
host devices in each of several processes, the cheap CPU test of it, crash in XLA's CPU
collectives (openxla/xla#16430).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from unitrain import ConfigError
from unitrain.backends.jax.distributed import LocalDevices

__all__ = ["LocalSharded", "sharded_placement"]


class LocalSharded(LocalDevices):
    """One process whose state is sharded over its first ``devices`` local devices.

    Args:
        devices: how many local devices to shard over.
    """

    @classmethod
    def for_request(cls, workers: int | None) -> LocalSharded:
        """``Sharded(workers)``: over ``workers`` local devices (None: all of them).

        Raises:
            ConfigError: this process was started as one of several JAX workers.
        """
        if "UNITRAIN_JAX_COORDINATOR" in os.environ:
            raise ConfigError(
                "Sharded() on jax shards one process's local devices, not launched workers; "
                "run one process with XLA_FLAGS=--xla_force_host_platform_device_count=N on "
                "the CPU (or N local GPUs), without --workers"
            )
        if workers is None:
            import jax

            workers = len(jax.local_devices())
        return cls(workers)

    def setup(self, backend: Any) -> None:
        """Split every batch over the devices and shard the backend's state over them."""
        super().setup(backend)
        backend.shard_state(sharded_placement)


def sharded_placement(leaf: Any, mesh: Any) -> Any:
    """The ``NamedSharding`` of ``leaf`` over ``mesh`` (one axis): its first axis split over
    the devices when it divides evenly, else replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    shape = np.shape(leaf)
    if shape and shape[0] and shape[0] % mesh.size == 0:
        return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return NamedSharding(mesh, PartitionSpec())
