"""Writing checkpoint directories so that a crash never leaves a half-written one.

A checkpoint is staged in a hidden sibling ``.{name}.tmp-{pid}-{random}``, every file and the
directory are fsynced, and only then is it renamed to its real name. Replacing an existing
checkpoint ``name`` takes three steps:

1. rename ``name`` to the hidden sibling ``.{name}.old-{pid}-{random}`` (the *displaced* copy);
2. rename the staged directory to ``name`` and fsync the parent directory;
3. delete the displaced copy.

A crash before step 1 leaves the old checkpoint at ``name``; after step 2, the new one. A crash
between steps 1 and 2 leaves no ``name`` at all, and :func:`list_checkpoints` then reports the
displaced copy in its place, so "latest" still finds the old checkpoint. Leftover ``.tmp-`` and
``.del-`` directories are ignored by every reader (see :mod:`unitrain.checkpoint._remove`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from unitrain._errors import CheckpointError
from unitrain.checkpoint._digest import CHUNK_BYTES, XXH3_64, Digest
from unitrain.checkpoint._format import (
    CALLBACKS_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    SHARDS_FILE,
    TRAINER_FILE,
    FileDigest,
    encode_manifest,
    encode_trainer_state,
)
from unitrain.checkpoint._remove import (
    check_is_checkpoint_directory,
    fsync_directory,
    remove_tree,
    sibling_name,
)
from unitrain.checkpoint._safetensors import encode_tensor_file

__all__ = ["CheckpointWriter", "checkpoint_name", "save_checkpoint"]

#: Test hook: seconds to sleep after writing each file, so a test can kill a save midway.
WRITE_DELAY_ENV = "UNITRAIN_CHECKPOINT_WRITE_DELAY"


def checkpoint_name(epoch: int, step: int) -> str:
    """Returns the directory name for a checkpoint taken at ``epoch`` and global ``step``.

    Zero padding makes names sort in training order up to epoch 9999 and step 999999; past that
    the names get longer, and :func:`list_checkpoints` still orders by the recorded step.

    Args:
        epoch: the epoch counter, >= 0.
        step: the number of optimizer updates applied so far, >= 0.

    Returns:
        A name such as ``"epoch=0003-step=000150"``.

    Examples:
        >>> checkpoint_name(3, 150)
        'epoch=0003-step=000150'
    """
    for label, value in (("epoch", epoch), ("step", step)):
        if type(value) is not int or value < 0:
            raise CheckpointError(f"checkpoint_name: {label} must be an int >= 0, got {value!r}")
    return f"epoch={epoch:04d}-step={step:06d}"


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: Mapping[str, np.ndarray],
    optimizer: Mapping[str, np.ndarray],
    trainer: Mapping[str, Any],
    callbacks: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Writes one checkpoint directory atomically, replacing any checkpoint already at ``path``.

    Everything is validated and laid out before the disk is touched; the arrays' bytes are
    then written from their own memory (no serialised copy), each file is digested for the
    manifest and fsynced, and the directory is renamed into place. It is durable when this
    returns (:class:`CheckpointWriter` finishes the last steps in the background instead).
    Parent directories are created. ``trainer`` must hold int ``"step"`` and ``"epoch"`` >= 0,
    str keys and JSON values only (tuples come back as lists); ``"format_version"`` is added.
    For tests that kill a save midway, the environment variable
    ``UNITRAIN_CHECKPOINT_WRITE_DELAY`` (seconds) makes it sleep after writing each file.

    Args:
        path: the checkpoint directory to create; its name must not start with ``"."``.
        model: model parameters as numpy arrays under canonical names.
        optimizer: optimizer state as numpy arrays; may be empty.
        trainer: the JSON-serialisable trainer state.
        callbacks: arrays held by callbacks' states, by name; may be empty or None.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        CheckpointError: the state cannot be stored, ``path`` holds something that is not a
            checkpoint, or writing failed (the OS error is named; a previous checkpoint at
            ``path`` is left in place).

    Examples:
        >>> import tempfile, numpy as np
        >>> root = Path(tempfile.mkdtemp())
        >>> saved = save_checkpoint(
        ...     root / checkpoint_name(0, 10),
        ...     model={"w": np.ones(3, np.float32)},
        ...     optimizer={},
        ...     trainer={"epoch": 0, "step": 10},
        ... )
        >>> sorted(p.name for p in saved.iterdir())  # doctest: +NORMALIZE_WHITESPACE
        ['callbacks.safetensors', 'manifest.json', 'model.safetensors',
         'optimizer.safetensors', 'trainer.json']
    """
    with _interrupts_deferred():  # Ctrl-C midway would drop the checkpoint: it finishes first
        staged = _stage(Path(path), model, optimizer, trainer, callbacks)
        staged.commit()
    return staged.target


