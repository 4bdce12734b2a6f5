"""The safetensors layout, written and parsed here so that tensors stream to and from disk.

safetensors' own Python API builds a whole file as one ``bytes`` object before it is written,
and reads one back before parsing it: for a 403 MB model that copy cost more than the write
itself. Here the header is built by hand and each array's memory is written as it is, and on
load each tensor is read straight into a preallocated array, so the bytes are copied once and
can be digested chunk by chunk on the way (see :mod:`unitrain.checkpoint._digest`).

The layout (https://github.com/huggingface/safetensors#format): an unsigned 64-bit
little-endian header length ``N``; ``N`` bytes of UTF-8 JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that follows the
header), with an optional ``"__metadata__"`` map of str to str, padded with spaces so the
data starts 8-byte aligned; then the tensors' bytes, little-endian and C-ordered, with no gaps
or overlaps. The files written load with ``safetensors.numpy.load_file``, and the parser
reads files written by ``safetensors.numpy.save`` (checkpoints of earlier unitrain versions)
with the checks of safetensors' own reader, plus unitrain's rules for names.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from unitrain._errors import CheckpointError
from unitrain.checkpoint._format import (
    check_tensor_name,
    reject_duplicate_keys,
    to_storable_array,
)

__all__ = ["MAX_HEADER_BYTES", "TensorSource", "encode_tensor_file", "read_tensor_file"]

#: safetensors' own limit on the JSON header; a larger one is refused before it is read.
MAX_HEADER_BYTES = 100_000_000

#: safetensors' dtype codes for the numpy dtypes a checkpoint stores (SUPPORTED_DTYPES).
_CODES = {
    "bool": "BOOL",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
}
_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in _CODES.items()}


class TensorSource(Protocol):
    """A file being read front to back (see ``unitrain.checkpoint._read``)."""

    def read_exact(self, count: int) -> bytes:
        """Returns the next ``count`` bytes, or raises CheckpointError if the file ends first."""
        ...

    def read_into(self, view: memoryview) -> None:
        """Fills ``view`` with the next bytes, or raises CheckpointError if the file ends first."""
        ...


class _Entry(NamedTuple):
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    begin: int
    end: int


def encode_tensor_file(state: Mapping[str, Any], where: str) -> list[memoryview]:
    """Lays out ``state`` as a safetensors file, as buffers to write one after another.

    Every entry is validated first (names, numpy arrays of a storable dtype). Arrays are made
    C-contiguous and little-endian only where they are not already; otherwise the buffers are
    views of the arrays' own memory, which must not change until the file is written.

    Args:
        state: tensor names mapped to numpy arrays.
        where: what is being saved, for messages.

    Returns:
        The header (length prefix, JSON, padding), then each array's bytes.

    Examples:
        >>> import numpy as np
        >>> header, data = encode_tensor_file({"w": np.zeros(2, np.float32)}, "example")
        >>> bytes(header[8:]), data.nbytes
        (b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  ', 8)
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{where}: expected a mapping of names to numpy arrays, got {type(state).__name__}"
        )
    arrays = {}
    for name, value in state.items():
        array = to_storable_array(check_tensor_name(name, where), value, where)
        arrays[name] = array.astype(array.dtype.newbyteorder("<"), copy=False)
    # Widest items first, as safetensors does: with the data 8-byte aligned, every tensor then
    # starts at a multiple of its item size, so readers can map it in place.
    order = sorted(arrays, key=lambda name: (-arrays[name].dtype.itemsize, name))
    header: dict[str, Any] = {}
    offset = 0
    for name in order:
        array = arrays[name]
        begin, offset = offset, offset + array.nbytes
        header[name] = {
            "dtype": _CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [begin, offset],
        }
    try:
        encoded = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CheckpointError(
            f"{where}: a tensor name is not valid Unicode ({exc}); rename the tensor"
        ) from None
    encoded += b" " * (-len(encoded) % 8)
    buffers = [memoryview(struct.pack("<Q", len(encoded)) + encoded)]
    buffers += [arrays[name].reshape(-1).view(np.uint8).data for name in order]
    return buffers


