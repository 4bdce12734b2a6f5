"""Whose checkpoints are whose: a run's id, its generation, and a folder that is one run's own.

Every ``fit`` works for one *run*, recorded in each checkpoint it writes as
``trainer.json["run"] = {"id", "generation", "parent"}``:

- A fresh run gets a new random id. In a checkpoint folder that already holds checkpoints it
  is refused (:func:`claim_folders`): it would prune them and write a ``latest`` that mixes
  two runs. Resume that run instead (``resume="auto"``), use another folder, or move them
  aside (``fit(..., archive_existing=True)``, ``unitrain train --archive-existing``), which
  keeps them under ``archive/<time>-<id>/`` inside the folder.
- Resuming the newest checkpoint of a folder continues its run: same id, same generation.
- Resuming any other checkpoint (an older one, one from elsewhere, one past a damaged newest)
  *branches*: a new id, a generation one above the folder's highest, and ``parent`` naming
  the run and step it came from. ``latest`` orders by generation before step
  (:func:`unitrain.checkpoint.list_checkpoints`), so it follows the branch even where its
  steps are lower (another batch size), and ``ModelCheckpoint`` prunes only its own run's
  checkpoints: nothing a run does deletes another run's newest work.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from pathlib import Path
from typing import Any

from unitrain._errors import CheckpointError
from unitrain.checkpoint import checkpoint_run, list_checkpoints

__all__ = ["Lineage", "claim_folders", "lineage_for"]


@dataclasses.dataclass(frozen=True)
class Lineage:
    """The run a Trainer's checkpoints belong to.

    Attributes:
        id: random hex, new for every fresh run and every branch.
        generation: orders runs in one folder: ``latest`` is the newest of the highest one.
        parent: ``"<id>@<step>"`` of the checkpoint a branch started from, else None.
    """

    id: str
    generation: int = 0
    parent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record written into ``trainer.json["run"]``."""
        return dataclasses.asdict(self)


def _new_id() -> str:
    return secrets.token_hex(6)


def lineage_for(folders: list[Path], resumed: Path | None, step: int) -> Lineage:
    """The run of a ``fit`` over ``folders`` that resumed ``resumed`` (None: a fresh run).

    Args:
        folders: the checkpoint folders this run writes to.
        resumed: the checkpoint restored, or None.
        step: the step that checkpoint was written at (the run's step after restoring).
    """
    listed = {os.path.realpath(folder): list_checkpoints(folder) for folder in folders}
    top = max(
        (checkpoint_run(path)["generation"] for found in listed.values() for path in found),
        default=-1,
    )
    if resumed is None:
        return Lineage(_new_id(), top + 1)
    record = checkpoint_run(resumed)
    in_folder = listed.get(os.path.realpath(resumed.parent))
    newest = in_folder[-1] if in_folder else None
    if newest is not None and record["id"] is not None:
        newest_record = checkpoint_run(newest)
        if newest_record["id"] == record["id"] and newest_record["step"] == step:
            return Lineage(record["id"], record["generation"], record["parent"])
    if newest is not None and record["id"] is None and newest.resolve() == resumed.resolve():
        return Lineage(_new_id(), record["generation"])  # a run from before ids: carry on
    return Lineage(_new_id(), top + 1, f"{record['id'] or 'unrecorded'}@{step}")


def claim_folders(folders: list[Path], *, archive: bool) -> None:
    """Make ``folders`` a fresh run's own: refuse, or with ``archive`` move aside, checkpoints.

    Raises:
        CheckpointError: a folder holds checkpoints and ``archive`` is False.
    """
    for folder in folders:
        found = list_checkpoints(folder)
        if not found:
            continue
        if not archive:
            raise CheckpointError(
                f"{folder}: holds {len(found)} checkpoint(s) of an earlier run (newest: "
                f"{found[-1].name}); a new run here would prune them and take over 'latest'. "
                "Continue that run with resume='auto' (unitrain train --resume auto), give "
                "this run another folder, or move them aside with fit(..., "
                "archive_existing=True) (unitrain train --archive-existing)"
            )
        record = checkpoint_run(found[-1])
        into = folder / "archive" / f"{time.strftime('%Y%m%d-%H%M%S')}-{record['id'] or 'run'}"
        try:
            into.mkdir(parents=True, exist_ok=False)
            for path in found:
                os.rename(path, into / path.name)
        except OSError as exc:
            raise CheckpointError(
                f"{folder}: could not move its checkpoints into {into} ({exc}); move them "
                "yourself or give this run another folder"
            ) from exc