class CheckpointWriter:
    """Saves checkpoints and finishes each one on a background thread while training goes on.

    :meth:`save` returns once the files are written (into the page cache); a worker thread
    then digests them for the manifest, fsyncs them and renames the directory into place,
    exactly as :func:`save_checkpoint` does. The checkpoint therefore appears at its path
    only when it is durable: a crash in between loses it and leaves the previous checkpoints
    as they were (and a hidden staging directory that :func:`remove_leftovers` deletes).
    For a 403 MB model the caller is blocked for the write alone, about half of a durable
    save on this kind of machine (benchmarks/README.md).

    One save is finished at a time: :meth:`save` first waits for the one before. Call
    :meth:`wait` before relying on the checkpoint (the Trainer does at the end of ``fit``);
    it raises the error of a background step that failed, and so does the next :meth:`save`.

    Args:
        on_failure: called on the worker thread as soon as a background step fails, so the
            caller can act at once (the Trainer does after the update in progress) rather
            than at the next save; :attr:`failed` says the same.
    """

    def __init__(self, on_failure: Callable[[], None] | None = None) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._on_failure = on_failure

    @property
    def failed(self) -> bool:
        """Whether a background step failed and :meth:`wait` will raise its error."""
        return self._error is not None

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        model: Mapping[str, np.ndarray],
        optimizer: Mapping[str, np.ndarray],
        trainer: Mapping[str, Any],
        callbacks: Mapping[str, np.ndarray] | None = None,
        then: Callable[[], None] | None = None,
        guard: Callable[[], None] | None = None,
        shards: ShardFiles | None = None,
    ) -> Path:
        """Like :func:`save_checkpoint`, finishing in the background; ``then`` runs after.

        ``then`` (on the worker thread, after the rename) is where older checkpoints can be
        deleted safely: before it, the new one might not exist yet. ``guard`` runs on the
        worker thread just before the rename; an error it raises drops the checkpoint (the
        staged files are removed) and is raised by :meth:`wait`, as a failed step's is. The
        Trainer's checks that no other run has taken the folder since the save began.
        ``shards``: the workers' files of a sharded checkpoint, already in their staging
        directory (:func:`unitrain.checkpoint._write_shards.save_sharded_checkpoint`).

        Raises:
            CheckpointError: as :func:`save_checkpoint` for the writing (at once), or a
                background step of the previous save failed.
        """
        self.wait()

        def finish() -> None:
            try:
                staged.commit(guard)
                if then is not None:
                    then()
            except BaseException as error:  # handed to the caller's thread by wait()
                self._error = error
                if self._on_failure is not None:
                    self._on_failure()

        # Ctrl-C in the written half would drop this checkpoint; it is held until the
        # background thread has it (the run then waits for that thread before it ends).
        with _interrupts_deferred():
            staged = _stage(
                Path(path), model, optimizer, trainer, callbacks, durable=False, shards=shards
            )
            self._thread = threading.Thread(target=finish, name="unitrain-checkpoint", daemon=True)
            self._thread.start()
        return staged.target

    def wait(self) -> None:
        """Blocks until the save in flight is durable and in place; raises its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block ends, then act on it as it would have.

    A save's files are written under it, so Ctrl-C cannot drop a checkpoint half written
    (docs/checkpoints.md promises that the save in progress finishes). ``Thread.start`` waits
    for the new thread to report in; a KeyboardInterrupt landing in that wait would leave a
    thread that runs but cannot be joined, so ``wait`` would fail and the save could outlive the
    run's lock. The handler is swapped rather than the signal blocked: a process-directed
    signal blocked on the main thread is delivered to another thread (BLAS's, the writer's),
    and Python would still raise it on the main thread at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)
        elif received and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


class ShardFiles(NamedTuple):
    """What the workers of a sharded save wrote before rank 0 finishes it: the staging
    directory (:func:`new_staging`) their files are in, their digests, and ``shards.json``."""

    staging: Path
    digests: dict[str, FileDigest]
    layout: bytes


class _Staged:
    """A checkpoint whose files are written in a hidden staging directory, not yet in place."""

    def __init__(self, target: Path, staging: Path, files: dict[str, FileDigest | None]) -> None:
        self.target, self._staging, self._files = target, staging, files

    def commit(self, guard: Callable[[], None] | None = None) -> None:
        """Digests and fsyncs what :func:`_stage` did not, writes the manifest, runs
        ``guard`` (which may refuse), installs."""
        try:
            try:
                digests = {
                    name: digest or _digest_and_sync(self._staging / name)
                    for name, digest in self._files.items()
                }
                _write_file(self._staging / MANIFEST_FILE, [memoryview(encode_manifest(digests))])
                _pause_for_tests()
                fsync_directory(self._staging)
                if guard is not None:
                    guard()
                _install(self._staging, self.target)
            except OSError as exc:
                raise _save_failed(self.target, exc) from exc
        finally:
            if os.path.lexists(self._staging):
                shutil.rmtree(self._staging, ignore_errors=True)


def _stage(
    target: Path,
    model: Mapping[str, np.ndarray],
    optimizer: Mapping[str, np.ndarray],
    trainer: Mapping[str, Any],
    callbacks: Mapping[str, np.ndarray] | None,
    *,
    durable: bool = True,
    shards: ShardFiles | None = None,
) -> _Staged:
    """Validates the state and writes its files into a new staging directory (or, for a
    sharded checkpoint, into the one holding the workers' files).

    ``durable``: each file is also digested and fsynced here (else by :meth:`_Staged.commit`,
    which reads it back from the page cache, so the arrays may change once this returns).
    """
    check_checkpoint_name(target)
    payloads = {
        MODEL_FILE: encode_tensor_file(model, f"{target}: model state"),
        OPTIMIZER_FILE: encode_tensor_file(optimizer, f"{target}: optimizer state"),
        CALLBACKS_FILE: encode_tensor_file(callbacks or {}, f"{target}: callback state"),
        TRAINER_FILE: [memoryview(encode_trainer_state(trainer, f"{target}: trainer state"))],
    }
    files: dict[str, FileDigest | None] = {}
    if shards is not None:
        payloads[SHARDS_FILE] = [memoryview(shards.layout)]
        files.update(shards.digests)
    staging = shards.staging if shards is not None else None
    try:
        staging = staging or new_staging(target)
        for name, buffers in payloads.items():
            files[name] = _write_file(staging / name, buffers, durable=durable)
            _pause_for_tests()
    except BaseException as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _save_failed(target, exc) from exc
        raise
    return _Staged(target, staging, files)


def check_checkpoint_name(target: Path) -> None:
    """Refuses a checkpoint path whose name is empty or hidden."""
    if not target.name or target.name.startswith("."):
        raise CheckpointError(
            f"{target}: a checkpoint name must not be empty or start with '.', since hidden "
            "names are reserved for unfinished writes; choose another name"
        )


def new_staging(target: Path) -> Path:
    """A new hidden staging directory beside ``target`` (parents created), once ``target``
    is known to be absent or a checkpoint that may be replaced.

    Raises:
        CheckpointError: ``target`` holds something else, or the directory cannot be made.
    """
    check_checkpoint_name(target)
    staging = target.parent / sibling_name(target.name, "tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        check_is_checkpoint_directory(target, "replace")
        os.mkdir(staging)
    except OSError as exc:
        raise _save_failed(target, exc) from exc
    return staging


def _save_failed(target: Path, exc: OSError) -> CheckpointError:
    return CheckpointError(
        f"{target}: could not save the checkpoint: {exc}; check free disk space and "
        f"permissions — a previous checkpoint at {target}, if any, is unchanged"
    )


def _pause_for_tests() -> None:
    time.sleep(float(os.environ.get(WRITE_DELAY_ENV) or 0))


def _write_file(
    file: Path, buffers: Sequence[memoryview], *, durable: bool = True
) -> FileDigest | None:
    """Writes ``buffers`` one after another to the new ``file``; if ``durable``, fsyncs it.

    Returns:
        When ``durable``, the file's digest and size for the manifest (else None: see
        :func:`_digest_and_sync`). The digest is computed while the fsync waits on the disk,
        which hides it (measured with CRC32, 3-4x slower than the XXH3 used now: for 403 MB
        on two busy cores, writing then fsyncing took 0.187 s, and computing the CRC32
        meanwhile 0.181 s, but beside the writes, competing with them for the CPU, 0.215 s).
    """
    size = sum(buffer.nbytes for buffer in buffers)
    with open(file, "xb", buffering=0) as handle:
        for chunk in _chunks(buffers):
            while chunk:  # an unbuffered write may take only part of the chunk
                chunk = chunk[handle.write(chunk) :]
        if not durable:
            return None
        with Digest(XXH3_64, size) as digest:
            for chunk in _chunks(buffers):
                digest.update(chunk)
            os.fsync(handle.fileno())
            return FileDigest(XXH3_64, digest.hexdigest(), size)


def _digest_and_sync(file: Path) -> FileDigest:
    """The digest and size of a file written without fsync, read back; then fsyncs it.

    Reading back (from the page cache) rather than digesting the arrays it was written from
    lets the caller change them as soon as the write returns.
    """
    with open(file, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        with Digest(XXH3_64, size) as digest:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
            os.fsync(handle.fileno())
            return FileDigest(XXH3_64, digest.hexdigest(), size)


def _chunks(buffers: Sequence[memoryview]) -> Iterator[memoryview]:
    for buffer in buffers:
        for start in range(0, buffer.nbytes, CHUNK_BYTES):
            yield buffer[start : start + CHUNK_BYTES]


def _install(staging: Path, target: Path) -> None:
    """Renames the finished ``staging`` directory to ``target``, displacing an old checkpoint."""
    if not os.path.lexists(target):
        os.replace(staging, target)
        fsync_directory(target.parent)
        return
    displaced = target.parent / sibling_name(target.name, "old")
    os.replace(target, displaced)
    try:
        os.replace(staging, target)
    except OSError:
        try:
            os.replace(displaced, target)
        except OSError as restore_error:
            raise CheckpointError(
                f"{target}: could not install the new checkpoint nor restore the previous one "
                f"({restore_error}); the previous checkpoint is at {displaced} — rename it back"
            ) from restore_error
        raise
    fsync_directory(target.parent)
    remove_tree(displaced)
