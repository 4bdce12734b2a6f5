"""How the Trainer runs on one worker or many: the data-parallel seam.

In the spirit of Lightning Fabric's strategies, the Trainer hands a small :class:`Strategy`
the few things that change when training is spread over workers, and nothing else:

- which part of each global batch this worker computes (:meth:`Strategy.shards`), and the
  weight of its loss, chosen so that after the engine reduces gradients (DDP averages, a
  sum-reducing engine sums) the update equals one worker's update on the whole global batch;
- adding up host numbers over workers (:meth:`Strategy.all_sum`: running loss, validation
  metrics), so every worker takes the same early-stopping and checkpoint decisions;
- who writes (:attr:`Strategy.is_main`: checkpoints, logs and the run lock are rank 0's) and
  waiting for it (:meth:`Strategy.barrier`).

Every worker iterates the same global batches, whose order is a function of ``(seed, epoch)``
alone, and takes its contiguous slice: the data order never depends on the worker count, so a
checkpoint written by N workers resumes on M. Slices differ by at most one example; each is
weighted by its size, so N workers x b equal one worker x N*b up to the order of float sums
(about 1 ulp per update in float32, below 1e-15 in float64).

:class:`SingleProcess` is the default and changes nothing. :class:`SimulatedWorkers` runs N
workers' slices one after another in one process and adds their gradients: the oracle the
conformance kit compares real engines with. Framework strategies (torch DDP, ...) live with
their backends and are returned by a backend's ``launched_strategy()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from unitrain._errors import ConfigError, DataError
from unitrain.backends.sharded import Sharded, shard_requested, sharded_strategy_for
from unitrain.structure import batch_weight, is_plain_pair, num_examples, slice_rows

__all__ = [
    "DataParallel",
    "LocalDeviceParallel",
    "Sharded",
    "SimulatedWorkers",
    "SingleProcess",
    "Strategy",
    "check_splittable",
    "dropout_index",
    "evaluate_over_workers",
    "loss_count",
    "reduce_sums",
    "shard_bounds",
    "strategy_for",
    "training_shards",
    "worker_shard",
]

#: ``(inputs, targets)`` or ``(inputs, targets, sample_weight)`` (see :mod:`unitrain.data`).
Batch = tuple[Any, ...]


@runtime_checkable
class Strategy(Protocol):
    """What the Trainer asks of the way it is spread over workers."""

    #: Number of workers taking part in every update.
    world_size: int
    #: This process's worker number; 0 writes checkpoints, logs and the lock.
    rank: int

    @property
    def is_main(self) -> bool:
        """Whether this process writes files (rank 0)."""
        ...

    def setup(self, backend: Any) -> None:
        """Connect the backend to the engine (wrap its model, check it can take part)."""
        ...

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """The slices of a global batch this process computes, each with its loss weight."""
        ...

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Sum host numbers over all workers; every worker gets the same result."""
        ...

    def barrier(self) -> None:
        """Return once every worker has reached this point."""
        ...


@runtime_checkable
class DataParallel(Protocol):
    """Optional backend method: the strategy of the launcher this process was started by."""

    def launched_strategy(self) -> Strategy:
        """A framework strategy when a launcher started this process, else SingleProcess."""
        ...


@runtime_checkable
class LocalDeviceParallel(Protocol):
    """Optional static backend methods: one process training on several local devices.

    The strategy is one worker to the Trainer and splits each batch over the devices itself
    (``unitrain.backends.jax.LocalDevices``, ``unitrain.backends.tensorflow.LocalDevices``).
    Devices often have to exist before the framework starts, so the conformance kit starts a
    fresh process with :meth:`local_devices_environment` and creates the strategy first thing.
    """

    def local_devices_environment(self, devices: int) -> dict[str, str]:
        """Environment variables a fresh process needs to see ``devices`` CPU devices."""
        ...

    def local_devices_strategy(self, devices: int) -> Strategy:
        """The strategy over the first ``devices`` local devices; made before anything else."""
        ...


