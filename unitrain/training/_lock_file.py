"""The run lock's file on disk: its owner record, read and created without following links,
and what the record says of its owner (gone, or when another host's lock goes stale).

:mod:`unitrain.training._lock` decides who holds a directory; this module only touches the file. Its
name is never followed and never waited on: it is opened with ``O_NOFOLLOW | O_NONBLOCK``, only
as a regular file, and read up to ``MAX_LOCK_BYTES``, so a FIFO cannot hang a run and a
symlink to ``/dev/zero`` cannot fill its memory. New files are created with ``O_EXCL``, which
fails on any name that exists, a symlink included.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_LOCK_BYTES",
    "NotALockFile",
    "heartbeat_news",
    "is_stale",
    "open_lock",
    "owner_of",
    "pid_running",
    "process_start",
    "publish",
    "read_lock",
    "remove_lock_leftovers",
    "started_at",
]

#: A lock file is a short JSON record; reading stops here, so a huge file cannot fill memory.
MAX_LOCK_BYTES = 4096
#: Create a new file, never through a symlink, never inherited by a child process.
_CREATE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_KINDS = {
    stat.S_IFLNK: "symbolic link",
    stat.S_IFIFO: "FIFO",
    stat.S_IFDIR: "directory",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


class NotALockFile(Exception):
    """Something other than a regular file has the lock's name; the message says to remove it.

    Not an OSError, so that no handler of I/O errors mistakes it for a passing one.
    """


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = _KINDS.get(stat.S_IFMT(mode), "special file")
    raise NotALockFile(
        f"{path} is a {kind}, not a unitrain run lock; unitrain neither follows nor reads nor "
        f"replaces it. Unless a run of yours needs it there, remove {path} and start again."
    )


def open_lock(path: Path) -> int:
    """A read-only descriptor of the regular file ``path``, opened without following or blocking.

    Raises:
        FileNotFoundError: nothing is at ``path`` (or its directory is gone).
        NotALockFile: something other than a regular file is there.
        OSError: it cannot be opened.
    """
    # lstat first: opening a device can have effects (a tape rewinds), so only files are opened.
    _refuse_unless_regular(path, os.lstat(path).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink since lstat
            _refuse_unless_regular(path, stat.S_IFLNK)
        raise
    try:
        _refuse_unless_regular(path, os.fstat(descriptor).st_mode)  # replaced since lstat
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def read_lock(path: Path) -> tuple[bytes, float]:
    """The first ``MAX_LOCK_BYTES + 1`` bytes of the lock file ``path``, and its mtime.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        NotALockFile: something other than a regular file is there.
        OSError: it cannot be read.
    """
    descriptor = open_lock(path)
    try:
        return os.read(descriptor, MAX_LOCK_BYTES + 1), os.fstat(descriptor).st_mtime
    finally:
        os.close(descriptor)


def publish(path: Path, content: bytes) -> bool:
    """Create the lock file ``path`` holding ``content``; False if a file of that name exists.

    The content goes into a new file (``O_CREAT | O_EXCL``) that is then hard-linked to the
    lock's name, which fails if that name exists. So the lock appears complete or not at all:
    a run killed between creating a lock file and writing it would otherwise leave an empty
    lock that nobody could judge (this happened in the SIGKILL harness). Where the file system
    has no hard links, the lock file itself is created with ``O_EXCL``.

    Raises:
        OSError: the file cannot be created (read-only, full, no permission).
    """
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    descriptor = os.open(temporary, _CREATE_FLAGS, 0o644)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
        try:
            os.link(temporary, path)  # link(2) never follows its target
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            return _publish_in_place(path, content)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _publish_in_place(path: Path, content: bytes) -> bool:
    try:
        descriptor = os.open(path, _CREATE_FLAGS, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
    return True


def remove_lock_leftovers(path: Path, older_than: float) -> None:
    """Delete the temporary and set-aside files of the lock ``path`` that a killed run left.

    They live for microseconds in a run that is not killed, so one older than ``older_than``
    seconds is a leftover.
    """
    with contextlib.suppress(OSError):
        for name in os.listdir(path.parent):
            if name.startswith(f"{path.name}.") and ("tmp-" in name or "stale-" in name):
                file = path.parent / name
                if time.time() - os.lstat(file).st_mtime > older_than:
                    file.unlink()


def owner_of(content: bytes) -> dict[str, Any] | None:
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


def started_at(owner: dict[str, Any]) -> str:
    """When the owner of a lock started, as local time, for messages."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
    except (OverflowError, OSError, ValueError):
        return "at an unknown time"


def process_start(pid: int) -> str | None:
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


def is_stale(owner: dict[str, Any], age: float, stale: float) -> bool:
    """Whether the owner of a lock whose heartbeat is ``age`` seconds old is gone."""
    if owner["host"] != socket.gethostname():
        limit = _limit(owner, stale)
        return limit is not None and age > limit
    pid = owner["pid"]
    if pid == os.getpid():
        return True  # not held by this process (checked first): left by an earlier one
    if not pid_running(pid):
        return True
    recorded, actual = owner.get("process_start"), process_start(pid)
    return recorded is not None and actual is not None and recorded != actual


def _limit(owner: dict[str, Any], stale: float) -> float | None:
    """The heartbeat age at which another host's lock is stale; None if it never beats."""
    interval = owner.get("heartbeat")
    if not isinstance(interval, (int, float)) or not 0 < interval < math.inf:
        return None  # written before locks had a heartbeat: its age says nothing
    return max(stale, 3 * interval)


def heartbeat_news(owner: dict[str, Any], age: float, stale: float) -> str:
    """For the refusal: how old another host's heartbeat is and when its lock will be taken.

    Nothing for this host's locks, whose pid decides (and whose message the error catalogue
    documents as it was).
    """
    if owner["host"] == socket.gethostname():
        return ""
    limit = _limit(owner, stale)
    if limit is None:
        return "; it records no heartbeat, being from an older unitrain, so it is never taken over"
    shown = f"{age:.0f} s old" if age > -1 else f"dated {-age:.0f} s ahead of this host's clock"
    return (
        f"; its heartbeat is {shown}, and a lock from another host is taken over once its "
        f"heartbeat is {limit:g} s old: in {max(limit - age, 0):.0f} s if that run has stopped, "
        "provided the hosts' clocks agree"
    )
