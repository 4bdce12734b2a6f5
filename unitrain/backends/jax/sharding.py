"""Sharded JAX: parameters and optimizer state split over devices with ``NamedSharding``.

Every array of the backend's device state (parameters, model state, optimizer slots) whose
first axis divides by the device count is placed with a ``NamedSharding`` that splits that
axis over a ``Mesh`` of the devices (each device holds 1/N of it); the rest (biases of odd
sizes, scalars, counters) stays replicated. Each batch is split over the same devices along
its example axis. jit's partitioner (GSPMD) then gathers what a computation needs and
reduces the gradients over the devices, so the update is the global batch's and a run
equals one device's within float tolerance; the clip norm and the non-finite guard are
computed by the same compiled step on the global arrays.

Two ways to get the devices, one compiled step:

- :class:`LocalSharded`: one process over its local devices (on the CPU from
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set before JAX starts; see
  :func:`.distributed.local_devices_environment`).
- :class:`LaunchedSharded`: N processes that ``unitrain train --workers N --shard`` (or
  ``unitrain.cli._launch``) started, one device each, joined by ``jax.distributed``. The
  mesh spans the processes and each update is ONE program over it (multi-controller JAX):
  every process runs the same Trainer over the same global batches (the data order is a
  function of the seed and epoch alone), each places only its rows of a batch
  (``jax.device_put`` onto the split sharding takes this process's part of the host
  array), and the jitted step's collectives (gloo on the CPU) do the rest. To the Trainer's
  arithmetic that is one worker: every process computes the whole batch's loss, weight 1,
  dropout keyed as one worker, so the numbers are one process's. It is unlike launched
  data-parallel JAX (:class:`.distributed.JaxDistributed`), where each process runs its
  own program on its slice and the gradients are summed after. Several devices in each of
  several processes are refused: forced host devices crash XLA's CPU collectives there
  (openxla/xla#16430), and that is the only cheap way to test it.

Checkpoints of launched workers are written without a gather: :func:`local_rows` reads
this process's rows of each sharded array (the backend's ``local_state_dict``) and every
process writes them to a file of its own (:mod:`unitrain.checkpoint._write_shards`), the
few values the processes must agree on passing through :meth:`LaunchedSharded.exchange`.
Loading reads whole tensors on every process and keeps each one's rows, as torch's
sharded backend does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain import ConfigError
from unitrain.backends.jax.distributed import (
    _COORDINATOR,
    _RANK,
    _WORKERS,
    LocalDevices,
    gather_rows,
    join_launched_workers,
)
from unitrain.checkpoint import RowShard

__all__ = [
    "LaunchedSharded",
    "LocalSharded",
    "host_state",
    "local_rows",
    "sharded_placement",
    "sharded_strategy",
]

Batch = tuple[Any, ...]


def sharded_strategy(workers: int | None) -> LocalSharded | LaunchedSharded:
    """``Sharded(workers)`` on jax: over the launched processes when this process is one of
    them, else over this process's local devices."""
    if _COORDINATOR in os.environ:
        return LaunchedSharded.for_request(workers)
    return LocalSharded.for_request(workers)


class LocalSharded(LocalDevices):
    """One process whose state is sharded over its first ``devices`` local devices.

    To the Trainer it is one worker.

    Args:
        devices: how many local devices to shard over.
    """

    @classmethod
    def for_request(cls, workers: int | None) -> LocalSharded:
        """``Sharded(workers)``: over ``workers`` local devices (None: all of them)."""
        if workers is None:
            import jax

            workers = len(jax.local_devices())
        return cls(workers)

    def setup(self, backend: Any) -> None:
        """Split every batch over the devices and shard the backend's state over them."""
        super().setup(backend)
        backend.shard_state(sharded_placement)


