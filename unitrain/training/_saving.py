"""How a run writes a checkpoint, on one worker or many.

:func:`save_run` is :meth:`Trainer.save_checkpoint`'s body. Every worker calls it and takes
part in the same collectives in the same order (the running loss is summed over the
workers). Then either:

- rank 0 writes the whole checkpoint from its full tensors (one worker, data-parallel
  workers, and a sharded engine that cannot read its state without a gather), the others
  waiting until it has; or
- where the strategy lets the workers exchange small values and the backend reads its
  state without gathering (``local_state_dict``: each sharded tensor as this worker's
  :class:`~unitrain.checkpoint.RowShard`), every worker writes its own rows and rank 0 the
  rest (:mod:`unitrain.checkpoint._write_shards`), so no process holds the whole model.

Rank 0 first checks that no other run has taken the folder; a save in the background is
installed only if none has meanwhile. Where a run's checkpoints go (its folders, the path of
a checkpoint the loop takes itself) is decided here too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError
from unitrain.checkpoint import (
    CheckpointWriter,
    checkpoint_name,
    list_checkpoints,
    save_checkpoint,
)
from unitrain.checkpoint._write_shards import save_sharded_checkpoint
from unitrain.training._lock import check_locks, confirm_locks
from unitrain.training._run_state import Run, join_snapshot, snapshot

__all__ = [
    "checkpoint_folders",
    "checkpoint_path",
    "nothing_to_resume",
    "save_run",
    "writes_shards",
]


def writes_shards(run: Run) -> bool:
    """Whether each worker of ``run`` writes its own rows of a checkpoint."""
    exchange = getattr(run.strategy, "exchange", None)
    return callable(exchange) and callable(getattr(run.backend, "local_state_dict", None))


def save_run(
    run: Run,
    path: Path,
    writer: CheckpointWriter,
    locks: Any,
    *,
    background: bool,
    then: Callable[[], None] | None,
) -> Path:
    """Every worker's part of saving ``run`` to ``path`` (see the module doc).

    Args:
        run: the Trainer.
        path: the checkpoint directory.
        writer: rank 0's writer (its previous background save is waited for first).
        locks: the run's folder locks, checked by rank 0 before writing.
        background: rank 0 returns once the files are written; the writer finishes.
        then: run on rank 0 once the checkpoint is in place.
    """
    guard = functools.partial(confirm_locks, locks) if background else None
    if writes_shards(run):

        def before() -> None:  # on rank 0, before anything is written
            check_locks(locks)
            writer.wait()

        saved = save_sharded_checkpoint(
            path,
            workers=run.strategy,
            writer=writer if background else None,
            before=before,
            then=then,
            guard=guard,
            **snapshot(run, local=True),
        )
    elif not run.strategy.is_main:
        join_snapshot(run)  # rank 0's sums the running loss (and gathers a sharded model)
        saved = path
    else:
        check_locks(locks)  # never write where another run has taken over
        state = snapshot(run)
        if background:
            saved = writer.save(path, then=then, guard=guard, **state)
        else:
            writer.wait()
            saved = save_checkpoint(path, **state)
            if then is not None:
                then()
    run.strategy.barrier()
    return saved


def checkpoint_folders(run: Any) -> list[Path]:
    """``checkpoint_dir`` (first), then the folders ``run``'s callbacks declare they write to."""
    declared = [d for c in run.callbacks.callbacks for d in getattr(c, "writes_to", ())]
    return [Path(d) for d in [run.config.checkpoint_dir, *declared] if d is not None]


def checkpoint_path(run: Any) -> Path | None:
    """Where a checkpoint of this step goes when the loop itself saves one (None: nowhere).

    In ``checkpoint_dir``, named as ModelCheckpoint names it, so ``resume="latest"`` and
    pruning treat it as one of the run's checkpoints."""
    folders = checkpoint_folders(run)
    if not folders:
        return None
    return folders[0] / checkpoint_name(run.epoch_number, run.state.step)


def nothing_to_resume(config: Any, resume: str) -> bool:
    """Whether ``resume="latest"``/``"auto"`` finds no checkpoint at all (a first run).

    Checkpoints that exist but are all damaged are an error, raised by the resolver."""
    if config.checkpoint_dir is None:
        raise ConfigError(f"resume={resume!r} needs TrainerConfig(checkpoint_dir=...)")
    return not list_checkpoints(config.checkpoint_dir)
