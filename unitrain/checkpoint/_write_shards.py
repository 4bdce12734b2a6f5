"""Writing a sharded checkpoint: every worker writes its own rows, rank 0 the rest.

The workers of a sharded run each hold only their rows of the large tensors
(:class:`~unitrain.checkpoint.RowShard`); gathering them into one process to write would
need the whole state in one host's memory. Here each worker writes its rows to files of its
own in a staging directory they share, and rank 0 finishes the checkpoint as an unsharded
one is finished (:mod:`unitrain.checkpoint._write`): the tensors that are not sharded,
``trainer.json``, ``shards.json`` and a manifest covering every file, then the one rename
that makes it appear. Until that rename nothing is at the checkpoint's path, so a worker
killed at any point leaves the previous checkpoint the newest valid one.

The workers agree through :class:`Workers`, an ``exchange`` of small values (an
all-gather), twice per save: rank 0 says where to write (or why it cannot), then every worker
says what it wrote (or why it could not), so every worker raises the same error and none
waits for a worker that gave up. The files must land in one directory that every worker
sees: one host, or a shared file system, as torch's distributed checkpoints require too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import FileDigest, to_storable_array
from unitrain.checkpoint._safetensors import encode_tensor_file
from unitrain.checkpoint._shards import KINDS, RowShard, ShardLayout, shard_file
from unitrain.checkpoint._write import (
    CheckpointWriter,
    ShardFiles,
    _interrupts_deferred,
    _pause_for_tests,
    _stage,
    _write_file,
    new_staging,
)

__all__ = ["Workers", "save_sharded_checkpoint"]


class Workers(Protocol):
    """The workers of a sharded save, as this one sees them."""

    rank: int
    world_size: int

    def exchange(self, value: Any) -> list[Any]:
        """Every worker's ``value``, in rank order, on every worker.

        The values are small and JSON-shaped (str, bool, int, lists, dicts with str keys), so
        an engine may send them as JSON text: one that does gives tuples back as lists, and
        the save reads them either way.
        """
        ...


def save_sharded_checkpoint(
    path: str | os.PathLike[str],
    *,
    workers: Workers,
    model: Mapping[str, np.ndarray | RowShard],
    optimizer: Mapping[str, np.ndarray | RowShard],
    trainer: Mapping[str, Any],
    callbacks: Mapping[str, np.ndarray] | None = None,
    writer: CheckpointWriter | None = None,
    before: Callable[[], None] | None = None,
    then: Callable[[], None] | None = None,
    guard: Callable[[], None] | None = None,
) -> Path:
    """Every worker of a sharded run calls this, with its own rows, to write one checkpoint.

    Args:
        path: the checkpoint directory, the same on every worker.
        workers: this worker and the collective the workers agree through.
        model: this worker's model state: its :class:`RowShard` of each sharded tensor, and
            the full value of the others (those are written from rank 0's).
        optimizer: the same for the optimizer state.
        trainer: the trainer state (rank 0's is written).
        callbacks: callbacks' arrays (rank 0's are written).
        writer: on rank 0, finish in the background with this writer (its ``save``); None
            makes the checkpoint durable before this returns.
        before: run on rank 0 before anything is written (a check that may refuse).
        then: run on rank 0 once the checkpoint is in place.
        guard: run on rank 0 just before the rename (see :meth:`CheckpointWriter.save`).

    Returns:
        ``path``; on rank 0 with ``writer``, the checkpoint appears there when it is durable.

    Raises:
        CheckpointError: on every worker when any of them could not write (the first reason
            is named); no checkpoint appears and the previous one is unchanged.
    """
    target = Path(path)
    staging, refusal = None, None
    if workers.rank == 0:
        try:
            if before is not None:
                before()
            staging = new_staging(target)
        except CheckpointError as error:
            refusal = str(error)
    started, where = workers.exchange((staging is not None, refusal or str(staging)))[0]
    if not started:
        raise CheckpointError(where if workers.rank == 0 else f"rank 0 could not save: {where}")
    wrote = _write_rows(Path(where), workers, {"model": model, "optimizer": optimizer})
    reports = workers.exchange(wrote)
    failures = [report for report in reports if isinstance(report, str)]
    if failures:
        if workers.rank == 0:
            shutil.rmtree(where, ignore_errors=True)
        raise CheckpointError(
            f"{target}: could not save the sharded checkpoint: {failures[0]}; a previous "
            f"checkpoint at {target}, if any, is unchanged"
        )
    if workers.rank != 0:
        return target
    try:
        layout = ShardLayout.from_pieces([pieces for _, pieces in reports])
    except CheckpointError:
        shutil.rmtree(where, ignore_errors=True)
        raise
    digests = {name: FileDigest(*d) for report in reports for name, d in report[0].items()}
    shards = ShardFiles(Path(where), digests, layout.encode())
    whole_model, whole_optimizer = _whole(model), _whole(optimizer)
    if writer is not None:
        return writer.save(
            target,
            model=whole_model,
            optimizer=whole_optimizer,
            trainer=trainer,
            callbacks=callbacks,
            then=then,
            guard=guard,
            shards=shards,
        )
    with _interrupts_deferred():
        _stage(target, whole_model, whole_optimizer, trainer, callbacks, shards=shards).commit(
            guard
        )
    if then is not None:
        then()
    return target


def _write_rows(
    staging: Path, workers: Workers, state: dict[str, Mapping[str, Any]]
) -> tuple[dict[str, FileDigest], dict[str, dict[str, list[Any]]]] | str:
    """Writes this worker's rows of each kind to its own file, durably.

    Returns:
        The files' digests and, per kind, ``{name: [start, stop, full shape, dtype]}``; or
        why they could not be written (for every worker to raise).
    """
    digests: dict[str, FileDigest] = {}
    pieces: dict[str, dict[str, list[Any]]] = {}
    try:
        with _interrupts_deferred():
            for kind in KINDS:
                name = shard_file(kind, workers.rank, workers.world_size)
                rows = {k: v for k, v in state[kind].items() if isinstance(v, RowShard)}
                where = name
                values = {k: to_storable_array(k, v.value, where) for k, v in rows.items()}
                buffers = encode_tensor_file(values, where)
                digest = _write_file(staging / name, buffers)
                assert digest is not None  # durable: digested and fsynced
                digests[name] = digest
                pieces[kind] = {
                    k: [v.start, v.stop, list(v.shape), values[k].dtype.name]
                    for k, v in rows.items()
                }
                _pause_for_tests()
    except (CheckpointError, OSError) as error:
        return f"worker {workers.rank}: {error}"
    return digests, pieces


def _whole(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The entries that are not sharded (rank 0 writes them as an unsharded save would)."""
    return {k: v for k, v in state.items() if not isinstance(v, RowShard)}
