"""The digests a manifest records, computed on a worker thread while the file's bytes stream.

New checkpoints record the CRC32 (``zlib.crc32``) of each file; checkpoints written before
format version 2 recorded SHA-256, which is still verified when they are loaded.

Why CRC32 and not a cryptographic hash: the manifest detects damage (torn or interrupted
writes, truncation, bit rot, a file copied from another checkpoint), it is not a signature.
Anyone who can edit a checkpoint file can edit the manifest beside it, so a hash that resists
deliberate collisions buys nothing; a checkpoint from an untrusted source must be
authenticated by other means. SHA-256 runs at about 1.8 GB/s on a typical CPU core, which for a
400 MB model costs more than safetensors' whole save; CRC32 runs at about 6 GB/s, detects
every burst error of up to 32 bits, and misses random damage with probability ``2**-32``.

Both ``zlib.crc32`` and ``hashlib`` release the GIL on large buffers, so worker threads digest
the chunks already read while the caller reads the next (and, on save, while ``fsync`` waits
on the disk). The CRC32s of separate chunks are computed in parallel and joined with
:func:`crc32_combine`: even at 6 GB/s, CRC32 is the slowest part of a load from the page cache
(for 403 MB: reading 0.03 s, CRC32 on one core 0.06 s). SHA-256 is a chain, so one worker
computes it, in order.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "CHUNK_BYTES",
    "CRC32",
    "DIGEST_PATTERNS",
    "SHA256",
    "Digest",
    "crc32_combine",
    "digest_hex",
]

CRC32 = "crc32"
#: The digest of format version 1 manifests, read but no longer written.
SHA256 = "sha256"
#: How each digest is written in a manifest: lowercase hex of its full width.
DIGEST_PATTERNS = {CRC32: re.compile(r"[0-9a-f]{8}"), SHA256: re.compile(r"[0-9a-f]{64}")}

#: Bytes per read or write call, and per digest update. Measured on a 403 MB model (2 cores):
#: 1, 4 and 16 MiB were within noise of each other; 4 MiB keeps each step short enough that
#: the worker is never far behind, and the number of thread hand-offs around a hundred.
CHUNK_BYTES = 4 * 1024 * 1024
#: Streams smaller than this are digested on the caller's thread: starting a thread costs more
#: than it can save on a few chunks.
_THREAD_MIN_BYTES = 4 * CHUNK_BYTES
#: Most threads computing CRC32s of one stream at once; past four, reading is the bottleneck.
_MAX_CRC32_THREADS = 4

#: The CRC-32 polynomial, bit-reversed (zlib's convention).
_POLYNOMIAL = 0xEDB88320

Chunk = bytes | memoryview


class _Hasher(Protocol):
    def update(self, data: Chunk, /) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32:
    """``zlib.crc32`` behind the ``update``/``hexdigest`` interface of :mod:`hashlib`."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Chunk) -> None:
        self.value = zlib.crc32(data, self.value)

    def extend(self, crc: int, length: int) -> None:
        """Appends ``length`` bytes whose own CRC32 is ``crc``."""
        self.value = crc32_combine(self.value, crc, length)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial, both bit-reversed (zlib's ``multmodp``)."""
    product, bit = 0, 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLYNOMIAL if b & 1 else b >> 1
    return product


def _powers_of_x() -> list[int]:
    powers = [1 << 30]  # x**1, bit-reversed
    for _ in range(63):
        powers.append(_multiply(powers[-1], powers[-1]))  # x**(2**k)
    return powers


#: ``x**(2**k)`` modulo the polynomial, for k < 64.
_POWERS = _powers_of_x()


def crc32_combine(first: int, second: int, second_length: int) -> int:
    """Returns the CRC32 of two byte strings joined, from the CRC32 of each.

    zlib's ``crc32_combine``, which Python's :mod:`zlib` does not expose: appending
    ``second_length`` bytes multiplies the first CRC by ``x**(8 * second_length)``.

    Args:
        first: the CRC32 of the first bytes.
        second: the CRC32 of the bytes that follow them.
        second_length: how many bytes follow, < 2**61.

    Examples:
        >>> crc32_combine(zlib.crc32(b"uni"), zlib.crc32(b"train"), 5) == zlib.crc32(b"unitrain")
        True
    """
    shift, bits = 1 << 31, second_length * 8  # x**0
    for k in range(bits.bit_length()):
        if bits >> k & 1:
            shift = _multiply(_POWERS[k], shift)
    return _multiply(shift, first) ^ second


def _new_hasher(algorithm: str) -> _Hasher:
    if algorithm == CRC32:
        return _Crc32()
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"unknown digest {algorithm!r}; expected {CRC32!r} or {SHA256!r}")


def digest_hex(algorithm: str, data: Chunk) -> str:
    """Returns the lowercase hex digest of ``data``, as a manifest records it.

    Args:
        algorithm: ``"crc32"`` or ``"sha256"``.
        data: the bytes of a whole file.

    Examples:
        >>> digest_hex("crc32", b"unitrain")
        'efa43a09'
    """
    hasher = _new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


class Digest:
    """The digest of a file fed front to back in chunks, computed beside the caller's I/O.

    For streams of at least ``4 * CHUNK_BYTES``, each :meth:`update` hands the chunk to worker
    threads (for CRC32, up to four chunks at once; for SHA-256, one after another), so the
    caller can write or read the next chunk meanwhile; smaller streams are digested at once. A
    chunk must not change until :meth:`hexdigest` has returned. Use it as a context manager:
    leaving the block stops the workers, also on an error.

    Args:
        algorithm: ``"crc32"`` or ``"sha256"``.
        size: the number of bytes that will be fed, which decides whether threads are used.

    Examples:
        >>> with Digest("crc32", size=8) as digest:
        ...     digest.update(b"uni")
        ...     digest.update(memoryview(b"train"))
        ...     digest.hexdigest()
        'efa43a09'
    """

    def __init__(self, algorithm: str, size: int) -> None:
        self.algorithm = algorithm
        self._hasher = _new_hasher(algorithm)
        threads = min(_MAX_CRC32_THREADS, os.cpu_count() or 1) if algorithm == CRC32 else 1
        self._workers = (
            ThreadPoolExecutor(threads, thread_name_prefix="unitrain-digest")
            if size >= _THREAD_MIN_BYTES
            else None
        )
        self._queued: list[tuple[Future[Any], int]] = []

    def update(self, chunk: Chunk) -> None:
        """Adds the next ``chunk`` of the file; it must stay unchanged until the digest is read."""
        if self._workers is None:
            self._hasher.update(chunk)
        elif isinstance(self._hasher, _Crc32):
            # Each chunk's own CRC32, in any order on any worker; hexdigest() joins them.
            size = chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)
            self._queued.append((self._workers.submit(zlib.crc32, chunk), size))
        else:  # a chain: with one worker, the updates run in the order queued
            self._queued.append((self._workers.submit(self._hasher.update, chunk), 0))

    def hexdigest(self) -> str:
        """Waits for the queued chunks and returns the lowercase hex digest of all of them."""
        for update, size in self._queued:
            result = update.result()  # re-raises what an update raised
            if isinstance(self._hasher, _Crc32):
                self._hasher.extend(result, size)
        self._queued.clear()
        return self._hasher.hexdigest()

    def close(self) -> None:
        """Stops the workers, dropping chunks not yet started (the digest is then unusable)."""
        if self._workers is not None:
            self._workers.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Digest:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
