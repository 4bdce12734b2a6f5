"""The digests a manifest records, computed from a file's chunks as they stream.

New checkpoints record the XXH3-64 (``xxhash.xxh3_64``) of each file, as 16 lowercase hex
digits; checkpoints written before format version 2 recorded SHA-256, which is still verified
when they are loaded. ``xxhash`` (python-xxhash, ``>=3``) is a runtime dependency for this.

Why a non-cryptographic checksum and not a cryptographic hash: the manifest detects damage
(torn or interrupted writes, truncation, bit rot, a file copied from another checkpoint), it
is not a signature. Anyone who can edit a checkpoint file can edit the manifest beside it, so a
hash that resists deliberate collisions buys nothing; a checkpoint from an untrusted source
must be authenticated by other means.

Why XXH3-64: measured on one core of the 2-core machine the benchmarks run on, XXH3-64 hashes
24.5 GB/s, XXH3-128 22.3 GB/s, XXH64 18.5 GB/s, ``zlib.crc32`` 6.3 GB/s and SHA-256 about
1.8 GB/s. SHA-256 of a 403 MB model cost more than safetensors' whole save, and CRC32 of it
(0.06 s) twice as long as reading it from the page cache (0.03 s); XXH3-64 takes 0.016 s. Its
64 bits miss random damage with probability ``2**-64``, which needs no wider digest.

On load the reader hashes each chunk on its own thread right after reading it, while the
chunk is still in the CPU cache; that measured faster than handing chunks to a worker thread
(see :mod:`unitrain.checkpoint._read`). On save the digest of a large file runs on a worker
thread (``xxhash`` and ``hashlib`` release the GIL on large buffers) while ``fsync`` waits on
the disk. Both digests are chains, so one worker computes each, in order.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Protocol

import xxhash

__all__ = [
    "CHUNK_BYTES",
    "DIGEST_HEX_DIGITS",
    "DIGEST_PATTERNS",
    "SHA256",
    "XXH3_64",
    "Digest",
    "digest_hex",
]

#: The digest of format version 2 manifests, which every new checkpoint records.
XXH3_64 = "xxh3_64"
#: The digest of format version 1 manifests, read but no longer written.
SHA256 = "sha256"
#: How many lowercase hex digits a manifest writes for each digest: its full width.
DIGEST_HEX_DIGITS = {XXH3_64: 16, SHA256: 64}
DIGEST_PATTERNS = {name: re.compile(f"[0-9a-f]{{{n}}}") for name, n in DIGEST_HEX_DIGITS.items()}

#: Bytes per write call, and per digest update on save. Measured on a 403 MB model (2 cores):
#: 1, 4 and 16 MiB were within noise of each other; 4 MiB keeps each step short enough that
#: the worker is never far behind, and the number of thread hand-offs around a hundred.
CHUNK_BYTES = 4 * 1024 * 1024
#: Streams smaller than this are digested on the caller's thread: starting a thread costs more
#: than it can save on a few chunks.
_THREAD_MIN_BYTES = 4 * CHUNK_BYTES

Chunk = bytes | memoryview


class _Hasher(Protocol):
    def update(self, data: Chunk, /) -> None: ...

    def hexdigest(self) -> str: ...


def _new_hasher(algorithm: str) -> _Hasher:
    if algorithm == XXH3_64:
        return xxhash.xxh3_64()
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"unknown digest {algorithm!r}; expected {XXH3_64!r} or {SHA256!r}")


def digest_hex(algorithm: str, data: Chunk) -> str:
    """Returns the lowercase hex digest of ``data``, as a manifest records it.

    Args:
        algorithm: ``"xxh3_64"`` or ``"sha256"``.
        data: the bytes of a whole file.

    Examples:
        >>> digest_hex("xxh3_64", b"unitrain")
        'e4c2182282ff8fca'
    """
    hasher = _new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


class Digest:
    """The digest of a file fed front to back in chunks, computed beside the caller's I/O.

    With ``background`` (the default) and a stream of at least ``4 * CHUNK_BYTES``, each
    :meth:`update` hands the chunk to one worker thread, so the caller can write the next
    chunk or wait on ``fsync`` meanwhile; otherwise each chunk is digested at once. A chunk
    handed to the worker must not change until :meth:`hexdigest` has returned. Use it as a
    context manager: leaving the block stops the worker, also on an error.

    Args:
        algorithm: ``"xxh3_64"`` or ``"sha256"``.
        size: the number of bytes that will be fed, which decides whether a thread is used.
        background: whether a large stream is digested on a worker thread. A reader that
            hashes each chunk right after reading it passes ``False``: the chunk is then
            still in the CPU cache.

    Examples:
        >>> with Digest("xxh3_64", size=8) as digest:
        ...     digest.update(b"uni")
        ...     digest.update(memoryview(b"train"))
        ...     digest.hexdigest()
        'e4c2182282ff8fca'
    """

    def __init__(self, algorithm: str, size: int, *, background: bool = True) -> None:
        self.algorithm = algorithm
        self._hasher = _new_hasher(algorithm)
        self._worker = (
            ThreadPoolExecutor(1, thread_name_prefix="unitrain-digest")
            if background and size >= _THREAD_MIN_BYTES
            else None
        )
        self._queued: list[Future[None]] = []

    def update(self, chunk: Chunk) -> None:
        """Adds the next ``chunk`` of the file; see the class doc for when it may change."""
        if self._worker is None:
            self._hasher.update(chunk)
        else:  # a chain: with one worker, the updates run in the order queued
            self._queued.append(self._worker.submit(self._hasher.update, chunk))

    def hexdigest(self) -> str:
        """Waits for the queued chunks and returns the lowercase hex digest of all of them."""
        for update in self._queued:
            update.result()  # re-raises what an update raised
        self._queued.clear()
        return self._hasher.hexdigest()

    def close(self) -> None:
        """Stops the worker, dropping chunks not yet started (the digest is then unusable)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Digest:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
