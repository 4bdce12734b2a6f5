"""The on-disk format of a checkpoint: file names, limits, and the checks both sides share.

Writer and reader call the same validators, so the writer never produces a checkpoint that the
reader would refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from unitrain._errors import CheckpointError
from unitrain.checkpoint._digest import DIGEST_HEX_DIGITS, DIGEST_PATTERNS, SHA256, XXH3_64

#: Version of the layout described in this module; bumped on any incompatible change.
#: Version 2 records XXH3-64 digests in the manifest where version 1 recorded SHA-256; both
#: are read (see :mod:`unitrain.checkpoint._digest` for why).
FORMAT_VERSION = 2
#: The manifest's version for a sharded checkpoint (:mod:`unitrain.checkpoint._shards`): as
#: version 2, plus ``shards.json`` and one file per worker and kind. An unsharded checkpoint
#: stays at version 2, so unitrain versions that predate sharding still read it.
SHARDED_FORMAT_VERSION = 3
#: The digest a manifest of each format version records.
MANIFEST_DIGESTS = {1: SHA256, 2: XXH3_64, 3: XXH3_64}

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
#: Arrays that callbacks keep in their state (early stopping's best weights), by dotted name.
CALLBACKS_FILE = "callbacks.safetensors"
TRAINER_FILE = "trainer.json"
MANIFEST_FILE = "manifest.json"
#: The files the manifest covers, in the order they are written (the manifest comes last).
DATA_FILES = (MODEL_FILE, OPTIMIZER_FILE, CALLBACKS_FILE, TRAINER_FILE)
ALL_FILES = frozenset((*DATA_FILES, MANIFEST_FILE))
#: A sharded checkpoint's layout: which rows of which tensor each worker's file holds.
SHARDS_FILE = "shards.json"
_SHARD_FILE = re.compile(r"(?:model|optimizer)-\d{5}-of-\d{5}\.safetensors")


def is_shard_file(name: str) -> bool:
    """Whether ``name`` is a worker's shard file (``model-00001-of-00004.safetensors``)."""
    return _SHARD_FILE.fullmatch(name) is not None


def is_checkpoint_file(name: str) -> bool:
    """Whether a file of this name belongs in a checkpoint directory (sharded or not)."""
    return name in ALL_FILES or name == SHARDS_FILE or is_shard_file(name)


#: JSON files above this size are refused before they are read, so a damaged or hostile file
#: cannot exhaust memory. Metric histories and RNG states are far smaller.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: Deepest nesting accepted in trainer.json; deeper data is refused on write and on read.
MAX_JSON_DEPTH = 64

#: numpy dtypes that safetensors' numpy API stores and restores exactly.
SUPPORTED_DTYPES = frozenset(
    {
        *("bool", "int8", "int16", "int32", "int64"),
        *("uint8", "uint16", "uint32", "uint64"),
        *("float16", "float32", "float64", "complex64"),
    }
)


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped or a leftover could not be cleaned up; the run goes on."""


class FileDigest(NamedTuple):
    """What a manifest records of one file: its digest and size.

    Attributes:
        algorithm: ``"xxh3_64"`` (format version 2) or ``"sha256"`` (version 1).
        digest: the lowercase hex digest of the file's bytes.
        size: the file's size in bytes.
    """

    algorithm: str
    digest: str
    size: int


def check_tensor_name(name: object, where: str) -> str:
    """Returns ``name`` if it can name a tensor in a checkpoint, else raises CheckpointError.

    Names are refused when they are empty or contain ``/``, ``\\``, ``..`` or a NUL byte, so a
    tool that maps tensor names to file names can never be steered outside a directory.
    """
    if not isinstance(name, str):
        raise CheckpointError(f"{where}: tensor names must be str, got {name!r}")
    if not name or "/" in name or "\\" in name or ".." in name or "\0" in name:
        raise CheckpointError(
            f"{where}: tensor name {name!r} is not allowed: names must be non-empty and free "
            "of '/', '\\', '..' and NUL; rename the tensor (e.g. join path parts with '.')"
        )
    if name == "__metadata__":
        raise CheckpointError(
            f"{where}: tensor name '__metadata__' is not allowed: safetensors reserves it for "
            "the file's metadata; rename the tensor"
        )
    return name


def to_storable_array(name: str, value: object, where: str) -> np.ndarray:
    """Converts one state entry to a C-contiguous numpy array that safetensors can store."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise CheckpointError(
            f"{where}: {name!r} is a {type(value).__name__}, not a numpy array; convert "
            "framework tensors to host numpy arrays before saving"
        )
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    array = np.require(np.asarray(value), requirements="C")
    if array.dtype.name not in SUPPORTED_DTYPES:
        raise CheckpointError(
            f"{where}: {name!r} has dtype {array.dtype}, which a checkpoint cannot store; "
            f"use one of {', '.join(sorted(SUPPORTED_DTYPES))}"
        )
    return array


