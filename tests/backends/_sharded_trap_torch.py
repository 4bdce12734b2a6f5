"""torch's sharded trap, as real engine code the kit's workers launch: pytorch#162338.

There, gloo's ``ReduceOp.AVG`` inside a ``fully_shard`` run summed the workers' gradients
instead of averaging them, silently: every gradient came out N times the global batch's mean.
FSDP2's own knob for a plain sum (a gradient divide factor of 1) needs ``PREMUL_SUM``, which
gloo lacks, so :class:`TorchShardedSummed` reproduces the outcome on the real engine by what
reaches its average: each worker's loss carries N times its weight, and the reduce-scatter's
average of those is the sum an AVG that sums gives. On two workers every gradient is doubled;
the kit's ``sharded`` family must fail it (test_sharded launches it with this folder on
``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

from unitrain.backends.strategy import worker_shard
from unitrain.backends.torch import TorchBackend
from unitrain.backends.torch.sharding import TorchSharded


class _SummingShards(TorchSharded):
    def shards(self, batch: Any) -> list[tuple[Any, float]]:
        return worker_shard(batch, self.world_size, self.rank, scale=self.world_size**2)


class TorchShardedSummed(TorchBackend):
    """FSDP2 whose gradient reduction sums over the workers where it should average."""

    @staticmethod
    def sharded_strategy(workers: int | None) -> Any:
        return _SummingShards.for_request(workers)


class TorchShardedReversedRows(TorchBackend):
    """FSDP2 whose checkpoint holds each worker's rows in reverse order, at the right place:
    as an engine that keeps its local shard in another order would. The layout is whole and
    the checkpoint loads; its tensors are wrong, and the kit's resume from it must fail."""

    def local_state_dict(self) -> dict[str, Any]:
        from unitrain.checkpoint import RowShard

        state = super().local_state_dict()
        return {
            name: v._replace(value=v.value[::-1].copy()) if isinstance(v, RowShard) else v
            for name, v in state.items()
        }
