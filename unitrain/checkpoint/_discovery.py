"""Finding checkpoints in a directory and choosing the one to resume from."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import (
    MANIFEST_FILE,
    MAX_JSON_BYTES,
    TRAINER_FILE,
    CheckpointWarning,
    check_trainer_state,
    decode_json,
)
from unitrain.checkpoint._read import Checkpoint, load_checkpoint, read_file
from unitrain.checkpoint._remove import DISPLACED_PATTERN

__all__ = ["checkpoint_run", "list_checkpoints", "load_resolved", "resolve_checkpoint"]


def list_checkpoints(directory: str | os.PathLike[str], *, run: str | None = None) -> list[Path]:
    """Lists the checkpoint directories directly inside ``directory``, oldest first.

    A checkpoint is a subdirectory (not a symlink) holding a ``manifest.json``. Hidden names
    are skipped, since unfinished writes and deletions live under them, with one exception: a
    ``.{name}.old-*`` copy displaced by an interrupted replacement is listed while ``name``
    itself is absent, so a crash mid-replacement never loses the old checkpoint.

    The order is by the run *generation*, then the ``step`` (then ``epoch``, then name) in each
    ``trainer.json``, which is only read, not verified. A run that resumes from an older checkpoint
    than the newest starts a new generation (see :mod:`unitrain.training._lineage`), so its
    checkpoints are newer than every step of the run it branched from, even where their step is
    lower (another batch size). Checkpoints without a generation (written before it was recorded)
    are generation 0. Checkpoints whose trainer state cannot be read come first, by
    name, so they are tried last when looking for the newest.

    Args:
        directory: where the checkpoints are; a missing directory has none.
        run: only the checkpoints this run id wrote (see :mod:`unitrain.training._lineage`), judged
            from the trainer.json read for the order anyway; None: all.

    Returns:
        The checkpoint paths, ``directory / name``, from oldest to newest.

    Raises:
        CheckpointError: ``directory`` exists but is not a readable directory.

    Examples:
        >>> import tempfile
        >>> list_checkpoints(tempfile.mkdtemp())
        []
    """
    root = Path(directory)
    if not os.path.lexists(root):
        return []
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise CheckpointError(
            f"{root}: cannot list checkpoints ({exc}); pass the directory checkpoints are in"
        ) from exc
    present = set(names)
    keyed: list[tuple[tuple[int, int, int, int, str], Path]] = []
    for name in names:
        if name.startswith("."):
            displaced = DISPLACED_PATTERN.fullmatch(name)
            if displaced is None or displaced["name"] in present:
                continue
        candidate = root / name
        if candidate.is_symlink() or not candidate.is_dir():
            continue
        if not os.path.lexists(candidate / MANIFEST_FILE):
            continue
        state = _trainer_state(candidate)
        if run is None or (state is not None and _run_record(state)["id"] == run):
            keyed.append((_order_key(candidate, state), candidate))
    keyed.sort(key=lambda item: item[0])
    return [path for _, path in keyed]


def resolve_checkpoint(spec: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """Turns a resume request into a verified checkpoint path.

    Args:
        spec: ``"latest"`` for the newest checkpoint in ``directory`` that verifies, or the path
            of one checkpoint (relative paths are relative to the working directory, not to
            ``directory``; write ``./latest`` for a checkpoint named ``latest``).
        directory: where ``"latest"`` looks; unused for a path.

    Returns:
        The checkpoint directory to load.

    Raises:
        CheckpointError: ``spec`` is a path that does not verify, or ``"latest"`` finds no
            checkpoint that verifies (the message lists each one tried and why it failed).

    Warns:
        CheckpointWarning: for each newer checkpoint skipped by ``"latest"``, naming it and why.

    Examples:
        >>> import tempfile
        >>> from unitrain.checkpoint import save_checkpoint
        >>> root = tempfile.mkdtemp()
        >>> for step in (10, 20):
        ...     _ = save_checkpoint(
        ...         f"{root}/step{step}", model={}, optimizer={}, trainer={"epoch": 0, "step": step}
        ...     )
        >>> resolve_checkpoint("latest", root).name
        'step20'
    """
    return load_resolved(spec, directory).path


def load_resolved(spec: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Checkpoint:
    """:func:`resolve_checkpoint`, returning the checkpoint it loaded to verify it.

    Verifying a checkpoint is loading it, so a resume uses this to read it once. For
    ``"latest"``, a checkpoint that fails to load for any reason (a MemoryError included) is
    skipped with a :class:`CheckpointWarning` naming the error. Checkpoints whose
    ``trainer.json`` cannot be read are tried first: their age is unknown, so each may be the
    newest, and each gets its warning.
    """
    if not (isinstance(spec, str) and spec == "latest"):
        return load_checkpoint(Path(spec))
    candidates = list_checkpoints(directory)
    if not candidates:
        raise CheckpointError(
            f"{directory}: no checkpoints to resume 'latest' from; start without resuming or "
            "pass the path of a checkpoint"
        )
    failures: list[str] = []
    # list_checkpoints puts those whose trainer.json does not read first, as of unknown age;
    # they are tried (and refused) first, so that each is warned about even when an older
    # readable one then loads.
    unreadable = [candidate for candidate in candidates if _trainer_state(candidate) is None]
    readable = [candidate for candidate in candidates if candidate not in unreadable]
    for candidate in [*unreadable, *reversed(readable)]:
        try:
            return load_checkpoint(candidate)
        except Exception as exc:  # any failure, MemoryError too, is a reason to skip it
            reason = (  # a CheckpointError's message starts with the path
                str(exc)
                if isinstance(exc, CheckpointError)
                else f"{candidate}: {type(exc).__name__}: {exc}"
            )
        warnings.warn(
            f"skipping checkpoint {candidate} when resuming 'latest': {reason}",
            CheckpointWarning,
            stacklevel=2,
        )
        failures.append(reason)
    raise CheckpointError(
        f"{directory}: none of its {len(candidates)} checkpoints is valid, so there is nothing "
        "to resume 'latest' from; start without resuming or restore a checkpoint. Tried, "
        "newest first:\n  " + "\n  ".join(failures)
    )


def checkpoint_run(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's run record and step (``{"id", "generation", "parent", "step"}``), read,
    not verified (see :mod:`unitrain.training._lineage`).

    Checkpoints written before runs were recorded give ``id`` and ``parent`` None and
    generation 0; one whose ``trainer.json`` cannot be read gives those and step -1.
    """
    return _run_record(_trainer_state(Path(checkpoint)) or {})


def _run_record(state: dict[str, Any]) -> dict[str, Any]:
    recorded = state.get("run")
    run: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    generation = run.get("generation")
    return {
        "id": run["id"] if isinstance(run.get("id"), str) else None,
        "generation": generation if type(generation) is int and generation >= 0 else 0,
        "parent": run["parent"] if isinstance(run.get("parent"), str) else None,
        "step": state.get("step", -1),
    }


def _trainer_state(checkpoint: Path) -> dict[str, Any] | None:
    """A checkpoint's trainer.json, read and checked for its counters only; None if it fails."""
    file = checkpoint / TRAINER_FILE
    try:
        return check_trainer_state(decode_json(read_file(file, MAX_JSON_BYTES), file), file)
    except CheckpointError:
        return None


def _order_key(checkpoint: Path, state: dict[str, Any] | None) -> tuple[int, int, int, int, str]:
    """Sorts readable checkpoints by (generation, step, epoch, name), after unreadable ones."""
    if state is None:
        return (0, 0, 0, 0, checkpoint.name)
    return (1, _run_record(state)["generation"], state["step"], state["epoch"], checkpoint.name)
