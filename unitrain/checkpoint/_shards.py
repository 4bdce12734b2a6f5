"""Sharded checkpoints: each worker's rows of the sharded tensors, in a file of its own.

A sharded run (FSDP, ZeRO-3) holds every large tensor split by rows over its ``N`` workers.
Its checkpoint is the same directory as any other, plus one file per worker and kind
(``model-00001-of-00004.safetensors``: worker 1's rows of every sharded model tensor, under
the tensor's canonical name) and ``shards.json``, which records each sharded tensor's full
shape, dtype and the rows each worker's file holds. Tensors that are not sharded stay in
``model.safetensors`` / ``optimizer.safetensors``; the manifest (format version 3) covers
every file. So no process ever holds the whole state to write it, and a reader puts the full
tensors back together row range by row range: the checkpoint loads on any number of workers,
sharded or not, and on any backend, as an unsharded one does.

``shards.json``::

    {"workers": 4,
     "model": {"model.0.weight": {"dtype": "float32", "shape": [64, 32],
                                  "rows": [[0, 16], [16, 32], [32, 48], [48, 64]]}},
     "optimizer": {...}}

``rows[k]`` is the ``[start, stop)`` range of the first axis in worker ``k``'s file; the
ranges follow one another from 0 to the full length (a worker may hold none: ``[n, n]``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import SUPPORTED_DTYPES, check_tensor_name, decode_json

__all__ = ["KINDS", "RowShard", "ShardLayout", "shard_file"]

#: The two kinds of state that are sharded, each with its files ``{kind}-RRRRR-of-NNNNN``.
KINDS = ("model", "optimizer")


class RowShard(NamedTuple):
    """This worker's rows ``[start, start + len(value))`` of a tensor whose full first axis
    has ``rows`` entries (the other axes are whole). A backend's ``local_state_dict`` gives
    its sharded tensors as these.

    Examples:
        >>> import numpy as np
        >>> piece = RowShard(np.zeros((2, 3), np.float32), start=2, rows=5)
        >>> piece.stop, piece.shape
        (4, (5, 3))
    """

    value: np.ndarray
    start: int
    rows: int

    @property
    def stop(self) -> int:
        """One past the last row held."""
        return self.start + int(self.value.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        """The full tensor's shape."""
        return (self.rows, *self.value.shape[1:])


def shard_file(kind: str, rank: int, workers: int) -> str:
    """The file worker ``rank`` of ``workers`` writes its rows of ``kind``'s tensors to.

    Examples:
        >>> shard_file("model", 1, 4)
        'model-00001-of-00004.safetensors'
    """
    return f"{kind}-{rank:05d}-of-{workers:05d}.safetensors"


