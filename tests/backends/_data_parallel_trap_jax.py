"""JAX's data-parallel trap of issue 13, as real engine code the kit's workers launch.

:class:`JaxShardMapPmean` is the built-in backend with one mistake: each worker's loss is its
slice's mean, as the body of a ``jax.shard_map`` computes it, and the gradients are formed
inside ``shard_map`` (``check_vma=True``, the default) with respect to parameters replicated
over the mesh, which JAX already sums over the workers; the ``pmean`` added on top averages
equal copies, changes nothing, and the gradients stay doubled. The kit must fail it
(test_data_parallel launches it with this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

from unitrain.backends.jax import JaxBackend
from unitrain.backends.jax.distributed import JaxDistributed


def _own_means(shards: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
    """Every slice's loss at weight 1: the slice's own mean, not its share of the batch's."""
    return [(part, 1.0) for part, _ in shards]


class _ShardMapPmean(JaxDistributed):
    def __init__(self, world_size: int, rank: int) -> None:
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec

        super().__init__(world_size, rank)

        def gradient(local: Any) -> Any:
            # The worker's gradient enters shard_map as the gradient of its loss's
            # linearisation, taken with respect to parameters replicated over the mesh
            # (created inside, so unvarying): the transpose of their implicit broadcast
            # is a psum, so the result is already the sum over the workers.
            local = local[0]
            replicated = jnp.zeros(local.shape, local.dtype)
            summed = jax.grad(lambda params: jnp.vdot(params, local))(replicated)
            return jax.lax.pmean(summed, "workers")  # the average the user adds: a no-op

        per_device = jax.shard_map(
            lambda tree: jax.tree.map(gradient, tree),
            mesh=self._mesh,
            in_specs=PartitionSpec("workers"),
            out_specs=PartitionSpec(),
        )
        self._sum = jax.jit(per_device)

    def shards(self, batch: Any) -> list[tuple[Any, float]]:
        return _own_means(super().shards(batch))


class JaxShardMapPmean(JaxBackend):
    """Gradients of per-device mean losses summed by shard_map, then a pmean on top."""

    def launched_strategy(self) -> Any:
        return _ShardMapPmean.from_environment()
