"""A lock file that keeps two runs from writing checkpoints into one directory at once.

Two runs pointed at the same checkpoint directory would prune each other's checkpoints and
resume from each other's states. :class:`RunLock` prevents that with a lock file,
``.unitrain.lock``, holding the owner's pid, host name, process start time and heartbeat
interval as JSON. It is written under a temporary name (``O_CREAT | O_EXCL``) and hard-linked
to its real name, which fails if a lock is there (atomic on local file systems and on NFS v3
and later), so a lock file is always complete. Checkpoint readers ignore it, as they ignore
every hidden name.

While the lock is held, a daemon thread touches the lock file's mtime every
``HEARTBEAT_SECONDS`` (10 s, or ``UNITRAIN_LOCK_HEARTBEAT_SECONDS``): a heartbeat that costs no
rewrite. A lock whose owner is gone is *stale* and is taken over, so a run killed by SIGKILL,
a power cut or a pod rescheduled under a new host name never blocks the next one. On this host
the pid decides, whatever the heartbeat (a live process that stopped beating is stuck, not
dead): the lock is stale when

- its pid is not running, or
- its pid is running but started at another time than the owner did (the pid was reused), or
- its pid is this process's own but this process does not hold it (a restarted container
  often gets the same pid as the run it replaces).

A lock from another host is stale when its heartbeat is older than ``STALE_SECONDS`` (60 s, or
six heartbeats where longer; ``UNITRAIN_LOCK_STALE_SECONDS``) and than three beats of the
interval its owner recorded; till then the refusal says how old the heartbeat is and in how
many seconds the lock goes. The age is this host's clock minus the file's mtime, which NFS
takes from the server's clock: the hosts' clocks must roughly agree (NTP), since a clock ahead
by more than the limit would take live locks. Each look opens the file anew, so NFS fetches
fresh attributes (close-to-open). A lock that records no heartbeat (from a unitrain before it)
is never taken over from another host; the error says which file to delete once its run is
known to be dead.

Taking over renames the stale file to a unique name first and checks that the file it renamed is the
one it judged stale (same content, same mtime), so two runs that find the same stale lock cannot
both take it, and a heartbeat that lands meanwhile keeps the lock for its owner. The lock's name is
never followed nor waited on (:mod:`unitrain.training._lock_file`): a symlink, FIFO, device or
directory there is refused with a :class:`DirectoryLockedError` saying to remove it.

A run can lose its lock mid-run. If the lock file or its whole directory is deleted, the next
heartbeat puts both back (no other run holds the directory, so this one still may) and
:meth:`RunLock.check` warns once. If another run holds the lock by then (or took it over from
a host whose heartbeats came too late), :meth:`RunLock.check` raises: it reads a flag and does
no I/O, so the Trainer can call it before every checkpoint save and stop instead of writing
into a folder that now belongs to another run.

A directory this process may not write to is not locked, so resuming from someone else's
read-only checkpoints stays possible (no run of this user can write there either).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from unitrain._errors import CheckpointError, ConfigError
from unitrain.training._lock_file import (
    MAX_LOCK_BYTES,
    NotALockFile,
    heartbeat_news,
    is_stale,
    open_lock,
    owner_of,
    pid_running,
    publish,
    read_lock,
    remove_lock_leftovers,
    started_at,
)
from unitrain.training._lock_file import process_start as _process_start

__all__ = [
    "HEARTBEAT_SECONDS",
    "LOCK_NAME",
    "STALE_SECONDS",
    "DirectoryLockedError",
    "RunLock",
    "check_locks",
    "confirm_locks",
    "heartbeat_seconds",
    "locked",
    "pid_running",
    "stale_seconds",
]

#: Name of the lock file inside a locked directory; hidden, so no checkpoint reader sees it.
LOCK_NAME = ".unitrain.lock"
#: A lock file still empty or unparsable after this many seconds is taken over (it can only
#: come from damage, or from a file system without hard links where a run died between
#: creating and writing it); younger ones may be in the middle of being written.
UNREADABLE_GRACE_SECONDS = 10.0
#: How often a held lock's mtime is refreshed, unless ``UNITRAIN_LOCK_HEARTBEAT_SECONDS`` is set.
HEARTBEAT_SECONDS = 10.0
#: Heartbeat age at which another host's lock is taken over, unless
#: ``UNITRAIN_LOCK_STALE_SECONDS`` is set: six missed beats, so a slow NFS server or a busy
#: host does not lose its lock.
STALE_SECONDS = 60.0

#: Lock files held by this process, by resolved path: a second Trainer of the same process is
#: refused too, and a lock naming this pid that is *not* here is stale.
_HELD: set[str] = set()


class DirectoryLockedError(CheckpointError):
    """Another run holds the lock of the checkpoint directory this run wants to write to."""


def _seconds(variable: str, default: float) -> float:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{variable}={raw!r}: expected a number of seconds greater than 0 (e.g. "
            f"{variable}=10), or unset it for the default"
        )
    return value


def heartbeat_seconds() -> float:
    """How often a held lock is refreshed: ``UNITRAIN_LOCK_HEARTBEAT_SECONDS`` or 10 s.

    Raises:
        ConfigError: the environment variable is not a positive number.

    Examples:
        >>> heartbeat_seconds()
        10.0
    """
    return _seconds("UNITRAIN_LOCK_HEARTBEAT_SECONDS", HEARTBEAT_SECONDS)


def stale_seconds() -> float:
    """Heartbeat age at which another host's lock is taken over (see the module docstring).

    ``UNITRAIN_LOCK_STALE_SECONDS``, or 60 s, or six heartbeats where that is longer.

    Raises:
        ConfigError: an environment variable is not a positive number.

    Examples:
        >>> stale_seconds()
        60.0
    """
    return _seconds("UNITRAIN_LOCK_STALE_SECONDS", max(STALE_SECONDS, 6 * heartbeat_seconds()))


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
        unitrain.training._lock.DirectoryLockedError: ...
        >>> with RunLock(directory) as lock:  # released by the with block above
        ...     lock.check()  # raises only if another run took the lock meanwhile
        ...     lock.path.name
        '.unitrain.lock'
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._content: bytes | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        # Written by the heartbeat thread, read by check(): single assignments, no lock needed.
        self._lost: str | None = None
        self._recreated = False
        self._warned = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    @property
    def lost(self) -> bool:
        """Whether the heartbeat found that another run took this lock."""
        return self._lost is not None

    def acquire(self) -> RunLock:
        """Take the lock, taking over a stale one; raise :class:`DirectoryLockedError` if held.

        Raises:
            DirectoryLockedError: a live run holds the lock (the message names its pid and host,
                the age of its heartbeat where that decides, and what to do), or something
                other than a regular file has the lock's name.
            CheckpointError: the directory cannot be created or written.
            ConfigError: a ``UNITRAIN_LOCK_*_SECONDS`` variable is not a positive number.
        """
        if self._content is not None:
            return self
        interval, stale = heartbeat_seconds(), stale_seconds()
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
                    "heartbeat": interval,
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
                self._handle_existing(stale)
                continue
            self._content, self._lost, self._recreated, self._warned = content, None, False, False
            _HELD.add(key)
            remove_lock_leftovers(self.path, UNREADABLE_GRACE_SECONDS)
            self._stop.clear()
            self._heartbeat = threading.Thread(
                target=self._beat_until_released,
                args=(interval,),
                name=f"unitrain lock heartbeat {self.directory}",
                daemon=True,  # never keeps a finished program alive
            )
            self._heartbeat.start()
            return self
        raise DirectoryLockedError(
            f"{self.path}: the run lock keeps changing hands; another process is starting runs "
            "in this directory — give this run another checkpoint_dir"
        )

    def _publish(self, content: bytes) -> bool:
        return publish(self.path, content)

    def check(self) -> None:
        """Raise if this run lost its lock; cheap enough for every step (no file system access).

        It reads what the heartbeat thread found, so a loss shows within one heartbeat.

        Raises:
            DirectoryLockedError: another run took the lock (it says which) or the lock file
                was replaced by something else; this run must stop writing to the directory.

        Warns:
            CheckpointWarning: once, when the lock had vanished (its directory deleted?) and
                the heartbeat put it back.
        """
        if self._lost is not None:
            raise DirectoryLockedError(self._lost)
        if self._recreated and not self._warned:
            self._warned = True
            # Imported here: unitrain.checkpoint imports this module.
            from unitrain.checkpoint._format import CheckpointWarning

            warnings.warn(
                f"{self.path} disappeared while this run held it (was {self.directory} "
                "deleted?); the lock was re-created and this run goes on. Checkpoints it saved "
                "there before may be gone: look before relying on a resume from them.",
                CheckpointWarning,
                stacklevel=2,
            )

    def confirm(self) -> None:
        """Read the lock now and raise if another run holds it: one read, for a save about to
        put a checkpoint in place (the heartbeat's verdict, which :meth:`check` reads, can be
        up to one beat old). A lock that is gone (its folder deleted) is no other run's.

        Raises:
            DirectoryLockedError: another run holds the lock, or something else has its name.
        """
        content = self._content
        if content is None or self._lost is not None:
            self.check()
            return
        try:
            found = read_lock(self.path)[0]
        except FileNotFoundError:
            return
        except NotALockFile as error:
            self._lose(str(error))
            self.check()
            return
        if found != content:
            self._lose_to(found)
            self.check()

    def _beat_until_released(self, interval: float) -> None:
        while not self._stop.wait(interval) and self._lost is None:
            with contextlib.suppress(OSError):  # e.g. an NFS hiccup: the next beat tries again
                self._beat()

    def _beat(self) -> None:
        """Refresh this run's lock; put it back if it is gone; record it if another run has it."""
        content = self._content
        if content is None:  # released meanwhile
            return
        try:
            self._refresh(content)
            return
        except FileNotFoundError:
            pass
        except NotALockFile as error:  # someone put a symlink, FIFO, ... in its place
            self._lose(str(error))
            return
        # Gone, maybe with its folder: no run holds the directory, so this one still may.
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._publish(content):
            self._recreated = True
        else:  # another run was quicker: its lock is there now, which _refresh records
            self._refresh(content)

    def _refresh(self, content: bytes) -> None:
        """Touch the lock's mtime if it is this run's; otherwise record that it was lost."""
        descriptor = open_lock(self.path)
        try:
            found = os.read(descriptor, MAX_LOCK_BYTES + 1)
            if found == content:
                if os.utime in os.supports_fd:  # the file checked above, wherever its name goes
                    os.utime(descriptor)
                else:
                    os.utime(self.path, follow_symlinks=False)
                return
        finally:
            os.close(descriptor)
        self._lose_to(found)

    def _lose_to(self, found: bytes) -> None:
        """Record that the lock file holds ``found``, another run's lock or something else."""
        owner = owner_of(found)
        self._lose(
            "another unitrain run holds it now "
            f"(pid {owner['pid']} on host {owner['host']}, started {started_at(owner)})"
            if owner is not None
            else f"{self.path} holds something else now"
        )

    def _lose(self, what: str) -> None:
        self._lost = (
            f"{self.directory}: this run lost its lock on the checkpoint directory: {what}. "
            "Two runs writing one directory would delete and resume each other's checkpoints, "
            "so this run stops here. Let the other run finish or stop it, then resume this one, "
            "or give one of them another checkpoint_dir."
        )

    def release(self) -> None:
        """Stop the heartbeat and give the lock back; leave a lock that is no longer its own."""
        if self._content is None:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()  # a beat after the unlink below would put the lock back
            self._heartbeat = None
        _HELD.discard(os.path.realpath(self.path))
        content, self._content = self._content, None
        with contextlib.suppress(OSError, NotALockFile):
            if read_lock(self.path)[0] == content:
                os.unlink(self.path)

    def _handle_existing(self, stale: float) -> None:
        """Take over the lock file in the way if it is stale; raise if its owner is alive."""
        try:
            content, mtime = read_lock(self.path)
        except FileNotFoundError:
            return  # released meanwhile: try again
        except NotALockFile as error:
            raise DirectoryLockedError(str(error)) from None
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read the run lock ({exc})") from exc
        age = time.time() - mtime
        owner = owner_of(content)
        if owner is None:
            if age < UNREADABLE_GRACE_SECONDS:
                raise DirectoryLockedError(
                    f"{self.directory}: another run is taking the lock of this checkpoint "
                    f"directory right now ({self.path}); wait for it to finish or give this "
                    "run another checkpoint_dir"
                )
        elif not is_stale(owner, age, stale):
            raise DirectoryLockedError(
                f"{self.directory}: the checkpoint directory is in use by another unitrain run "
                f"(pid {owner['pid']} on host {owner['host']}, started {started_at(owner)}"
                f"{heartbeat_news(owner, age, stale)}). Two runs writing one directory would "
                "delete and resume each other's checkpoints: wait for that run to finish, stop "
                f"it, or give this run another checkpoint_dir. If that run is dead, delete "
                f"{self.path}."
            )
        self._remove_stale(content, mtime)

    def _remove_stale(self, stale: bytes, mtime: float) -> None:
        """Move the stale lock aside; put it back if it changed or got a heartbeat meanwhile."""
        aside = self.directory / f"{LOCK_NAME}.stale-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another run removed it first
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot remove a stale run lock ({exc})") from exc
        try:
            with contextlib.suppress(OSError, NotALockFile):
                if read_lock(aside) != (stale, mtime):  # a live run's lock: give it back
                    # link, unlike rename, never replaces a lock a third run took meanwhile.
                    os.link(aside, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(aside)


@contextlib.contextmanager
def locked(directories: Iterable[str | os.PathLike[str]]) -> Iterator[list[RunLock]]:
    """Hold the locks of ``directories`` (deduplicated) for the duration of a ``with`` block.

    Yields:
        The locks held, one per distinct directory, for :func:`check_locks`.

    Examples:
        >>> import tempfile
        >>> with locked([tempfile.mkdtemp()]) as locks:
        ...     check_locks(locks)
        ...     [lock.path.name for lock in locks]
        ['.unitrain.lock']
    """
    with contextlib.ExitStack() as stack:
        seen: set[str] = set()
        locks = []
        for directory in directories:
            key = os.path.realpath(directory)
            if key not in seen:
                seen.add(key)
                locks.append(stack.enter_context(RunLock(directory)))
        yield locks


def confirm_locks(locks: Iterable[RunLock]) -> None:
    """Raise if another run holds any of ``locks`` now (see :meth:`RunLock.confirm`).

    Raises:
        DirectoryLockedError: another run took one of the locks.
    """
    for lock in locks:
        lock.confirm()


def check_locks(locks: Iterable[RunLock]) -> None:
    """Raise if this run lost any of ``locks`` (see :meth:`RunLock.check`); no file system access.

    Raises:
        DirectoryLockedError: another run took one of the locks.
    """
    for lock in locks:
        lock.check()