class ShardLayout:
    """What ``shards.json`` records: per kind, each sharded tensor's dtype, full shape and the
    rows of each worker's file. Built by the writer from every worker's pieces
    (:meth:`from_pieces`), or read back (:meth:`parse`), which checks it whole."""

    def __init__(self, workers: int, tensors: Mapping[str, Mapping[str, dict[str, Any]]]):
        self.workers = workers
        self.tensors = {kind: dict(tensors.get(kind, {})) for kind in KINDS}

    @property
    def files(self) -> list[str]:
        """Every worker's shard files, in rank order."""
        return [shard_file(k, r, self.workers) for r in range(self.workers) for k in KINDS]

    @classmethod
    def from_pieces(cls, pieces: list[dict[str, dict[str, list[Any]]]]) -> ShardLayout:
        """The layout of what each worker wrote: ``pieces[rank][kind][name]`` is
        ``[start, stop, full_shape, dtype]`` of that worker's rows.

        Raises:
            CheckpointError: the workers disagree on a tensor (shape, dtype, which tensors
                are sharded) or their rows do not cover it once, in rank order.
        """
        tensors: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        for kind in KINDS:
            names = sorted({name for worker in pieces for name in worker.get(kind, {})})
            for name in names:
                found = [worker.get(kind, {}).get(name) for worker in pieces]
                held = [h for h in found if h is not None]
                if len(held) != len(found) or len({str(h[2:]) for h in held}) != 1:
                    raise CheckpointError(
                        f"sharded checkpoint: the workers disagree on {kind} tensor {name!r} "
                        f"({found!r:.200}); every worker must hold rows of the same tensors"
                    )
                shape, dtype = held[0][2], held[0][3]
                tensors[kind][name] = {
                    "dtype": dtype,
                    "shape": list(shape),
                    "rows": [[h[0], h[1]] for h in held],
                }
        layout = cls(len(pieces), tensors)
        bad = layout._bad_entry()
        if bad is not None:
            raise CheckpointError(
                f"sharded checkpoint: the workers' rows do not cover each tensor once, worker "
                f"after worker ({bad}); the backend's local_state_dict gives wrong rows — "
                "nothing was saved"
            )
        return layout

    def encode(self) -> bytes:
        """``shards.json``'s bytes (sorted keys, so the same layout gives the same bytes)."""
        data = {"workers": self.workers, **self.tensors}
        return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("ascii")

    @classmethod
    def parse(cls, data: bytes, file: Path) -> ShardLayout:
        """Reads ``shards.json``, refusing anything but a whole, consistent layout."""
        where = str(file)
        value = decode_json(data, file)
        if not isinstance(value, dict) or set(value) != {"workers", *KINDS}:
            raise _damaged(where, "must be an object with 'workers', 'model' and 'optimizer'")
        workers = value["workers"]
        if type(workers) is not int or not 1 <= workers <= 99_999:
            raise _damaged(where, f"'workers' must be an int in [1, 99999], got {workers!r}")
        if not all(isinstance(value[kind], dict) for kind in KINDS):
            raise _damaged(where, "'model' and 'optimizer' must be objects")
        layout = cls(workers, {kind: value[kind] for kind in KINDS})
        layout.check(where)
        return layout

    def check(self, where: str) -> None:
        """Every entry names a storable dtype and a shape, and its rows cover the first axis
        once, worker after worker."""
        bad = self._bad_entry(where)
        if bad is not None:
            raise _damaged(where, bad)

    def _bad_entry(self, where: str = "sharded checkpoint") -> str | None:
        """What is wrong with the first entry that is not valid (None: all are)."""
        for kind, entries in self.tensors.items():
            for name, entry in entries.items():
                check_tensor_name(name, where)
                if not _entry_valid(entry, self.workers):
                    return f"{kind} tensor {name!r} has a bad entry {entry!r:.200}"
        return None

    def assemble(self, kind: str) -> dict[str, np.ndarray]:
        """Empty full arrays of ``kind``'s sharded tensors, for :meth:`fill` to complete."""
        return {
            name: np.empty(entry["shape"], np.dtype(entry["dtype"]))
            for name, entry in self.tensors[kind].items()
        }

    def fill(
        self,
        full: dict[str, np.ndarray],
        kind: str,
        rank: int,
        rows: Mapping[str, np.ndarray],
        where: str,
    ) -> None:
        """Copies worker ``rank``'s file of ``kind`` (``rows``, by name) into ``full``.

        Raises:
            CheckpointError: the file holds other tensors than the layout says, or rows of
                another shape or dtype.
        """
        entries = self.tensors[kind]
        if set(rows) != set(entries):
            missing, extra = sorted(set(entries) - set(rows)), sorted(set(rows) - set(entries))
            listed = f"missing {missing}, not listed {extra}"
            raise _damaged(where, f"holds other tensors than shards.json lists ({listed})")
        for name, value in rows.items():
            start, stop = entries[name]["rows"][rank]
            target = full[name][start:stop]
            if value.shape != target.shape or value.dtype != target.dtype:
                raise _damaged(
                    where,
                    f"{name!r} holds {value.dtype}{list(value.shape)} where shards.json says "
                    f"{target.dtype}{list(target.shape)}",
                )
            target[...] = value


def _entry_valid(entry: object, workers: int) -> bool:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "rows"}:
        return False
    shape, rows, dtype = entry["shape"], entry["rows"], entry["dtype"]
    if dtype not in SUPPORTED_DTYPES or not isinstance(shape, list) or not shape:
        return False
    if not all(type(n) is int and n >= 0 for n in shape):
        return False
    if not isinstance(rows, list) or len(rows) != workers:
        return False
    position = 0
    for piece in rows:
        if not (isinstance(piece, list) and len(piece) == 2):
            return False
        if not all(type(n) is int for n in piece) or piece[0] != position or piece[1] < piece[0]:
            return False
        position = piece[1]
    return position == shape[0]


def _damaged(where: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{where}: {what}; the sharded checkpoint is damaged or was not written by unitrain — "
        "use an earlier checkpoint"
    )
