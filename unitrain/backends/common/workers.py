"""The strategy of one launched worker on an engine that sums gradients over workers.

``jax.distributed`` and TensorFlow's MultiWorkerMirroredStrategy leave the reduction to the
backend: before each update it sums every worker's gradients (one collective), and each
worker's loss is weighted by its share of the global batch
(:func:`unitrain.backends.strategy.worker_shard`), so the sum is the global batch's mean.
Torch DDP averages instead and wraps the model, so its strategy is its own.
"""

from __future__ import annotations

from typing import Any

from unitrain._errors import ConfigError
from unitrain.backends.strategy import Batch, worker_shard

__all__ = ["SummingWorkers"]


class SummingWorkers:
    """Worker ``rank`` of ``world_size`` launched processes whose gradients are summed.

    A subclass gives :meth:`sum_gradients` (and the :class:`~unitrain.backends.strategy.
    Strategy` protocol's ``all_sum`` and ``barrier``) on its engine.
    """

    def __init__(self, world_size: int, rank: int) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(
                f"{type(self).__name__}: rank must be in [0, {world_size}), got {rank=}"
            )
        self.world_size, self.rank = world_size, rank

    @property
    def is_main(self) -> bool:
        """Rank 0 writes."""
        return self.rank == 0

    def setup(self, backend: Any) -> None:
        """Have the backend sum its gradients over the workers before every update, and key
        dropout as this worker (``strategy.dropout_index``)."""
        backend.distribute(self.sum_gradients, self.world_size, self.rank)

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """This worker's slice; its loss weighted by its share of the global batch, so the
        summed gradients are the global batch's."""
        return worker_shard(batch, self.world_size, self.rank)

    def sum_gradients(self, grads: Any) -> Any:
        """Every worker's gradients summed, on this worker's device."""
        raise NotImplementedError
