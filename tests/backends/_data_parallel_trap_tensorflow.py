"""TensorFlow's data-parallel trap of issue 13, as real engine code the kit's workers launch.

:class:`TensorFlowPerReplicaMean` is the built-in backend with one mistake: under
``MultiWorkerMirroredStrategy``, which sums the workers' gradients, each worker's loss is its
own slice's mean instead of ``compute_average_loss(per_example, global_batch_size)``, so the
gradients double on two workers. :class:`TensorFlowMirroredPerReplicaMean` makes the same
mistake under ``MirroredStrategy`` over one process's local devices. The kit must fail both
(test_data_parallel starts them with this folder on ``PYTHONPATH``). A module of its own: a
worker imports TensorFlow only.
"""

from __future__ import annotations

from typing import Any

from unitrain.backends.tensorflow import TensorFlowBackend
from unitrain.backends.tensorflow.compiled import CompiledSteps
from unitrain.backends.tensorflow.distributed import TensorFlowDistributed


def _own_means(shards: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
    """Every slice's loss at weight 1: the slice's own mean, not its share of the batch's."""
    return [(part, 1.0) for part, _ in shards]


class _PerWorkerMean(TensorFlowDistributed):
    def shards(self, batch: Any) -> list[tuple[Any, float]]:
        return _own_means(super().shards(batch))


class TensorFlowPerReplicaMean(TensorFlowBackend):
    """MultiWorkerMirroredStrategy summing per-replica mean losses' gradients."""

    def launched_strategy(self) -> Any:
        return _PerWorkerMean.from_environment()


class _OwnMeanSteps(CompiledSteps):
    def slice_loss_and_grads(
        self, x: Any, y: Any, micro_batch: Any, global_size: Any = None
    ) -> Any:
        return super().slice_loss_and_grads(x, y, micro_batch)  # the slice's own mean


class TensorFlowMirroredPerReplicaMean(TensorFlowBackend):
    """MirroredStrategy over local devices summing the replicas' own mean losses' gradients
    (each replica's loss not scaled to its share of the global batch)."""

    compiled_steps = _OwnMeanSteps
