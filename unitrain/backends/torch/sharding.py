"""Sharded PyTorch: FSDP2 (``fully_shard``) over the workers torchrun started.

:class:`TorchSharded` joins the process group as :class:`.distributed.TorchDDP` does and
hands the backend ``fully_shard``: each parameter becomes a ``DTensor`` sharded on its first
dimension over the workers (``Shard(0)``), its gradient is reduce-scattered (averaged over
the workers, as DDP averages, so the loss weights are DDP's), and the optimizer, rebuilt over
the sharded parameters, keeps its state beside each worker's shard only.

What decides an update is global: the clip norm of the ``DTensor`` gradients is reduced over
the workers by torch (a replicated result), and :func:`global_finite_check` turns the
backend's finite check on the local shards into one all-reduced flag, so every worker clips
by the same factor and skips the same updates.

A checkpoint is written without gathering: :func:`local_rows` reads each worker's own rows
(the backend's ``local_state_dict``) and every worker writes them to a file of its own
(:mod:`unitrain.checkpoint._shards`); :meth:`TorchSharded.exchange` passes the few small
values the workers must agree on (where to write, what each wrote). ``state_dict`` still
gives full tensors (``core.to_numpy`` gathers a sharded one, every worker taking part), and
:func:`placed_like` cuts a full array into this worker's shard with no communication, as
every worker reads the same checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from unitrain import ConfigError
from unitrain.backends.torch.core import to_numpy
from unitrain.backends.torch.distributed import TorchDDP
from unitrain.backends.torch.layers import PortableModule
from unitrain.checkpoint import RowShard
from unitrain.structure import map_leaves

__all__ = ["TorchSharded", "global_finite_check", "local_rows", "placed_like"]


class TorchSharded(TorchDDP):
    """One worker of a torch FSDP2 job; see the module doc.

    Args:
        world_size: number of workers.
        rank: this worker's number.
    """

    #: Reading the backend's state gathers the shards, a collective every worker joins (so
    #: every worker reads it when rank 0 writes a checkpoint: see ``join_snapshot``).
    collective_state = True

    @classmethod
    def for_request(cls, workers: int | None) -> TorchSharded:
        """The worker torchrun described in the environment, sharding over ``workers``.

        Raises:
            ConfigError: this process was not started by torchrun, or by a different number
                of workers than ``workers``.
        """
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            raise ConfigError(
                "Sharded() on torch shards over the workers torchrun starts, but this process "
                "was not started by it; run `unitrain train --workers N --shard ...` or "
                "`torchrun --nproc_per_node=N script.py`"
            )
        world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if workers is not None and workers != world_size:
            raise ConfigError(
                f"Sharded({workers}) asks for {workers} workers, but torchrun started "
                f"{world_size}; pass Sharded() or launch {workers} workers"
            )
        return cls(world_size, rank)

    def setup(self, backend: Any) -> None:
        """Join the process group and have the backend shard its module with FSDP2."""
        self.join(backend)
        backend.shard(self.shard_module, self.world_size, self.rank)

    def shard_module(self, module: torch.nn.Module) -> None:
        """``fully_shard`` in place, one unit at a time: the parameters become sharded
        ``DTensor``\\ s, and a unit's are gathered in full only while it runs.

        A portable model's units are its blocks (``PortableModule.sharding_units``: each
        TransformerBlock, each layer of a Sequential): each becomes an FSDP module of its
        own, then the model (which keeps the rest, gathered for the whole pass), so a
        worker's peak holds one unit's full parameters and gradients, not the model's. A
        native module is one unit.

        FSDP2 hooks its backward (which gathers the parameters again) on a unit's output,
        and warns when that is a view, as an in-place op on a view would drop the hook. A
        portable model's output often is one (logits out of a reshape), so a hook
        registered first hands FSDP a copy: one copy of each unit's output per pass, and no
        op of the caller's can lose the gather.
        """
        units = module.sharding_units() if isinstance(module, PortableModule) else []
        for unit in [*units, module]:
            unit.register_forward_hook(_not_a_view)
            fully_shard(unit)

    def exchange(self, value: Any) -> list[Any]:
        """Every worker's ``value`` (small, picklable), in rank order, on every worker."""
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


def _not_a_view(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
    return map_leaves(lambda t: t.clone() if t._is_view() else t, output)


def local_rows(tensor: torch.Tensor) -> np.ndarray | RowShard:
    """A host copy of this worker's rows of ``tensor`` when it is sharded by rows (FSDP2's
    ``Shard(0)``), else of its full value (gathered if it is another ``DTensor``: then every
    worker must read the same tensors in the same order, as ``state_dict`` does)."""
    if not isinstance(tensor, DTensor) or tuple(tensor.placements) != (Shard(0),):
        return to_numpy(tensor)
    rows, workers = tensor.shape[0], tensor.device_mesh.size()
    rank = tensor.device_mesh.get_local_rank()
    chunk = -(-rows // workers)  # torch.chunk's split, which Shard(0) follows
    start, stop = min(rank * chunk, rows), min((rank + 1) * chunk, rows)
    local = to_numpy(tensor.to_local())
    if local.shape[0] != stop - start:
        raise RuntimeError(
            f"worker {rank} holds {local.shape[0]} rows of a {rows}-row tensor where "
            f"torch.chunk's split gives {stop - start}; this torch shards otherwise"
        )
    return RowShard(local, start, rows)


def placed_like(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``array`` (a full value) on ``like``'s device, in its dtype and, for a ``DTensor``,
    sharded as ``like`` is: each worker keeps its own chunk, with no communication."""
    full = torch.from_numpy(np.array(array)).to(like.device, like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


def global_finite_check(local: Callable[[list[torch.Tensor]], bool]) -> Any:
    """``check(grads) -> bool``: whether every worker's shards of ``grads`` are finite.

    Runs ``local`` (the backend's finite check) on this worker's shards and takes the
    logical and over the workers in one all-reduce, so all skip the same updates.
    """

    def check(grads: list[torch.Tensor]) -> bool:
        shards = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        device = shards[0].device if shards else torch.device("cpu")  # NCCL: the GPU's
        bad = torch.tensor([0.0 if local(shards) else 1.0], dtype=torch.float64, device=device)
        dist.all_reduce(bad)
        return bool(bad.item() == 0.0)

    return check
