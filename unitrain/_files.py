"""Writing the files of a run folder: never through a symlink, and failures said plainly.

Every writer of a run folder (the metric loggers, the TensorBoard logger, checkpoints, the
run lock) goes through these helpers, for three reasons an audit found:

- A writer that follows symlinks writes outside the run. With ``metrics.jsonl`` a link to a
  file elsewhere, ``fit(resume="latest")`` cut that file from 56,893 bytes back to the
  logger's saved offset and appended to it. :func:`open_regular` opens with ``O_NOFOLLOW``
  and accepts only a regular file; a FIFO is opened with ``O_NONBLOCK`` (and refused), so it
  cannot hang the run waiting for a reader.
- A folder that cannot be written failed only at the first write, after a whole epoch of
  training. :func:`probe_writable` finds that out when training begins.
- A full, read-only or forbidden disk surfaced as a raw ``OSError`` traceback.
  :func:`write_error` (and :func:`raising_write_errors`) turn it into a
  :class:`~unitrain._errors.RunFolderError` saying what is wrong and what to do.

Only the last component of a path is checked: a run folder that is itself a symlink (to a
scratch disk, say) is the user's layout, and its files are still the run's own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal, cast

from unitrain._errors import RunFolderError

__all__ = [
    "open_regular",
    "probe_writable",
    "raising_write_errors",
    "require_regular_file",
    "write_error",
]

#: Each mode's ``os.open`` flags and ``os.fdopen`` mode, named as the built-in ``open``
#: names them. "w" has no O_TRUNC: the file is cut only once it is known to be a regular one.
_MODES = {
    "w": (os.O_WRONLY | os.O_CREAT, "wb"),
    "a": (os.O_WRONLY | os.O_CREAT | os.O_APPEND, "ab"),
    "r+": (os.O_RDWR, "r+b"),
    "x": (os.O_WRONLY | os.O_CREAT | os.O_EXCL, "wb"),
}
#: O_NONBLOCK: opening a FIFO for writing otherwise waits for a reader, for ever.
_ALWAYS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: What each kind of file that is not a regular one is called in messages.
_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}

#: What to do about the errors a full, read-only or forbidden disk gives.
_ADVICE = {
    errno.ENOSPC: "the disk is full: free space there, or give the run a folder on another disk",
    errno.EDQUOT: "the disk quota is used up: free space, or give the run a folder on another disk",
    errno.EROFS: "the file system is read-only: give the run a writable folder",
    errno.EACCES: "this user may not write there: fix the permissions, or give the run another "
    "folder",
    errno.EPERM: "this user may not write there: fix the permissions, or give the run another "
    "folder",
}
_OTHER_ADVICE = "check the path, free space and permissions"

#: What ``os.open`` says when the last component turned into a link or special file after
#: :func:`require_regular_file` looked (ELOOP on Linux, EMLINK on the BSDs for O_NOFOLLOW).
_SWAPPED = (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO)


def require_regular_file(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` unless it is a regular file or absent (not a symlink, FIFO, ...).

    Raises:
        RunFolderError: ``path`` is a symlink (even to a regular file), FIFO, device, socket
            or directory.

    Examples:
        >>> require_regular_file("/no/such/file")  # absent: it will be created
        >>> require_regular_file("/")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        unitrain._errors.RunFolderError: /: is a directory, not a regular file; ...
    """
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # absent, or unreachable: opening it says what is wrong
    refusal = _refusal(path, mode)
    if refusal is not None:
        raise refusal