def shard_bounds(size: int, world_size: int, rank: int) -> tuple[int, int]:
    """The ``[start, stop)`` rows of a batch of ``size`` that worker ``rank`` computes.

    Contiguous slices whose lengths differ by at most one, the longer ones first.

    Examples:
        >>> [shard_bounds(7, 3, r) for r in range(3)]
        [(0, 3), (3, 5), (5, 7)]
    """
    base, extra = divmod(size, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``[start, stop)`` of every part of a batch (numpy arrays or framework tensors),
    every leaf of a structured one alike."""
    if is_plain_pair(batch):
        return batch[0][start:stop], batch[1][start:stop]  # the plain path: two slices
    return tuple(slice_rows(part, start, stop) for part in batch)


def _share(batch: Batch, start: int, stop: int) -> float:
    """The part of the batch's loss rows ``[start, stop)`` carry: their share of the examples,
    or with sample weights their share of the weight (so the weighted means of N slices,
    each weighted so, add up to the weighted mean of the whole batch)."""
    if len(batch) == 3 and batch[2] is not None:
        weights = np.asarray(batch[2], np.float64)
        total = float(weights.sum())
        if total > 0:
            return float(weights[start:stop].sum()) / total
    return (stop - start) / num_examples(batch)


def worker_shard(
    batch: Batch, world_size: int, rank: int, scale: float = 1.0
) -> list[tuple[Batch, float]]:
    """Worker ``rank``'s slice of a global batch, its loss weighted by its share of the batch
    times ``scale`` (an engine that averages gradients over workers, such as DDP, passes the
    worker count); empty when the batch leaves this worker no example.

    Examples:
        >>> [weight for _, weight in worker_shard(([1, 2, 3, 4], [0, 0, 1, 1]), 2, 1)]
        [0.5]
    """
    size = num_examples(batch)
    start, stop = shard_bounds(size, world_size, rank)
    if stop == start:
        return []
    if len(batch) == 2:
        return [(slice_batch(batch, start, stop), (stop - start) * scale / size)]
    return [(slice_batch(batch, start, stop), _share(batch, start, stop) * scale)]


def dropout_index(micro_batch: int, world_size: int, rank: int) -> int:
    """The micro-batch number that keys the dropout masks of worker ``rank``'s
    ``micro_batch``-th forward in an update (backends key masks by ``(seed, step, number)``).

    :class:`SimulatedWorkers` computes an update's slices batch by batch, workers in rank
    order, so the backend's ``k``-th forward is worker ``k % N``'s slice of batch ``k // N``.
    Real workers number their forwards the same way, so they draw exactly the oracle's masks
    and no two workers draw the same one (each counting from 0 would repeat worker 0's).

    Examples:
        >>> [dropout_index(k, 2, rank) for k in range(2) for rank in range(2)]
        [0, 1, 2, 3]
    """
    return micro_batch * world_size + rank


class SingleProcess:
    """One worker: the whole batch with weight 1, nothing to reduce. The default."""

    world_size = 1
    rank = 0
    is_main = True

    def setup(self, backend: Any) -> None:
        """Nothing to connect."""

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """The whole batch, weight 1."""
        return [(batch, 1.0)]

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """The values themselves."""
        return [float(v) for v in values]

    def barrier(self) -> None:
        """Nothing to wait for."""


class SimulatedWorkers:
    """N workers in one process: every slice computed here, gradients added, as an oracle.

    Each slice's loss is weighted by ``len(slice) / len(batch)``, so the gradients the
    backend adds up are the global batch's mean gradient, summed in N parts the way N real
    workers' all-reduce sums them. It needs nothing from a backend but ``backward(scale)``.

    Args:
        workers: how many workers to simulate (>= 1).

    Examples:
        >>> batch = (list(range(5)), list(range(5)))
        >>> [(x, weight) for (x, _), weight in SimulatedWorkers(2).shards(batch)]
        [([0, 1, 2], 0.6), ([3, 4], 0.4)]
    """

    rank = 0
    is_main = True

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"SimulatedWorkers: workers must be an int >= 1, got {workers=}")
        self.world_size = workers

    def setup(self, backend: Any) -> None:
        """Nothing to connect: the backend's gradient buffers do the adding."""

    def shards(self, batch: Batch) -> list[tuple[Batch, float]]:
        """Every worker's slice, weighted by its share of the batch (empty slices dropped)."""
        return [
            shard
            for rank in range(self.world_size)
            for shard in worker_shard(batch, self.world_size, rank)
        ]

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """The values themselves: this process already computed every worker's share."""
        return [float(v) for v in values]

    def barrier(self) -> None:
        """Nothing to wait for."""


def strategy_for(backend: Any, strategy: Strategy | Sharded | int | None) -> Strategy:
    """The strategy a Trainer uses: the one given, N simulated workers, or the launcher's.

    Args:
        backend: the Trainer's backend.
        strategy: a :class:`Strategy`; an int N for :class:`SimulatedWorkers` (N workers'
            arithmetic in this process); a :class:`~unitrain.backends.sharded.Sharded`
            request for the backend's sharded engine; or None: the strategy of the launcher
            that started this process (``torchrun``, ...) when the backend offers one (its
            sharded one when the launcher set ``UNITRAIN_SHARD=1``), else one process.
    """
    if strategy is None and shard_requested():  # unitrain train --workers N --shard
        strategy = Sharded()
    if isinstance(strategy, Sharded):
        strategy = sharded_strategy_for(backend, strategy)
    elif strategy is None:
        found = backend.launched_strategy() if isinstance(backend, DataParallel) else None
        strategy = found or SingleProcess()
    elif isinstance(strategy, int) and not isinstance(strategy, bool):
        strategy = SingleProcess() if strategy == 1 else SimulatedWorkers(strategy)
    if not isinstance(strategy, Strategy):
        raise ConfigError(
            "strategy must be a unitrain.backends.strategy.Strategy, an int, Sharded or None, "
            f"got {type(strategy).__name__}"
        )
    strategy.setup(backend)
    return strategy


def check_splittable(source: Any, world_size: int) -> None:
    """Raise :class:`DataError` before training if a batch of ``source`` is smaller than
    ``world_size``: some worker would have no example to compute a gradient from.

    Only an :class:`~unitrain.data.ArrayLoader` is checked here (its last batch is the
    smallest); a native loader's short batch is found when it comes.
    """
    from unitrain.data import ArrayLoader

    if world_size == 1 or not isinstance(source, ArrayLoader):
        return
    smallest = min(source.num_examples, source.batch_size)
    if not source.drop_last and source.num_examples % source.batch_size:
        smallest = source.num_examples % source.batch_size
    if smallest < world_size:
        raise DataError(
            f"the smallest batch has {smallest} examples, fewer than the {world_size} workers "
            "that share it; use drop_last=True or a batch size that leaves a last batch of at "
            "least that many examples"
        )


def training_shards(strategy: Strategy, batch: Batch) -> list[tuple[Batch, float]]:
    """``strategy.shards(batch)``, refusing a batch that leaves this worker no example: the
    worker could not join the gradient reduction the others wait in."""
    shards = strategy.shards(batch)
    if not shards:
        raise DataError(
            f"a batch of {num_examples(batch)} examples leaves this worker nothing to compute on "
            f"{strategy.world_size} workers; make every batch at least that big"
        )
    return shards


def loss_count(batch: Batch, shard: Batch, total: float | None = None) -> float:
    """What ``shard``'s loss counts for: ``batch``'s examples times the shard's share of the
    sample weights, or without weights the shard's examples (exactly, with no rounding).
    ``total``: ``batch_weight(batch)`` where the caller has it already."""
    if len(batch) == 3 and batch[2] is not None:
        total = batch_weight(batch) if total is None else total
        if total > 0:
            return num_examples(batch) * batch_weight(shard) / total
    return num_examples(shard)


def evaluate_over_workers(
    backend: Any, strategy: Strategy, batches: Iterable[Batch], label: str
) -> dict[str, float]:
    """Example-weighted mean metrics of ``batches``, each worker evaluating its slices.

    One process counts each batch's loss (a weighted mean under sample weights) by the
    batch's examples; a slice's loss is counted by the batch's examples times the slice's
    share of the weights, so the slices' sum is that batch's term on any number of workers.
    The other metrics are means over examples, counted by the slice's examples.

    Raises:
        DataError: no worker saw an example.
    """
    sums: dict[str, Any] = {}
    count = 0
    for batch in batches:
        for shard, _ in strategy.shards(batch):
            n = num_examples(shard)
            counts = {"loss": loss_count(batch, shard)}
            for key, value in backend.evaluate(shard).items():
                sums[key] = sums.get(key, 0.0) + value * counts.get(key, n)
            count += n
    if strategy.world_size > 1:
        sums, count = reduce_sums(strategy, sums, count)
    if count == 0:
        raise DataError(f"{label} yielded no batches; pass at least one example")
    return {key: float(value) / count for key, value in sums.items()}


def reduce_sums(strategy: Strategy, sums: dict[str, Any], count: int) -> tuple[dict, int]:
    """Example-weighted metric sums and their count, added up over workers (one collective)."""
    keys = sorted(sums)
    totals = strategy.all_sum([float(sums[k]) for k in keys] + [count])
    return dict(zip(keys, totals)), round(totals[-1])
