"""A lock file that keeps two runs from writing checkpoints into one directory at once.

Two runs pointed at the same checkpoint directory would prune each other's checkpoints and
resume from each other's states. :class:`RunLock` prevents that with a lock file,
``.unitrain.lock``, holding the owner's pid, host name and process start time as JSON. It is
written under a temporary name (``O_CREAT | O_EXCL``) and hard-linked to its real name, which
fails if a lock is there (atomic on local file systems and on NFS v3 and later), so a lock
file is always complete. Checkpoint readers ignore it, as they ignore every hidden name.

A lock whose owner is gone is *stale* and is taken over, so a run killed by SIGKILL or a
power cut never blocks the next one. A lock is stale when it was written on this host and

- its pid is not running, or
- its pid is running but started at another time than the owner did (the pid was reused), or
- its pid is this process's own but this process does not hold it (a restarted container
  often gets the same pid as the run it replaces).

Taking over renames the stale file to a unique name first and checks that the file it
renamed is the one it judged stale, so two runs that find the same stale lock cannot both
take it. A lock written on another host cannot be checked and is never taken over; the error
says which file to delete once that run is known to be dead. A directory this process may not
write to is not locked, so resuming from someone else's read-only checkpoints stays possible
(no run of this user can write there either).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from unitrain._errors import CheckpointError

__all__ = ["LOCK_NAME", "DirectoryLockedError", "RunLock", "locked", "pid_running"]

#: Name of the lock file inside a locked directory; hidden, so no checkpoint reader sees it.
LOCK_NAME = ".unitrain.lock"
#: A lock file still empty or unparsable after this many seconds is taken over (it can only
#: come from damage, or from a file system without hard links where a run died between
#: creating and writing it); younger ones may be in the middle of being written.
UNREADABLE_GRACE_SECONDS = 10.0

#: Lock files held by this process, by resolved path: a second Trainer of the same process is
#: refused too, and a lock naming this pid that is *not* here is stale.
_HELD: set[str] = set()


class DirectoryLockedError(CheckpointError):
    """Another run holds the lock of the checkpoint directory this run wants to write to."""


def _process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (Linux), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[19].decode("ascii")  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def pid_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (assumed so where that cannot be told)."""
    if os.name != "posix":  # os.kill(pid, 0) would send CTRL_C_EVENT on Windows: assume alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, owned by another user
        return True
    except (OverflowError, ValueError):
        return False
    return True