def _refusal(path: str | os.PathLike[str], mode: int) -> RunFolderError | None:
    """The error for a file of ``mode`` (as ``lstat`` gives it) at ``path``; None if regular."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return RunFolderError(
            f"{os.fspath(path)}: is a symlink; unitrain does not write through links, so a run "
            "cannot overwrite a file outside its folder — delete the link, or put a copy of "
            "the file it points to in its place"
        )
    kind = _KINDS.get(stat.S_IFMT(mode), "special file")
    return RunFolderError(
        f"{os.fspath(path)}: is a {kind}, not a regular file; unitrain writes a run's files "
        "only as regular files — move it away, or give the run another folder"
    )


def open_regular(path: str | os.PathLike[str], mode: Literal["w", "a", "r+", "x"]) -> BinaryIO:
    """Open ``path`` for writing in binary, refusing anything but a regular file.

    Args:
        path: the file; its last component is never followed if it is a symlink.
        mode: as the built-in ``open``: ``"w"`` creates or empties, ``"a"`` appends, ``"r+"``
            updates an existing file in place, ``"x"`` creates a new one.

    Returns:
        A buffered binary file (``BufferedRandom`` for ``"r+"``, else ``BufferedWriter``)
        in blocking mode; closing it closes the descriptor.

    Raises:
        RunFolderError: ``path`` is a symlink, FIFO, device, socket or directory.
        OSError: any other failure, untranslated (``FileExistsError`` for ``"x"``, say), so
            that a caller may act on it; :func:`raising_write_errors` reports it to a user.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     with open_regular(Path(folder) / "metrics.jsonl", "w") as handle:
        ...         handle.write(b"{}\\n")
        3
    """
    if mode != "x":  # O_EXCL refuses anything already there, links included
        require_regular_file(path)  # so a FIFO or device is not even opened
    try:
        descriptor = os.open(path, _MODES[mode][0] | _ALWAYS, 0o666)
    except OSError as error:
        if error.errno in _SWAPPED:  # replaced since the check: say by what
            require_regular_file(path)
        raise
    try:
        refusal = _refusal(path, os.fstat(descriptor).st_mode)  # swapped in since the check
        if refusal is not None:
            raise refusal
        os.set_blocking(descriptor, True)
        if mode == "w":
            os.ftruncate(descriptor, 0)
        return cast(BinaryIO, os.fdopen(descriptor, _MODES[mode][1]))
    except BaseException:
        os.close(descriptor)
        raise


def write_error(path: str | os.PathLike[str], error: OSError, doing: str) -> RunFolderError:
    """The :class:`RunFolderError` for ``error``, raised when trying to do ``doing`` at ``path``.

    Raise it ``from error``, so the OS error stays on it as ``__cause__``.

    Examples:
        >>> full = OSError(errno.ENOSPC, "No space left on device")
        >>> print(write_error("out/metrics.jsonl", full, "write the epoch's metrics"))
        out/metrics.jsonl: cannot write the epoch's metrics: [Errno 28] No space left on \
device; the disk is full: free space there, or give the run a folder on another disk
    """
    reason = f"[Errno {error.errno}] {error.strerror}" if error.strerror else str(error)
    advice = _ADVICE.get(error.errno or 0, _OTHER_ADVICE)
    return RunFolderError(f"{os.fspath(path)}: cannot {doing}: {reason}; {advice}")


@contextlib.contextmanager
def raising_write_errors(path: str | os.PathLike[str], doing: str) -> Iterator[None]:
    """Turn an ``OSError`` raised in the block into :func:`write_error`'s RunFolderError.

    Examples:
        >>> with raising_write_errors("out", "write a file"):  # doctest: +ELLIPSIS
        ...     raise OSError(errno.EROFS, "Read-only file system")
        Traceback (most recent call last):
        unitrain._errors.RunFolderError: out: cannot write a file: [Errno 30] Read-only ...
    """
    try:
        yield
    except OSError as error:
        raise write_error(path, error, doing) from error


def probe_writable(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` if needed and check that a file can be written in it.

    A hidden file is created, written (one block), fsynced and deleted, so a read-only,
    forbidden or full folder is found before training rather than at its first write. Full
    is caught where the file system reports it when a block is allocated, as the common ones
    do; a disk that fills up later is still reported by the writer then.

    Raises:
        RunFolderError: ``directory`` is not a folder, or cannot be created or written there;
            the message says why (read-only, no permission, full) and what to do.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     probe_writable(Path(folder) / "run" / "tensorboard")
    """
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError as error:  # a file (or a link to one) where the folder should be
        raise RunFolderError(
            f"{folder}: is not a folder; unitrain writes a run's files into a folder — move "
            "that file away, or give the run another folder"
        ) from error
    except OSError as error:
        raise write_error(folder, error, "create the folder") from error
    probe = folder / f".unitrain-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with (
            raising_write_errors(folder, "write files in this folder"),
            open_regular(probe, "x") as handle,
        ):
            handle.write(bytes(4096))
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
