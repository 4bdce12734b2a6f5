"""Data-parallel TensorFlow: ``MultiWorkerMirroredStrategy`` across processes, and
``MirroredStrategy`` over the local devices of one process (:class:`LocalDevices`).

Every worker reads its place from ``TF_CONFIG`` (``unitrain.cli._launch`` writes one per worker
with local ports; across machines the user sets it, see docs/data-parallel.md) and creates the
strategy in :func:`join_launched_workers` before TensorFlow makes any tensor, as the strategy
requires; the TensorFlow backend calls it first thing. One replica per worker.

TensorFlow *sums* gradients over replicas, so a loss must be scaled by the global batch
(``tf.nn.compute_average_loss(per_example, global_batch_size)``); a per-replica mean loss
doubles the gradients on two workers (issue 13). Here each worker weights its slice's mean
loss by ``n_r / n``, which is that scaling, and before each update the worker's gradients
are flattened into one vector and summed over the workers by the strategy (one collective
per update). Host numbers are summed the same way in float64.

:class:`LocalDevices` is the mirror of ``unitrain.backends.jax.LocalDevices``: one process,
one worker to the Trainer, each batch split over N devices (logical CPUs, or GPUs). Inside
every compiled step, :func:`mirrored_loss_and_grads` has the MirroredStrategy run one replica
per device on its contiguous slice, with the loss
``compute_average_loss(per_example, global_batch_size)``, and sums the replicas' gradients
(``strategy.reduce(SUM)``); the update is then applied once. The variables stay where the
backend made them, one copy that every replica reads: mirrored variables must be created
under ``strategy.scope()``, which a Keras model handed to the Trainer already built was not.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain import ConfigError
from unitrain.backends.common import SummingWorkers
from unitrain.backends.strategy import SingleProcess

__all__ = [
    "LocalDevices",
    "TensorFlowDistributed",
    "join_launched_workers",
    "launch_command",
    "local_devices_environment",
    "mirrored_loss_and_grads",
    "worker_environment",
]

_strategy: Any = None


def worker_environment(rank: int, workers: int, ports: list[int]) -> dict[str, str]:
    """``TF_CONFIG`` of worker ``rank`` in a cluster of ``workers`` on local ports."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
    }


def launch_command(workers: int) -> list[str]:
    """The command that starts ``workers`` local workers of the Python program that follows."""
    launcher = [sys.executable, "-m", "unitrain.cli._launch", f"--workers={workers}"]
    return [*launcher, f"--environment={__name__}:worker_environment", "--"]


def _cluster() -> tuple[int, int] | None:
    """``(rank, workers)`` from ``TF_CONFIG`` when it describes several workers."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = len(config.get("cluster", {}).get("worker", []))
    if workers < 2:
        return None
    return int(config["task"]["index"]), workers


def join_launched_workers() -> Any:
    """Create the process's MultiWorkerMirroredStrategy once, when ``TF_CONFIG`` asks."""
    global _strategy
    if _strategy is None and _cluster() is not None:
        import tensorflow as tf

        _strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return _strategy