def check_json_value(value: Any, where: str) -> None:
    """Raises CheckpointError unless ``value`` round-trips through JSON as the same data.

    Dict keys must be strings (``json`` would silently turn ``1`` into ``"1"``) and nesting
    must stay within :data:`MAX_JSON_DEPTH`. Tuples are accepted and come back as lists.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
            bad = [key for key in item if not isinstance(key, str)]
            if bad:
                raise CheckpointError(
                    f"{where}: JSON object keys must be str, got {bad[0]!r}; convert keys "
                    "to strings before saving"
                )
        elif isinstance(item, (list, tuple)):
            children = list(item)
        elif item is None or isinstance(item, (str, int, float)):
            continue
        else:
            raise CheckpointError(
                f"{where}: {type(item).__name__} value {item!r:.80} is not JSON data; use "
                "dict, list, str, int, float, bool or None (e.g. call .item() on numpy scalars)"
            )
        if depth >= MAX_JSON_DEPTH:
            raise CheckpointError(
                f"{where}: data is nested deeper than {MAX_JSON_DEPTH} levels; flatten it"
            )
        stack.extend((child, depth + 1) for child in children)


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads` that refuses a key given twice."""
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key in JSON object")
    return result


def decode_json(data: bytes, file: Path) -> Any:
    """Parses a checkpoint JSON file; ``NaN`` and ``Infinity`` tokens are accepted."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=reject_duplicate_keys)
    except RecursionError:
        raise CheckpointError(
            f"{file}: JSON is nested too deeply to read; the file is damaged or was not "
            "written by unitrain — use an earlier checkpoint"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"{file}: not valid JSON ({exc}); the file is damaged or truncated — use an "
            "earlier checkpoint"
        ) from exc


def check_format_version(value: object, file: Path | str, newest: int = FORMAT_VERSION) -> None:
    """Raises CheckpointError unless ``value`` is a format version (up to ``newest``) this
    unitrain can read."""
    if type(value) is not int or value < 1:
        raise CheckpointError(
            f"{file}: 'format_version' must be a positive int, got {value!r}; the file is "
            "damaged or was not written by unitrain"
        )
    if value > newest:
        raise CheckpointError(
            f"{file}: checkpoint format version {value} is newer than this unitrain reads "
            f"(up to {newest}); upgrade unitrain to load it"
        )


def check_trainer_state(state: object, file: Path | str) -> dict[str, Any]:
    """Checks trainer.json content: an object with int ``step``/``epoch`` >= 0 and a version.

    Returns:
        The state, as a dict.
    """
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{file}: must hold a JSON object, got {type(state).__name__}; the file is "
            "damaged or was not written by unitrain"
        )
    for key in ("step", "epoch"):
        value = state.get(key)
        # bool is a subclass of int, so compare the exact type.
        if type(value) is not int or value < 0:
            raise CheckpointError(
                f"{file}: {key!r} must be an int >= 0, got {value!r}; the trainer state is "
                "damaged or incomplete"
            )
    check_format_version(state.get("format_version"), file)
    return state


def encode_trainer_state(trainer: Mapping[str, Any], where: str) -> bytes:
    """Serialises the caller's trainer state with ``format_version`` added.

    Non-finite floats are written as the ``NaN``/``Infinity``/``-Infinity`` tokens that
    Python's ``json`` reads back; they are not strict JSON, which keeps metric histories that
    contain a NaN loss exact instead of silently turning them into strings.
    """
    if not isinstance(trainer, Mapping):
        raise CheckpointError(f"{where}: trainer state must be a mapping, got {trainer!r:.80}")
    state = dict(trainer)
    state.setdefault("format_version", FORMAT_VERSION)
    if state["format_version"] != FORMAT_VERSION or type(state["format_version"]) is not int:
        raise CheckpointError(
            f"{where}: trainer state has format_version {state['format_version']!r}; leave "
            f"the key out (this writer sets it to {FORMAT_VERSION})"
        )
    check_trainer_state(state, where)
    check_json_value(state, where)
    try:
        data = json.dumps(state, indent=2, allow_nan=True).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where}: trainer state is not JSON-serialisable: {exc}") from exc
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError(
            f"{where}: trainer state is {len(data)} bytes as JSON, over the {MAX_JSON_BYTES} "
            "byte limit; keep large arrays in the model or optimizer state instead"
        )
    return data


def encode_manifest(files: Mapping[str, FileDigest]) -> bytes:
    """Serialises a manifest in its one canonical form (sorted keys, 2-space indent).

    The format version written is the one whose digest the entries hold: 2 for XXH3-64, which
    every new checkpoint uses, and 1 for SHA-256, so that old manifests re-encode to their own
    bytes when :func:`parse_manifest` checks their form; 3 where shard files are listed.

    Args:
        files: maps each data file name to its :class:`FileDigest`; all of one algorithm.
    """
    algorithms = {entry.algorithm for entry in files.values()} or {XXH3_64}
    versions = [v for v, algorithm in MANIFEST_DIGESTS.items() if {algorithm} == algorithms]
    if set(files) - set(DATA_FILES):
        versions = [v for v in versions if v == SHARDED_FORMAT_VERSION]
    else:
        versions = [v for v in versions if v != SHARDED_FORMAT_VERSION]
    if not versions:
        raise ValueError(f"a manifest holds digests of one algorithm, got {sorted(algorithms)}")
    manifest = {
        "files": {
            name: {entry.algorithm: entry.digest, "size": entry.size}
            for name, entry in files.items()
        },
        "format_version": versions[0],
    }
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("ascii")


def parse_manifest(data: bytes, file: Path) -> dict[str, FileDigest]:
    """Validates manifest bytes and returns ``{file name: FileDigest}``.

    The manifest is the one file no digest covers, so it must also be byte-for-byte in the
    canonical form :func:`encode_manifest` writes: any edit, even to whitespace, is refused.
    Its format version says which digest its entries hold (:data:`MANIFEST_DIGESTS`).
    """
    manifest = decode_json(data, file)
    if not isinstance(manifest, dict) or set(manifest) != {"files", "format_version"}:
        raise CheckpointError(
            f"{file}: must be a JSON object with exactly 'files' and 'format_version'; the "
            "manifest is damaged — use an earlier checkpoint"
        )
    version = manifest["format_version"]
    check_format_version(version, file, newest=SHARDED_FORMAT_VERSION)
    algorithm = MANIFEST_DIGESTS[version]
    width = DIGEST_HEX_DIGITS[algorithm]
    entries = manifest["files"]
    if not isinstance(entries, dict) or not _lists_the_files(set(entries), version):
        listed = sorted(entries) if isinstance(entries, dict) else entries
        shards = f", {SHARDS_FILE} and the workers' shard files" if version == 3 else ""
        raise CheckpointError(
            f"{file}: 'files' must list exactly {sorted(DATA_FILES)}{shards}, got "
            f"{listed!r:.200}; the manifest is damaged — use an earlier checkpoint"
        )
    result: dict[str, FileDigest] = {}
    for name, entry in entries.items():
        digest = entry.get(algorithm) if isinstance(entry, dict) else None
        size = entry.get("size") if isinstance(entry, dict) else None
        valid = isinstance(entry, dict) and set(entry) == {algorithm, "size"}
        valid = valid and isinstance(digest, str)
        valid = valid and DIGEST_PATTERNS[algorithm].fullmatch(str(digest)) is not None
        if not valid or type(size) is not int or size < 0:
            raise CheckpointError(
                f"{file}: entry for {name!r} must be {{{algorithm!r}: {width} lowercase hex "
                f"digits, 'size': int >= 0}}, got {entry!r:.200}; the manifest is damaged"
            )
        assert isinstance(digest, str) and isinstance(size, int)  # for mypy
        result[name] = FileDigest(algorithm, digest, size)
    if encode_manifest(result) != data:
        raise CheckpointError(
            f"{file}: manifest is not in the canonical form unitrain writes; it was edited "
            "after saving — use an earlier checkpoint"
        )
    return result


def _lists_the_files(names: set[str], version: int) -> bool:
    """Whether a manifest of ``version`` lists the files such a checkpoint holds (which shard
    files a sharded one holds, ``shards.json`` says: the reader checks that against it)."""
    if version != SHARDED_FORMAT_VERSION:
        return names == set(DATA_FILES)
    rest = names - set(DATA_FILES) - {SHARDS_FILE}
    return set(DATA_FILES) | {SHARDS_FILE} <= names and all(is_shard_file(n) for n in rest)
