"""Reading and verifying checkpoint directories, refusing anything damaged, with no pickle.

Tensors are parsed by safetensors from bytes, JSON by the standard library; nothing on this
path can execute code from the checkpoint. Every refusal raises
:class:`~unitrain.CheckpointError` naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import safetensors.numpy

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import (
    ALL_FILES,
    CALLBACKS_FILE,
    DATA_FILES,
    MANIFEST_FILE,
    MAX_JSON_BYTES,
    MODEL_FILE,
    OPTIMIZER_FILE,
    TRAINER_FILE,
    check_json_value,
    check_tensor_name,
    check_trainer_state,
    decode_json,
    parse_manifest,
    sha256_hex,
)

__all__ = ["Checkpoint", "load_checkpoint", "read_file", "verify_checkpoint"]

# O_NOFOLLOW closes the gap between the symlink check and the open; O_NONBLOCK keeps a FIFO
# planted under a checkpoint file name from blocking the open (fstat then refuses it).
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_BINARY", 0)
)


class Checkpoint(NamedTuple):
    """The contents of one loaded checkpoint directory.

    Attributes:
        path: the checkpoint directory it was read from.
        model: model parameters under canonical names, as writable numpy arrays.
        optimizer: optimizer state, as writable numpy arrays (possibly empty).
        callbacks: arrays held by callbacks' states (possibly empty).
        trainer: the trainer state saved with it, including ``"format_version"``. JSON arrays
            come back as lists, and ``NaN``/``Infinity`` as floats.
    """

    path: Path
    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    trainer: dict[str, Any]
    callbacks: dict[str, np.ndarray]


def load_checkpoint(path: str | os.PathLike[str], *, verify: bool = True) -> Checkpoint:
    """Reads a checkpoint directory, refusing it if anything is missing, extra or damaged.

    Args:
        path: the checkpoint directory (it may itself be a symlink; the files in it may not).
        verify: check that the directory holds exactly the checkpoint files and that each
            file's size and SHA-256 match ``manifest.json``. Turn off only to salvage a
            checkpoint whose manifest is lost; the files must still parse and the trainer state
            must still be valid.

    Returns:
        The loaded :class:`Checkpoint`; arrays are bit-exact copies of those saved.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete, modified, truncated, of a newer
            format, or not a unitrain checkpoint.

    Examples:
        >>> import tempfile, numpy as np
        >>> from unitrain.checkpoint import save_checkpoint
        >>> root = tempfile.mkdtemp()
        >>> saved = save_checkpoint(
        ...     f"{root}/last",
        ...     model={"w": np.arange(3.0)},
        ...     optimizer={},
        ...     trainer={"epoch": 1, "step": 20},
        ... )
        >>> checkpoint = load_checkpoint(saved)
        >>> checkpoint.model["w"], checkpoint.trainer["step"]
        (array([0., 1., 2.]), 20)
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"{root}: no checkpoint directory here; check the path, or resume from 'latest'"
        )
    manifest: dict[str, tuple[str, int]] = {}
    if verify:
        _check_file_set(root)
        manifest = parse_manifest(
            read_file(root / MANIFEST_FILE, MAX_JSON_BYTES), root / MANIFEST_FILE
        )
    contents: dict[str, bytes] = {}
    for name in DATA_FILES:
        file = root / name
        limit = MAX_JSON_BYTES if name == TRAINER_FILE else None
        data = read_file(file, limit)
        if verify:
            _check_integrity(file, data, *manifest[name])
        contents[name] = data
    trainer_file = root / TRAINER_FILE
    trainer = check_trainer_state(
        decode_json(contents.pop(TRAINER_FILE), trainer_file), trainer_file
    )
    check_json_value(trainer, str(trainer_file))
    model = _decode_tensors(contents.pop(MODEL_FILE), root / MODEL_FILE)
    optimizer = _decode_tensors(contents.pop(OPTIMIZER_FILE), root / OPTIMIZER_FILE)
    callbacks = _decode_tensors(contents.pop(CALLBACKS_FILE), root / CALLBACKS_FILE)
    return Checkpoint(
        path=root, model=model, optimizer=optimizer, trainer=trainer, callbacks=callbacks
    )


