"""Per-worker memory of sharded training against data-parallel (docs/scaling-out.md).

Two updates of an 83.5M-parameter Transformer language model (vocabulary 8192, width 768, 10
causal blocks of 12 heads, sequences of 32) with Adam in float32 on torch, then one JSON line
per worker: the bytes this worker holds of the parameters, the gradients and the optimizer
state after the first update (a sharded tensor's local shard), their sum, the peak of that
sum during the second update (``peak_state_mib``), and the process's peak resident memory.

The peak is sampled where it can be highest: for a sharded worker, as each FSDP unit's
parameters are gathered and freed in the forward and the backward, and as its gradients are
reduce-scattered (before, when the unit's full gradients are alive: FSDP2's
``FSDPParamGroup`` hooks, wrapped here); for every worker, after the backward and after the
update. A sample adds the bytes of every distinct storage of the parameters (their shards,
and a unit's gathered parameters while they exist), the gradients (shards and a unit's full
gradients) and Adam's moments.

    python benchmarks/sharded_memory.py                                   # one worker
    UNITRAIN_SHARD=1 python -m torch.distributed.run --standalone \\
        --nproc_per_node=4 benchmarks/sharded_memory.py                   # 4 sharded workers
    UNITRAIN_SHARD=0 python -m torch.distributed.run --standalone \\
        --nproc_per_node=4 benchmarks/sharded_memory.py                   # 4 DDP workers

With ``SAVE_TO=DIR`` sharded workers then write a checkpoint of the state to ``DIR`` each
writing its own rows, and report the host memory the save copied the state into
(``save_copies_mib``: numpy allocations traced by ``tracemalloc``), the bytes of this
worker's files and the seconds; and, for comparison, the host memory a gathered state dict
takes on every worker (``gather_copies_mib``: what a save through one process needs).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import optim
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.strategy import strategy_for
from unitrain.backends.torch import TorchBackend
from unitrain.models import (
    Embedding,
    LayerNorm,
    Linear,
    PositionalEmbedding,
    Sequential,
    TransformerBlock,
)

VOCAB, DIM, LAYERS, HEADS, LENGTH, BATCH = 8192, 768, 10, 12, 32, 4


def local_bytes(tensor: Any) -> int:
    """The bytes this worker holds of ``tensor`` (its shard, for a sharded one)."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def main() -> None:
    """Build, shard or replicate (as the launcher asked), update once, and report."""
    blocks = tuple(TransformerBlock(DIM, HEADS, causal=True) for _ in range(LAYERS))
    head = (LayerNorm(DIM), Linear(DIM, VOCAB))
    model = Sequential((Embedding(VOCAB, DIM), PositionalEmbedding(LENGTH, DIM), *blocks, *head))
    backend = TorchBackend(model, BackendOptions(optimizer=optim.Adam()))
    strategy = strategy_for(backend, None)  # torchrun's workers; sharded with UNITRAIN_SHARD=1
    generator = np.random.default_rng(0)
    batch = tuple(generator.integers(0, VOCAB, (BATCH, LENGTH)) for _ in range(2))
    for shard, weight in strategy.shards(batch):
        backend.forward(shard)
        backend.backward(weight)
    params = sum(local_bytes(p) for p in backend.params.values())
    grads = sum(local_bytes(p.grad) for p in backend.params.values() if p.grad is not None)
    backend.step(1e-3)
    slots = sum(local_bytes(t) for t in backend.optimizer.slots().values() if t is not None)
    peak = StatePeak(backend)
    with peak.sampling():
        for shard, weight in strategy.shards(batch):
            backend.forward(shard)
            backend.backward(weight)
        peak.sample()
        backend.step(1e-3)
        peak.sample()
    mib = 2**20
    report = {
        "strategy": type(strategy).__name__,
        "world_size": strategy.world_size,
        "rank": strategy.rank,
        "parameters": sum(p.numel() for p in backend.params.values()),
        "param_mib": params / mib,
        "grad_mib": grads / mib,
        "optimizer_mib": slots / mib,
        "state_mib": (params + grads + slots) / mib,
        "peak_state_mib": peak.bytes / mib,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if os.environ.get("SAVE_TO") and hasattr(strategy, "exchange"):
        report.update(save_costs(backend, strategy, Path(os.environ["SAVE_TO"])))
    print(json.dumps(report), flush=True)


class StatePeak:
    """The largest sum of parameter, gradient and optimizer-state bytes seen at a sample."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.bytes = backend, 0
        from torch.distributed.fsdp import FSDPModule

        groups = [
            module._get_fsdp_state()._fsdp_param_group
            for module in backend.module.modules()
            if isinstance(module, FSDPModule)
        ]
        self.groups = [group for group in groups if group is not None]  # None: no parameters

    def sample(self) -> None:
        """Add up the distinct storages alive now; keep the largest sum."""
        tensors = [*self.backend.params.values(), *self.backend.optimizer.slots().values()]
        tensors += [p.grad for p in self.backend.params.values()]
        for group in self.groups:
            for record in group.fsdp_params:
                tensors += [record.sharded_param, record.sharded_param.grad]
                tensors.append(getattr(record, "unsharded_accumulated_grad", None))
                gathered = getattr(record, "_unsharded_param", None)
                if gathered is not None:
                    tensors += [gathered, gathered.grad]
        storages: dict[int, int] = {}
        for tensor in tensors:
            if tensor is None:
                continue
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            storage = local.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        self.bytes = max(self.bytes, sum(storages.values()))

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """Sample inside FSDP2's unit hooks while the block runs (no-op unsharded)."""
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        def after(method: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                result = method(*args, **kwargs)
                self.sample()
                return result

            return wrapped

        def before(method: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                self.sample()
                return method(*args, **kwargs)

            return wrapped

        saved = {name: getattr(FSDPParamGroup, name) for name in _HOOKS}
        for name, wrap in _HOOKS.items():
            setattr(FSDPParamGroup, name, (after if wrap == "after" else before)(saved[name]))
        try:
            yield
        finally:
            for name, method in saved.items():
                setattr(FSDPParamGroup, name, method)


#: FSDP2's unit hooks, and whether a sample is taken after (gathered) or before (not freed).
_HOOKS = {
    "pre_forward": "after",
    "post_forward": "before",
    "pre_backward": "after",
    "post_backward": "before",
}


def save_costs(backend: Any, strategy: Any, folder: Path) -> dict[str, float]:
    """A sharded save's host copies, bytes and time against a gathered state dict's copies."""
    from unitrain.backends.state import split_state
    from unitrain.checkpoint._write_shards import save_sharded_checkpoint

    mib, target = 2**20, folder / "sharded"
    tracemalloc.start()
    started = time.perf_counter()
    model, optimizer = split_state(backend.local_state_dict())
    save_sharded_checkpoint(
        target, workers=strategy, model=model, optimizer=optimizer, trainer={"epoch": 0, "step": 1}
    )
    seconds = time.perf_counter() - started
    _, save_peak = tracemalloc.get_traced_memory()
    del model, optimizer
    tracemalloc.stop()
    strategy.barrier()
    mine = [f for f in target.iterdir() if f"-{strategy.rank:05d}-of-" in f.name]
    tracemalloc.start()
    gathered = backend.state_dict()  # every worker takes part in the gathers
    _, gather_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del gathered
    return {
        "save_copies_mib": save_peak / mib,
        "save_written_mib": sum(f.stat().st_size for f in mine) / mib,
        "save_seconds": seconds,
        "gather_copies_mib": gather_peak / mib,
    }


if __name__ == "__main__":
    main()