class TensorFlowDistributed(SummingWorkers):
    """One worker of a MultiWorkerMirroredStrategy job; see the module doc."""

    def __init__(self, strategy: Any, world_size: int, rank: int) -> None:
        super().__init__(world_size, rank)
        self._strategy = strategy
        self._compiled: dict[tuple[Any, ...], Any] = {}  # sum_gradients, by gradient specs

    @classmethod
    def from_environment(cls) -> TensorFlowDistributed | None:
        """The launched worker this process is, or None."""
        place = _cluster()
        strategy = join_launched_workers()
        return None if place is None else cls(strategy, place[1], place[0])

    def _sum(self, vector: Any) -> Any:
        import tensorflow as tf

        values = self._strategy.experimental_distribute_values_from_function(lambda _: vector)
        return self._strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)

    def sum_gradients(self, grads: list[Any]) -> list[Any]:
        """Every worker's gradients summed (bfloat16/float16 in float32, rounded back).

        One compiled call, traced once per gradient shapes: run eagerly, the flattening,
        the collective and the split took about twice as long (W1 on two CPU workers).
        """
        import tensorflow as tf

        key = tuple((tuple(g.shape), g.dtype) for g in grads)
        function = self._compiled.get(key)
        if function is None:
            traced = tf.function(self._sum_gradients, autograph=False)
            function = traced.get_concrete_function(
                [tf.TensorSpec(g.shape, g.dtype) for g in grads]
            )
            self._compiled[key] = function
        return list(function(grads))

    def _sum_gradients(self, grads: list[Any]) -> list[Any]:
        import tensorflow as tf

        dtype = grads[0].dtype
        wide = tf.float32 if dtype in (tf.bfloat16, tf.float16) else dtype
        flat = tf.concat([tf.reshape(tf.cast(g, wide), [-1]) for g in grads], 0)
        parts = tf.split(self._sum(flat), [int(np.prod(g.shape)) for g in grads])
        return [tf.cast(tf.reshape(p, g.shape), dtype) for p, g in zip(parts, grads)]

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Sum host numbers over the workers in float64."""
        import tensorflow as tf

        return [float(v) for v in self._sum(tf.constant(list(values), tf.float64)).numpy()]

    def barrier(self) -> None:
        """Wait for every worker (an all-reduce every worker must join)."""
        self.all_sum([0.0])


def local_devices_environment(devices: int) -> dict[str, str]:
    """Nothing: :class:`LocalDevices` splits the CPU itself, when made before TensorFlow starts."""
    return {}


class LocalDevices(SingleProcess):
    """One process training on several local devices through ``tf.distribute.MirroredStrategy``.

    The TensorFlow mirror of ``unitrain.backends.jax.LocalDevices``: to the Trainer it is one
    worker; every batch is split over the devices and their gradients summed (see the module
    doc), so the update is the global batch's. On the CPU the devices are logical CPUs, which
    TensorFlow can only make before its runtime starts: create this before anything in the
    process makes a TensorFlow tensor (before the Trainer). On a GPU backend, the first N GPUs.
    A model with non-trainable variables (BatchNorm statistics, a Keras seed generator) is
    refused: every replica would assign them at once.

    Args:
        devices: how many local devices to use (>= 1).

    Raises:
        ConfigError: TensorFlow started before the CPU could be split and has fewer logical
            CPUs (and GPUs) than ``devices``.
    """

    def __init__(self, devices: int) -> None:
        import tensorflow as tf

        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ConfigError(f"LocalDevices: devices must be an int >= 1, got {devices=}")
        self.devices = devices
        if _split_cpu(devices):
            return
        if max(_count("CPU"), len(tf.config.list_physical_devices("GPU"))) < devices:
            raise ConfigError(_too_late(devices))

    def setup(self, backend: Any) -> None:
        """Have the backend compute its gradients under a MirroredStrategy of N devices."""
        import tensorflow as tf

        kind = backend.device.upper()
        found = tf.config.list_logical_devices(kind)
        if len(found) < self.devices:
            raise ConfigError(
                _too_late(self.devices)
                if kind == "CPU"
                else f"LocalDevices({self.devices}): TensorFlow sees {len(found)} GPU(s); "
                f"use LocalDevices({len(found)}) or device='cpu' (logical CPUs)"
            )
        stateful = sorted(set(backend.variables) - set(backend.params))
        if stateful:
            raise ConfigError(
                f"LocalDevices on TensorFlow needs a model whose variables are all trainable; "
                f"{stateful[:3]} would be assigned by every replica at once. Train it on "
                "workers (--workers N) or on one device"
            )
        names = [device.name for device in found[: self.devices]]
        backend.spread_over(tf.distribute.MirroredStrategy(names))


def _split_cpu(devices: int) -> bool:
    """Split the CPU into ``devices`` logical devices; False once TensorFlow has started."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or ()) >= devices:
        return True
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
        )
    except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
        return False
    return True


def _count(kind: str) -> int:
    import tensorflow as tf

    return len(tf.config.list_logical_devices(kind))


def _too_late(devices: int) -> str:
    return (
        f"LocalDevices({devices}): TensorFlow has {_count('CPU')} logical CPU(s) and its "
        "runtime started before the CPU could be split; create LocalDevices before anything "
        "in this process makes a TensorFlow tensor (before the Trainer and any backend), or "
        "run in a fresh process"
    )


def mirrored_loss_and_grads(
    strategy: Any, loss_and_grads: Any, x: Any, y: Any, micro_batch: Any
) -> tuple[Any, list[Any]]:
    """The global batch's loss and gradients, computed by ``strategy``'s replicas (in a graph).

    Replica ``r`` takes rows ``shard_bounds(n, N, r)`` of the batch and calls
    ``loss_and_grads(x_r, y_r, micro_batch * N + r, n)``, whose loss is
    ``compute_average_loss(per_example, n)``; the replicas' losses and gradients are summed.
    The micro-batch index (which keys dropout) is distinct per replica, so no two replicas
    draw the same masks, as N simulated workers' slices do not.
    """
    import tensorflow as tf

    def replica(x: Any, y: Any, micro_batch: Any) -> Any:
        context = tf.distribute.get_replica_context()
        replicas, rank = context.num_replicas_in_sync, context.replica_id_in_sync_group
        size = tf.shape(x)[0]
        start, stop = _bounds(size, replicas, rank)
        own = micro_batch * replicas + tf.cast(rank, micro_batch.dtype)
        return loss_and_grads(x[start:stop], y[start:stop], own, size)

    loss, grads = strategy.run(replica, args=(x, y, micro_batch))
    total = tf.distribute.ReduceOp.SUM
    return strategy.reduce(total, loss, None), [strategy.reduce(total, g, None) for g in grads]


def _bounds(size: Any, replicas: int, rank: Any) -> tuple[Any, Any]:
    """:func:`unitrain.backends.strategy.shard_bounds` in graph ops: replica ``rank``'s rows."""
    import tensorflow as tf

    rank = tf.cast(rank, size.dtype)
    base, extra = size // replicas, size % replicas
    start = rank * base + tf.minimum(rank, extra)
    return start, start + base + tf.cast(rank < extra, size.dtype)
