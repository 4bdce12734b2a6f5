"""Data-parallel TensorFlow: ``MultiWorkerMirroredStrategy`` across processes.

Every worker reads its place from ``TF_CONFIG`` (``unitrain._launch`` writes one per worker
with local ports; across machines the user sets it, see the README) and creates the strategy
in :func:`join_launched_workers` before TensorFlow makes any tensor, as the strategy requires;
the TensorFlow backend calls it first thing. One replica per worker.

TensorFlow *sums* gradients over replicas, so a loss must be scaled by the global batch
(``tf.nn.compute_average_loss(per_example, global_batch_size)``); a per-replica mean loss
doubles the gradients on two workers (issue 13). Here each worker weights its slice's mean
loss by ``n_r / n``, which is that scaling, and before each update the worker's gradients
are flattened into one vector and summed over the workers by the strategy (one collective
per update). Host numbers are summed the same way in float64.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain.strategy import worker_shard

__all__ = [
    "TensorFlowDistributed",
    "join_launched_workers",
    "launch_command",
    "worker_environment",
]

Batch = tuple[Any, Any]
_strategy: Any = None


def worker_environment(rank: int, workers: int, ports: list[int]) -> dict[str, str]:
    """``TF_CONFIG`` of worker ``rank`` in a cluster of ``workers`` on local ports."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
    }


def launch_command(workers: int) -> list[str]:
    """The command that starts ``workers`` local workers of the Python program that follows."""
    launcher = [sys.executable, "-m", "unitrain._launch", f"--workers={workers}"]
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


class TensorFlowDistributed:
    """One worker of a MultiWorkerMirroredStrategy job; see the module doc."""

    def __init__(self, strategy: Any, world_size: int, rank: int) -> None:
        self._strategy, self.world_size, self.rank = strategy, world_size, rank

    @classmethod
    def from_environment(cls) -> TensorFlowDistributed | None:
        """The launched worker this process is, or None."""
        place = _cluster()
        strategy = join_launched_workers()
        return None if place is None else cls(strategy, place[1], place[0])

    @property
    def is_main(self) -> bool:
        """Rank 0 (``TF_CONFIG`` task index 0) writes."""
        return self.rank == 0

    def setup(self, backend: Any) -> None:
        """Have the backend sum its gradients over the workers before every update."""
        backend.distribute(self.sum_gradients)

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """This worker's slice; its loss scaled by its share of the global batch."""
        return worker_shard(batch, self.world_size, self.rank)

    def _sum(self, vector: Any) -> Any:
        import tensorflow as tf

        values = self._strategy.experimental_distribute_values_from_function(lambda _: vector)
        return self._strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)

    def sum_gradients(self, grads: list[Any]) -> list[Any]:
        """Every worker's gradients summed (bfloat16/float16 in float32, rounded back)."""
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