def verify_checkpoint(path: str | os.PathLike[str]) -> None:
    """Checks that a checkpoint loads: every check of :func:`load_checkpoint`, result dropped.

    It reads and parses every file, so it costs as much as a load; it proves the checkpoint
    loads, not merely that the hashes match.

    Args:
        path: the checkpoint directory.

    Raises:
        CheckpointError: exactly when :func:`load_checkpoint` would.
    """
    load_checkpoint(path, verify=True)


def read_file(file: Path, limit: int | None) -> bytes:
    """Reads one checkpoint file, refusing symlinks, non-regular files and files over ``limit``.

    Args:
        file: the file to read.
        limit: the largest size in bytes accepted, or ``None`` for no limit.

    Returns:
        The file's bytes.
    """
    if file.is_symlink():
        raise CheckpointError(
            f"{file}: is a symlink; a checkpoint must hold its own regular files — copy the "
            "real file in its place, or use another checkpoint"
        )
    try:
        descriptor = os.open(file, _OPEN_FLAGS)
    except FileNotFoundError:
        raise CheckpointError(
            f"{file}: missing; the checkpoint is incomplete — use an earlier checkpoint"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{file}: cannot be opened ({exc}); check permissions") from exc
    # fstat before fdopen: fdopen itself raises IsADirectoryError for a directory.
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise CheckpointError(
            f"{file}: is not a regular file; the checkpoint is damaged — use another one"
        )
    with os.fdopen(descriptor, "rb") as handle:
        if limit is not None and info.st_size > limit:
            raise CheckpointError(
                f"{file}: is {info.st_size} bytes, over the {limit} byte limit for this file; "
                "it is damaged or not a unitrain checkpoint — use another one"
            )
        try:
            # Reading at most one byte past the size stat reported bounds memory even if the
            # file grows while being read; a changed size then fails the manifest check.
            return handle.read(info.st_size + 1)
        except OSError as exc:
            raise CheckpointError(f"{file}: could not be read ({exc})") from exc


def _check_file_set(root: Path) -> None:
    try:
        present = set(os.listdir(root))
    except OSError as exc:
        raise CheckpointError(f"{root}: cannot list the checkpoint directory ({exc})") from exc
    missing = sorted(ALL_FILES - present)
    if missing:
        raise CheckpointError(
            f"{root}: missing {', '.join(missing)}; the checkpoint is incomplete — use an "
            "earlier checkpoint"
        )
    extra = sorted(present - ALL_FILES)
    if extra:
        raise CheckpointError(
            f"{root}: unexpected files {', '.join(extra)}; a checkpoint holds only "
            f"{', '.join(sorted(ALL_FILES))} — move the others out of the directory"
        )


def _check_integrity(file: Path, data: bytes, digest: str, size: int) -> None:
    if len(data) != size:
        raise CheckpointError(
            f"{file}: size mismatch (expected {size} bytes, found {len(data)}); the file was "
            "truncated or modified after saving — use an earlier checkpoint"
        )
    actual = sha256_hex(data)
    if actual != digest:
        raise CheckpointError(
            f"{file}: sha256 mismatch (expected {digest}, found {actual}); the file or the "
            "manifest was modified or damaged after saving — use an earlier checkpoint"
        )


def _decode_tensors(data: bytes, file: Path) -> dict[str, np.ndarray]:
    try:
        views = safetensors.numpy.load(data)
    except Exception as exc:  # the library's own error types are not a stable API
        raise CheckpointError(
            f"{file}: not a readable safetensors file ({type(exc).__name__}: {exc}); it is "
            "damaged or was not written by unitrain — use an earlier checkpoint"
        ) from exc
    del data
    tensors: dict[str, np.ndarray] = {}
    for name in list(views):
        check_tensor_name(name, str(file))
        # The views are read-only windows on bytes; copying one at a time and dropping the view
        # keeps the peak memory near one extra tensor instead of a second full state.
        tensors[name] = np.array(views.pop(name))
    return tensors