class LaunchedSharded:
    """Process ``rank`` of ``world_size`` launched JAX processes sharing one sharded state.

    ``world_size`` is the process count, so the Trainer takes the several-worker paths that
    keep the processes in step (one forward, backward and step per update, agreement on a
    preemption signal at logging points), but every process computes the whole batch
    (:meth:`shards`) and :meth:`all_sum` returns the numbers every process already has:
    the run is one worker's. See the module doc.

    Args:
        world_size: the number of processes (``jax.process_count()``).
        rank: this process's index (``jax.process_index()``).
    """

    #: Reading the full state gathers the rows of every process (``state_dict``), so every
    #: process reads it when rank 0 does (``unitrain.training._run_state.join_snapshot``).
    collective_state = True

    def __init__(self, world_size: int, rank: int) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"LaunchedSharded: rank must be in [0, {world_size}), got {rank=}")
        self.world_size, self.rank = world_size, rank

    @classmethod
    def for_request(cls, workers: int | None) -> LaunchedSharded:
        """The launched process this is, sharding over all ``workers`` processes.

        Raises:
            ConfigError: the launcher's environment is incomplete, ``workers`` is not the
                number of processes launched, or a process has several devices.
        """
        if _RANK not in os.environ or _WORKERS not in os.environ:
            raise ConfigError(
                f"Sharded() on jax found {_COORDINATOR} but not {_RANK} and {_WORKERS}, which "
                "the launcher sets for each process it starts; launch sharded JAX workers with "
                "`unitrain train --workers N --shard ...`, or run one process without "
                f"{_COORDINATOR} to shard over its local devices"
            )
        import jax

        join_launched_workers()
        processes = jax.process_count()
        if workers is not None and workers != processes:
            raise ConfigError(
                f"Sharded({workers}) asks for {workers} workers, but {processes} JAX processes "
                f"were launched; pass Sharded() or launch {workers} workers"
            )
        devices = jax.local_device_count()
        if devices != 1:
            raise ConfigError(
                f"Sharded() over {processes} launched JAX processes needs one device in each, "
                f"but this process sees {devices}; drop "
                "--xla_force_host_platform_device_count from XLA_FLAGS (several CPU devices "
                "in several processes crash XLA's collectives, openxla/xla#16430), give each "
                "process one GPU (CUDA_VISIBLE_DEVICES), or shard one process over its local "
                "devices without --workers"
            )
        return cls(processes, jax.process_index())

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files."""
        return self.rank == 0

    def setup(self, backend: Any) -> None:
        """Spread the backend over a mesh of every process's device, its state sharded."""
        import jax

        devices = sorted(jax.devices(), key=lambda device: device.process_index)
        backend.spread_over(devices)
        backend.shard_state(sharded_placement)

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """The whole batch, weight 1: the compiled step splits it over the processes."""
        return [(batch, 1.0)]

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """The values of the one worker the processes make up, the same on every process.

        Every process computed the same numbers, so their largest is each of them; a flag
        only some processes raised (a preemption signal) reaches all of them so.
        """

        return np.max(gather_rows(values, self.world_size), axis=0).tolist()

    def barrier(self) -> None:
        """Wait for every process."""
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("unitrain")

    def exchange(self, value: Any) -> list[Any]:
        """Every process's ``value`` (small and JSON-shaped: see the checkpoint writer's
        ``Workers``), in rank order, on every process; sent as JSON text, never pickled."""
        from jax.experimental import multihost_utils

        data = np.frombuffer(json.dumps(value).encode(), np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.int64(data.size)))
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        rows = np.asarray(multihost_utils.process_allgather(padded))
        return [json.loads(row[:size].tobytes()) for row, size in zip(rows, sizes)]


def sharded_placement(leaf: Any, mesh: Any) -> Any:
    """The ``NamedSharding`` of ``leaf`` over ``mesh`` (one axis): its first axis split over
    the devices when it divides evenly, else replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    shape = np.shape(leaf)
    if shape and shape[0] and shape[0] % mesh.size == 0:
        return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return NamedSharding(mesh, PartitionSpec())


def host_state(tree: Any) -> Any:
    """``tree``'s arrays as host numpy copies; arrays spread over several processes are
    gathered (a collective every process must join, in the same order)."""
    import jax
    from jax.experimental import multihost_utils

    leaves, structure = jax.tree.flatten(tree)
    spread = [i for i, leaf in enumerate(leaves) if not _addressable(leaf)]
    if spread:
        gathered = multihost_utils.process_allgather([leaves[i] for i in spread], tiled=True)
        for i, value in zip(spread, gathered):
            leaves[i] = np.asarray(value)
    return jax.tree.unflatten(structure, jax.device_get(leaves))


def local_rows(leaf: Any, dtype: Any = None) -> np.ndarray | RowShard:
    """A host copy of this process's rows of ``leaf`` when it is split by rows over several
    processes (a :class:`~unitrain.checkpoint.RowShard`), else of its whole value.

    Raises:
        RuntimeError: a process holds other than one contiguous block of whole rows.
    """
    if _addressable(leaf):
        return np.array(leaf, dtype)
    shards = leaf.addressable_shards
    if leaf.is_fully_replicated:
        return np.array(shards[0].data, dtype)
    index = shards[0].index
    if len(shards) != 1 or any(part != slice(None) for part in index[1:]):
        raise RuntimeError(
            f"this process holds {len(shards)} piece(s) {[s.index for s in shards]} of a "
            f"{leaf.shape} array; a sharded checkpoint needs one block of whole rows each"
        )
    start = (index[0].start or 0) if index else 0
    return RowShard(np.array(shards[0].data, dtype), start, int(leaf.shape[0]))


def _addressable(leaf: Any) -> bool:
    return bool(getattr(leaf, "is_fully_addressable", True))