class RunLock:
    """The lock of one directory, taken with :meth:`acquire` and given back with :meth:`release`.

    Args:
        directory: the directory to lock; it is created if missing.

    Examples:
        >>> import tempfile
        >>> directory = tempfile.mkdtemp()
        >>> with RunLock(directory):
        ...     RunLock(directory).acquire()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._lock.DirectoryLockedError: ...
        >>> with RunLock(directory) as lock:  # released by the with block above
        ...     lock.path.name
        '.unitrain.lock'
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._content: bytes | None = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def acquire(self) -> RunLock:
        """Take the lock, taking over a stale one; raise :class:`DirectoryLockedError` if held.

        Raises:
            DirectoryLockedError: a live run holds the lock (the message names its pid and host,
                and what to do).
            CheckpointError: the directory cannot be created or written.
        """
        if self._content is not None:
            return self
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"{self.directory}: cannot create the checkpoint directory ({exc}); check the "
                "path and permissions"
            ) from exc
        key = os.path.realpath(self.path)
        for _ in range(8):  # each round either takes the lock or removes one stale file
            if key in _HELD:
                raise DirectoryLockedError(
                    f"{self.directory}: another Trainer of this process (pid {os.getpid()}) is "
                    "using this checkpoint directory; let its fit() finish, or give this run "
                    "another checkpoint_dir"
                )
            content = json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": time.time(),
                    "process_start": _process_start(os.getpid()),
                }
            ).encode()
            try:
                created = self._publish(content)
            except OSError as exc:
                if exc.errno in (errno.EROFS, errno.EACCES):
                    return self  # read-only: no run can write here, so there is nothing to guard
                raise CheckpointError(
                    f"{self.path}: cannot create the run lock ({exc}); check that the "
                    "checkpoint directory is writable and has free space"
                ) from exc
            if not created:
                self._handle_existing()
                continue
            self._content = content
            _HELD.add(key)
            _remove_leftovers(self.directory)
            return self
        raise DirectoryLockedError(
            f"{self.path}: the run lock keeps changing hands; another process is starting runs "
            "in this directory — give this run another checkpoint_dir"
        )

    def _publish(self, content: bytes) -> bool:
        """Create the lock file holding ``content``; False if a lock file is already there.

        The content goes into a new file (``O_CREAT | O_EXCL``) that is then hard-linked to the
        lock's name, which fails if that name exists. So the lock appears complete or not at
        all: a run killed between creating a lock file and writing it would otherwise leave an
        empty lock that nobody could judge (this happened in the SIGKILL harness). Where the
        file system has no hard links, the lock file itself is created with ``O_EXCL``.
        """
        temporary = self.directory / f"{LOCK_NAME}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
            try:
                os.link(temporary, self.path)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                return self._publish_in_place(content)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _publish_in_place(self, content: bytes) -> bool:
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
        return True

    def release(self) -> None:
        """Give the lock back; a lock that is no longer this run's own is left alone."""
        if self._content is None:
            return
        _HELD.discard(os.path.realpath(self.path))
        content, self._content = self._content, None
        with contextlib.suppress(OSError):
            if self.path.read_bytes() == content:
                os.unlink(self.path)

    def _handle_existing(self) -> None:
        """Take over the lock file in the way if it is stale; raise if its owner is alive."""
        try:
            content = self.path.read_bytes()
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return  # released meanwhile: try again
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read the run lock ({exc})") from exc
        owner = _parse(content)
        if owner is None:
            if age < UNREADABLE_GRACE_SECONDS:
                raise DirectoryLockedError(
                    f"{self.directory}: another run is taking the lock of this checkpoint "
                    f"directory right now ({self.path}); wait for it to finish or give this "
                    "run another checkpoint_dir"
                )
        elif not self._is_stale(owner):
            raise DirectoryLockedError(
                f"{self.directory}: the checkpoint directory is in use by another unitrain run "
                f"(pid {owner['pid']} on host {owner['host']}, started {_when(owner)}). "
                "Two runs writing one directory would delete and resume each other's "
                "checkpoints: wait for that run to finish, stop it, or give this run another "
                f"checkpoint_dir. If that run is dead, delete {self.path}."
            )
        self._remove_stale(content)

    def _is_stale(self, owner: dict[str, Any]) -> bool:
        if owner["host"] != socket.gethostname():
            return False
        pid = owner["pid"]
        if pid == os.getpid():
            return True  # not in _HELD (checked first): left by an earlier process
        if not pid_running(pid):
            return True
        recorded, actual = owner.get("process_start"), _process_start(pid)
        return recorded is not None and actual is not None and recorded != actual

    def _remove_stale(self, stale: bytes) -> None:
        """Move the stale lock aside; put it back if another run replaced it meanwhile."""
        aside = self.directory / f"{LOCK_NAME}.stale-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another run removed it first
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot remove a stale run lock ({exc})") from exc
        try:
            if aside.read_bytes() != stale:  # a live run's fresh lock: give it back
                # link, unlike rename, never replaces a lock a third run took meanwhile.
                with contextlib.suppress(OSError):
                    os.link(aside, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(aside)


def _remove_leftovers(directory: Path) -> None:
    """Delete temporary and set-aside lock files that a killed run left behind.

    They live for microseconds in a run that is not killed, so one older than the grace
    period is a leftover.
    """
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.startswith(f"{LOCK_NAME}.") and ("tmp-" in name or "stale-" in name):
                file = directory / name
                if time.time() - file.stat().st_mtime > UNREADABLE_GRACE_SECONDS:
                    file.unlink()


def _parse(content: bytes) -> dict[str, Any] | None:
    """The owner recorded in a lock file, or None when the content is not a complete record."""
    try:
        owner = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if (
        not isinstance(owner, dict)
        or type(owner.get("pid")) is not int
        or owner["pid"] <= 0  # os.kill(0 or -n, 0) would ask about process groups
        or not isinstance(owner.get("host"), str)
        or not isinstance(owner.get("started"), (int, float))
    ):
        return None
    return owner


def _when(owner: dict[str, Any]) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
    except (OverflowError, OSError, ValueError):
        return "at an unknown time"


@contextlib.contextmanager
def locked(directories: list[Path]) -> Iterator[None]:
    """Hold the locks of ``directories`` (deduplicated) for the duration of a ``with`` block."""
    with contextlib.ExitStack() as stack:
        seen: set[str] = set()
        for directory in directories:
            key = os.path.realpath(directory)
            if key not in seen:
                seen.add(key)
                stack.enter_context(RunLock(directory))
        yield
