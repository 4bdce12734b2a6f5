"""Removing checkpoint directories, and the hidden names that keep a crash harmless.

Every change to a checkpoint directory goes through a hidden sibling
``.{name}.{kind}-{pid}-{random}`` that readers ignore: ``tmp`` while a save is staged,
``old`` while a replaced checkpoint is displaced, ``del`` while one is deleted (see
:mod:`unitrain.checkpoint._write` for the save). This module names those siblings, removes
checkpoints through them, and clears what killed processes left behind.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import warnings
from pathlib import Path

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import CheckpointWarning, is_checkpoint_file
from unitrain.training._lock import LOCK_NAME, pid_running

__all__ = [
    "DISPLACED_PATTERN",
    "LEFTOVER_PATTERN",
    "check_is_checkpoint_directory",
    "fsync_directory",
    "remove_checkpoint",
    "remove_leftovers",
    "remove_tree",
    "sibling_name",
]

#: Files a desktop's file browser drops into any folder it shows; a checkpoint holding them is
#: still only a checkpoint, so removing or replacing it removes them too.
DESKTOP_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
#: Matches the hidden name a checkpoint has while it is being replaced (step 1 above).
DISPLACED_PATTERN = re.compile(r"\.(?P<name>.+)\.old-[0-9]+-[0-9a-f]+")
#: Matches what an interrupted save (``tmp``) or removal (``del``) leaves, with its writer's pid.
LEFTOVER_PATTERN = re.compile(r"\.(?P<name>.+)\.(?:tmp|del)-[0-9]+-[0-9a-f]+")


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Deletes a checkpoint directory so that a crash midway never leaves a damaged lookalike.

    The directory is first renamed to a hidden ``.{name}.del-{pid}-{random}`` sibling, which
    every reader ignores, and only then deleted. Directories holding anything other than
    checkpoint files are refused, so a wrong path cannot delete unrelated data.

    Args:
        path: the checkpoint directory.

    Raises:
        CheckpointError: nothing is at ``path``, it is not a checkpoint directory, or the
            rename failed. A failure to delete the renamed copy only warns.

    Examples:
        >>> import tempfile
        >>> from unitrain.checkpoint import save_checkpoint
        >>> root = Path(tempfile.mkdtemp())
        >>> saved = save_checkpoint(
        ...     root / "last", model={}, optimizer={}, trainer={"epoch": 0, "step": 0}
        ... )
        >>> remove_checkpoint(saved)
        >>> list(root.iterdir())
        []
    """
    target = Path(path)
    if not os.path.lexists(target):
        raise CheckpointError(f"{target}: no checkpoint to remove; check the path")
    check_is_checkpoint_directory(target, "remove")
    trash = target.parent / sibling_name(target.name, "del")
    try:
        os.replace(target, trash)
        fsync_directory(target.parent)
    except OSError as exc:
        raise CheckpointError(f"{target}: could not remove the checkpoint: {exc}") from exc
    remove_tree(trash)


def remove_leftovers(directory: str | os.PathLike[str]) -> None:
    """Deletes the unfinished saves and removals that killed processes left in ``directory``.

    Readers ignore them, but each can be as large as a checkpoint, and a job that is killed
    often would fill its disk. Only those whose writer (the pid in the name) is not running on
    this host, or is this process, are deleted; call this only while holding the directory's
    run lock (the Trainer does, see :mod:`unitrain.training._lock`), so that no other run
    writes there. A displaced ``.{name}.old-*`` copy is deleted only when ``name`` exists (the
    replacement was installed); otherwise it is the only copy of that checkpoint and is kept.

    Args:
        directory: a checkpoint directory; a missing one has nothing to delete.
    """
    root = Path(directory)
    try:
        names = set(os.listdir(root))
    except OSError:
        return
    for name in names:
        if name.startswith(LOCK_NAME):  # the run lock's own files: see unitrain.training._lock
            continue
        leftover = LEFTOVER_PATTERN.fullmatch(name) or DISPLACED_PATTERN.fullmatch(name)
        if leftover is None or (".old-" in name and leftover["name"] not in names):
            continue
        pid = int(name.rsplit("-", 2)[1])
        if pid == os.getpid() or not pid_running(pid):
            remove_tree(root / name)


def sibling_name(name: str, kind: str) -> str:
    return f".{name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def check_is_checkpoint_directory(target: Path, action: str) -> None:
    """Refuses to replace or remove ``target`` unless it is absent or a checkpoint directory."""
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir():
        raise CheckpointError(
            f"{target}: refusing to {action} it: it is a symlink or not a directory, so it is "
            "not a checkpoint; move it away or choose another path"
        )
    names = set(os.listdir(target)) - DESKTOP_FILES
    unexpected = sorted(n for n in names if not is_checkpoint_file(n))
    if unexpected:
        raise CheckpointError(
            f"{target}: refusing to {action} it: it holds {unexpected}, which are not "
            "checkpoint files; move them away or choose another path"
        )


def fsync_directory(directory: Path) -> None:
    """Makes renames and new entries in ``directory`` durable (POSIX only; a no-op elsewhere)."""
    if os.name != "posix":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove_tree(directory: Path) -> None:
    try:
        shutil.rmtree(directory)
    except OSError as exc:
        warnings.warn(
            f"{directory}: could not delete this leftover checkpoint copy ({exc}); it is "
            "ignored by unitrain and can be deleted by hand",
            CheckpointWarning,
            stacklevel=3,
        )
