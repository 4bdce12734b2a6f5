"""One launched worker on an engine that sums gradients over workers: its strategy, and the
part its backend plays in an update.

``jax.distributed`` and TensorFlow's MultiWorkerMirroredStrategy leave the reduction to the
backend: before each update it sums every worker's gradients (one collective), and each
worker's loss is weighted by its share of the global batch
(:func:`unitrain.backends.strategy.worker_shard`), so the sum is the global batch's mean.
Torch DDP averages instead and wraps the model, so its strategy is its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from unitrain._errors import ConfigError
from unitrain.backends.strategy import Batch, dropout_index, worker_shard

__all__ = ["SummingWorkers", "WorkerPart", "keep_worker_part"]


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


@dataclasses.dataclass(frozen=True)
class WorkerPart:
    """What a backend's ``distribute(reduce_gradients, world_size, rank)`` sets: the function
    that sums its gradients over the workers before an update (None: one worker) and which
    worker it is, which numbers its dropout keys (``strategy.dropout_index``).

    Examples:
        >>> alone = WorkerPart()
        >>> alone.summed([1.0]), alone.dropout_index(3)
        ([1.0], 3)
        >>> second = WorkerPart(lambda g: [2 * v for v in g], world_size=2, rank=1)
        >>> second.summed([1.0]), second.dropout_index(3)
        ([2.0], 7)
    """

    reduce_gradients: Callable[[Any], Any] | None = None
    world_size: int = 1
    rank: int = 0

    def summed(self, grads: Any) -> Any:
        """``grads`` summed over the workers (as they are for one worker)."""
        return grads if self.reduce_gradients is None else self.reduce_gradients(grads)

    def dropout_index(self, micro_batch: int) -> int:
        """The dropout key's micro-batch number of this worker's slice."""
        return dropout_index(micro_batch, self.world_size, self.rank)


def keep_worker_part(self: Any, reduce_gradients: Any, world_size: int, rank: int) -> None:
    """The ``distribute`` protocol method, written once, of an adapter that keeps a
    :class:`WorkerPart` in ``_part`` (JAX's, TensorFlow's): sum the gradients over the workers
    before a step, and key dropout as this worker. A method body, not a helper: the adapter's
    class takes it as its method, ``distribute = keep_worker_part``.
    """
    self._part = WorkerPart(reduce_gradients, world_size, rank)