def read_tensor_file(source: TensorSource, size: int, file: Path) -> dict[str, np.ndarray]:
    """Reads a whole safetensors file of ``size`` bytes from ``source`` into new arrays.

    The header is checked before any tensor is allocated: its length within
    :data:`MAX_HEADER_BYTES` and the file, valid JSON, known dtypes, allowed names, and
    offsets that tile the data exactly with each tensor's size. So memory stays within the
    file's size, and every byte of the file is read exactly once, in order.

    Args:
        source: the file, positioned at its start.
        size: the file's size in bytes.
        file: its path, for messages.

    Returns:
        The tensors by name, as writable native-byte-order arrays, in file order.

    Raises:
        CheckpointError: the file is not a readable safetensors file or names a tensor in a
            way unitrain refuses.
    """
    if size < 8:
        raise _unreadable(file, "header too small")
    (length,) = struct.unpack("<Q", source.read_exact(8))
    if length > MAX_HEADER_BYTES:
        raise _unreadable(file, "header too large")
    if 8 + length > size:
        raise _unreadable(file, "invalid header length")
    entries = _parse_header(source.read_exact(length), size - 8 - length, file)
    tensors: dict[str, np.ndarray] = {}
    for entry in entries:
        try:
            array = np.empty(entry.shape, entry.dtype)
        except (ValueError, OverflowError) as exc:  # dimensions numpy cannot index
            reason = f"tensor {entry.name!r} has shape {entry.shape}: {exc}"
            raise _unreadable(file, reason) from None
        if array.nbytes:
            source.read_into(array.reshape(-1).view(np.uint8).data)
        if sys.byteorder != "little":
            array = array.astype(array.dtype.newbyteorder("="))
        tensors[entry.name] = array
    return tensors


def _parse_header(data: bytes, data_size: int, file: Path) -> list[_Entry]:
    """Checks a header against the ``data_size`` bytes after it; returns entries by offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _unreadable(file, f"header is not UTF-8: {exc}") from None
    if not text.startswith("{"):
        raise _unreadable(file, "header does not start with '{'")
    try:
        header = json.loads(text, object_pairs_hook=reject_duplicate_keys)
    except RecursionError:
        raise _unreadable(file, "header is nested too deeply") from None
    except ValueError as exc:
        raise _unreadable(file, f"header is not valid JSON: {exc}") from None
    # It starts with "{", so it is a JSON object.
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise _unreadable(file, "'__metadata__' must map str to str")
    entries = [_parse_entry(name, info, file) for name, info in header.items()]
    entries.sort(key=lambda entry: (entry.begin, entry.end))
    position = 0
    for entry in entries:
        if entry.begin != position:
            raise _unreadable(file, f"invalid offsets for tensor {entry.name!r}")
        position = entry.end
    if position != data_size:
        raise _unreadable(
            file, f"tensors cover {position} bytes of data, but the file holds {data_size}"
        )
    return entries


def _parse_entry(name: str, info: object, file: Path) -> _Entry:
    check_tensor_name(name, str(file))
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _unreadable(
            file, f"tensor {name!r} must have exactly 'dtype', 'shape' and 'data_offsets'"
        )
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in _DTYPES:
        raise _unreadable(
            file,
            f"tensor {name!r} has dtype {code!r}, which a checkpoint does not store; expected "
            f"one of {', '.join(sorted(_DTYPES))}",
        )
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise _unreadable(file, f"tensor {name!r} has shape {shape!r:.80}, not a list of ints")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise _unreadable(file, f"tensor {name!r} has data_offsets {offsets!r:.80}")
    begin, end = offsets
    dtype = _DTYPES[code]
    if end < begin or end - begin != math.prod(shape) * dtype.itemsize:
        raise _unreadable(
            file, f"tensor {name!r}: data_offsets {offsets} do not fit shape {shape} of {code}"
        )
    return _Entry(name, dtype, tuple(shape), begin, end)


def _is_count(value: object) -> bool:
    # bool is a subclass of int, so compare the exact type.
    return type(value) is int and value >= 0


def _unreadable(file: Path, reason: str) -> CheckpointError:
    return CheckpointError(
        f"{file}: not a readable safetensors file ({reason}); it is damaged or was not "
        "written by unitrain — use an earlier checkpoint"
    )
