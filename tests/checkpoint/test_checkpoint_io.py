"""Tests for unitrain.checkpoint: bit-exact round trips, atomic writes, and every refusal."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unitrain import CheckpointError
from unitrain.checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointWarning,
    _digest,
    _read,
    _write,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    remove_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from unitrain.checkpoint._digest import digest_hex
from unitrain.checkpoint._format import DATA_FILES, FileDigest, encode_manifest

FILES = (
    "model.safetensors",
    "optimizer.safetensors",
    "callbacks.safetensors",
    "trainer.json",
    "manifest.json",
)


MODEL = {
    "layers.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "layers.0.bias": np.array([0.0, -0.0, np.nan, np.inf], dtype=np.float64),
    "counter": np.array(7, dtype=np.int64),
}
OPTIMIZER = {"layers.0.weight.momentum": np.full((3, 4), 0.5, dtype=np.float32)}


def _save(path: Path, step: int = 150, **overrides: Any) -> Path:
    trainer = {"step": step, "epoch": 3, "history": {"loss": [1.5, float("nan")]}}
    state: dict[str, Any] = {"model": MODEL, "optimizer": OPTIMIZER, "trainer": trainer}
    return save_checkpoint(path, **{**state, **overrides})


def _resign(checkpoint: Path) -> None:
    """Rewrites the manifest to match the files, so only the deeper checks can object."""
    files = {}
    for name in DATA_FILES:
        data = (checkpoint / name).read_bytes()
        files[name] = FileDigest("xxh3_64", digest_hex("xxh3_64", data), len(data))
    (checkpoint / "manifest.json").write_bytes(encode_manifest(files))


def _hidden_entries(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(".")]


def _assert_bit_exact(loaded: dict[str, np.ndarray], saved: dict[str, np.ndarray]) -> None:
    assert loaded.keys() == saved.keys()
    for name, array in saved.items():
        expected = np.asarray(array).astype(np.asarray(array).dtype.newbyteorder("="))
        assert (loaded[name].dtype, loaded[name].shape) == (expected.dtype, expected.shape)
        assert loaded[name].tobytes() == expected.tobytes()


def _raw_safetensors(header: dict[str, Any]) -> bytes:
    """Builds a structurally valid safetensors file by hand, for dtypes numpy cannot write."""
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    size = max(entry["data_offsets"][1] for entry in header.values())
    return struct.pack("<Q", len(encoded)) + encoded + bytes(size)


def _corrupt_at(file: Path, offset: int) -> None:
    with open(file, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x10]))


def _trainer_json(**fields: Any) -> bytes:
    return json.dumps({"step": 1, "epoch": 0, "format_version": 1, **fields}).encode()


@pytest.mark.parametrize(
    "dtype",
    [
        *("float16", "float32", "float64", "complex64"),
        *("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"),
    ],
)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4), (3, 0, 2)])
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: str, shape: tuple[int, ...]) -> None:
    raw = np.random.default_rng(0).bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    array = np.frombuffer(raw, np.uint8 if dtype == "bool" else dtype).reshape(shape)  # any bits
    array = (array % 2).astype(bool) if dtype == "bool" else array
    saved = {"x": array, "y.scalar": np.asarray(array.flat[0] if array.size else 0).astype(dtype)}
    loaded = load_checkpoint(_save(tmp_path / "c", model=saved, optimizer={}))
    _assert_bit_exact(loaded.model, saved)
    assert loaded.optimizer == {}
    # The files are plain safetensors: safetensors' own reader loads them bit-exactly.
    _assert_bit_exact(safetensors.numpy.load_file(loaded.path / "model.safetensors"), saved)
    assert safetensors.numpy.load((loaded.path / "optimizer.safetensors").read_bytes()) == {}


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    model = dict(MODEL)
    model["transposed"] = np.arange(6.0).reshape(2, 3).T  # not C-contiguous
    model["big_endian"] = np.arange(3, dtype=">f4")
    model["numpy_scalar"] = np.float32(2.5)  # type: ignore[assignment]
    trainer = {"step": 1, "epoch": 0, "schedule": ("cosine", 0.1), "loss": [float("nan")]}
    path = _save(tmp_path / "c", model=model, trainer={**trainer, "rng": {"state": 2**100}})
    loaded = load_checkpoint(path)
    assert isinstance(loaded, Checkpoint)
    assert loaded.path == path == tmp_path / "c"
    _assert_bit_exact(loaded.model, model)
    _assert_bit_exact(loaded.optimizer, OPTIMIZER)
    assert loaded.model["numpy_scalar"].shape == ()
    assert all(array.flags.writeable for array in loaded.model.values())
    assert loaded.trainer["format_version"] == FORMAT_VERSION
    assert loaded.trainer["schedule"] == ["cosine", 0.1]  # tuples come back as lists
    assert loaded.trainer["rng"] == {"state": 2**100}
    assert np.isnan(loaded.trainer["loss"][0])
    assert sorted(os.listdir(path)) == sorted(FILES)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and set(manifest["files"]) == {*DATA_FILES}
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"xxh3_64": xxhash.xxh3_64(data).hexdigest(), "size": len(data)}


def test_save_creates_parents_and_overwrites(tmp_path: Path) -> None:
    path = _save(tmp_path / "a" / "b" / "last", step=1)
    _save(path, step=2, model={"w": np.zeros(2)})
    loaded = load_checkpoint(path)
    assert (loaded.trainer["step"], list(loaded.model)) == (2, ["w"])
    assert _hidden_entries(path.parent) == []


# The safetensors layout and the digests, streamed


def test_tensor_data_is_aligned_and_ordered_as_safetensors_does(tmp_path: Path) -> None:
    model = {"b": np.zeros(3, np.int8), "a": np.ones(2), "c": np.zeros(1, np.float32)}
    data = (_save(tmp_path / "c", model=model) / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    assert length % 8 == 0 and data[8 + length - 1 : 8 + length] in (b"}", b" ")
    assert list(header) == ["a", "c", "b"]  # widest items first, then by name
    for name, entry in header.items():
        assert entry["data_offsets"][0] % np.dtype(model[name].dtype).itemsize == 0
    assert data == safetensors.numpy.save(model)  # the same bytes as safetensors writes


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("chunk", [7, 4096])
def test_files_stream_in_chunks_with_their_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, threaded: bool
) -> None:
    """Chunks that split headers and tensors, digested on the worker thread (save) or inline."""
    for module in (_read, _write):
        monkeypatch.setattr(module, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(_read, "_READ_CHUNK_BYTES", chunk)
    monkeypatch.setattr(_digest, "_THREAD_MIN_BYTES", 0 if threaded else 2**62)
    model = {**MODEL, "big": np.random.default_rng(0).random((50, 70))}
    path = _save(tmp_path / "c", model=model)
    _assert_bit_exact(load_checkpoint(path).model, model)
    manifest = json.loads((path / "manifest.json").read_text())["files"]
    data = (path / "model.safetensors").read_bytes()
    assert manifest["model.safetensors"]["xxh3_64"] == xxhash.xxh3_64(data).hexdigest()
    for offset in (20, len(data) // 2, len(data) - 1):  # in the header, a tensor, the end
        damaged = tmp_path / f"damaged-{offset}"
        shutil.copytree(path, damaged)
        _corrupt_at(damaged / "model.safetensors", offset)
        # Damage in the header is reported as damage, not as the parse error it causes.
        with pytest.raises(CheckpointError, match=r"model\.safetensors: xxh3_64 mismatch"):
            load_checkpoint(damaged)


def test_manifest_digest_is_xxh3_64_as_16_hex_digits() -> None:
    # XXH3-64 of no bytes (seed 0) is 0x2D06800538D394C2: the sanity-check value of xxHash's
    # own test suite (cli/xsum_sanity_check.c), so this pins the algorithm, not the library.
    assert digest_hex("xxh3_64", b"") == "2d06800538d394c2"
    # Big-endian and zero-padded: a digest below 2**60 still has all 16 digits.
    numbers = (str(i).encode() for i in range(10_000))
    data = next(d for d in numbers if xxhash.xxh3_64_intdigest(d) < 2**60)
    assert digest_hex("xxh3_64", data) == f"{xxhash.xxh3_64_intdigest(data):016x}"


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("algorithm", ["xxh3_64", "sha256"])
def test_digest_of_chunks_equals_the_whole(algorithm: str, background: bool) -> None:
    data = np.random.default_rng(0).bytes(5 * _digest.CHUNK_BYTES + 3)
    view = memoryview(data)
    with _digest.Digest(algorithm, len(data), background=background) as digest:
        for start in range(0, len(data), 1_000_003):  # chunks that straddle CHUNK_BYTES
            digest.update(view[start : start + 1_000_003])
        assert digest.hexdigest() == digest_hex(algorithm, data)


def test_large_tensors_round_trip_through_the_worker_thread(tmp_path: Path) -> None:
    model = {"w": np.random.default_rng(0).random((3000, 1000), dtype=np.float32)}  # 12 MB
    model["v"] = model["w"][::-1].copy()
    path = _save(tmp_path / "c", model=model)
    _assert_bit_exact(load_checkpoint(path).model, model)
    _corrupt_at(path / "model.safetensors", 20_000_000)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: xxh3_64 mismatch"):
        load_checkpoint(path)


def test_checkpoints_of_format_version_1_still_load_and_verify(tmp_path: Path) -> None:
    """Before version 2, files were written by safetensors.numpy.save and hashed with SHA-256."""
    path = tmp_path / "v1"
    path.mkdir()
    trainer = {"step": 3, "epoch": 1, "format_version": 1}
    contents = {
        "model.safetensors": safetensors.numpy.save(MODEL),
        "optimizer.safetensors": safetensors.numpy.save(OPTIMIZER),
        "callbacks.safetensors": safetensors.numpy.save({}),
        "trainer.json": json.dumps(trainer, indent=2).encode(),
    }
    files = {}
    for name, data in contents.items():
        (path / name).write_bytes(data)
        files[name] = FileDigest("sha256", hashlib.sha256(data).hexdigest(), len(data))
    manifest = encode_manifest(files)
    assert b'"format_version": 1' in manifest and b'"sha256": ' in manifest
    (path / "manifest.json").write_bytes(manifest)
    verify_checkpoint(path)
    loaded = load_checkpoint(path)
    _assert_bit_exact(loaded.model, MODEL)
    _assert_bit_exact(loaded.optimizer, OPTIMIZER)
    assert loaded.trainer == trainer
    _corrupt_at(path / "model.safetensors", 100)
    pattern = r"model\.safetensors: sha256 mismatch \(expected [0-9a-f]{64}, found [0-9a-f]{64}\)"
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(path)


def test_damage_is_reported_before_parse_errors(tmp_path: Path) -> None:
    """As when every file was checked against the manifest before any was parsed."""
    path = _save(tmp_path / "c")
    (path / "model.safetensors").write_bytes(b"not safetensors")
    _resign(path)
    _corrupt_at(path / "optimizer.safetensors", 10)
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors: xxh3_64 mismatch"):
        load_checkpoint(path)
    (path / "trainer.json").write_text("{")
    _resign(path)
    with pytest.raises(CheckpointError, match=r"trainer\.json: not valid JSON"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"trainer\.json: not valid JSON"):
        load_checkpoint(path, verify=False)


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_file_that_changes_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    path = _save(tmp_path / "c")
    real_open = _read._open_regular

    def open_then_change(file: Path) -> Any:
        opened = real_open(file)  # the size is taken here, as another process then writes
        if file.name == "model.safetensors":
            data = file.read_bytes()
            file.write_bytes(data + b"more" if change == "grow" else data[:-4])
        return opened

    monkeypatch.setattr(_read, "_open_regular", open_then_change)
    message = "grew while being read" if change == "grow" else r"size mismatch \(expected \d+"
    for verify in (True, False):
        with pytest.raises(CheckpointError, match=rf"model\.safetensors: {message}"):
            load_checkpoint(path, verify=verify)
        _save(path)


# What save refuses


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": {"w": [1.0, 2.0]}}, "not a numpy array"),
        ({"model": {"w": 1.0}}, "not a numpy array"),
        ({"model": {"w": np.array([object()])}}, "dtype object"),
        ({"model": {"w": np.array(["a"])}}, "dtype <U1"),
        ({"model": {"../w": np.zeros(1)}}, "not allowed"),
        ({"optimizer": {"a/b": np.zeros(1)}}, "not allowed"),
        ({"model": {"": np.zeros(1)}}, "not allowed"),
        ({"model": {"__metadata__": np.zeros(1)}}, "safetensors reserves it"),
        ({"callbacks": {"\udc80": np.zeros(1)}}, "not valid Unicode"),
        ({"model": {1: np.zeros(1)}}, "must be str"),
        ({"model": [np.zeros(1)]}, "expected a mapping"),
        ({"trainer": {"epoch": 0}}, "'step' must be an int"),
        ({"trainer": {"epoch": 0, "step": True}}, "'step' must be an int"),
        ({"trainer": {"epoch": -1, "step": 0}}, "'epoch' must be an int"),
        ({"trainer": {"epoch": 0, "step": 1.0}}, "'step' must be an int"),
        ({"trainer": {"epoch": 0, "step": 0, "x": {1: 2}}}, "keys must be str"),
        ({"trainer": {"epoch": 0, "step": 0, "x": np.float32(1)}}, "not JSON data"),
        ({"trainer": {"epoch": 0, "step": 0, "format_version": 1}}, "format_version"),
        ({"trainer": {"epoch": 0, "step": 0, "format_version": 3}}, "format_version"),
        ({"trainer": {"epoch": 0, "step": 0, "x": json.loads("[" * 70 + "]" * 70)}}, "deeper"),
        ({"path": ".hidden"}, r"must not be empty or start with '\.'"),
        ({"path": ".."}, r"must not be empty or start with '\.'"),
    ],
)
def test_save_refuses_unstorable_state(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        _save(tmp_path / overrides.pop("path", "c"), **overrides)
    assert os.listdir(tmp_path) == []


def test_save_refuses_to_replace_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "c"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    with pytest.raises(CheckpointError, match=r"refusing to replace.*notes\.txt"):
        _save(target)
    assert (target / "notes.txt").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        _save(tmp_path / "file")
    assert _hidden_entries(tmp_path) == []


# Failed writes leave the previous checkpoint in place


def _fail_with_enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("failing", ["fsync", "replace"])
@pytest.mark.parametrize("previous", [True, False])
def test_failed_write_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str, previous: bool
) -> None:
    path = _save(tmp_path / "last", step=1) if previous else tmp_path / "last"
    monkeypatch.setattr(os, failing, _fail_with_enospc)
    with pytest.raises(CheckpointError, match="No space left on device") as info:
        _save(path, step=2)
    assert "last" in str(info.value) and "unchanged" in str(info.value)
    monkeypatch.undo()
    assert _hidden_entries(tmp_path) == []
    if previous:
        assert load_checkpoint(path).trainer["step"] == 1
    else:
        assert os.listdir(tmp_path) == []


def test_failed_install_restores_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "last", step=1)
    real_replace = os.replace

    def replace_failing_for_staging(source: Any, target: Any) -> None:
        if ".tmp-" in os.fspath(source):
            _fail_with_enospc()
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_failing_for_staging)
    with pytest.raises(CheckpointError, match="No space left on device"):
        _save(path, step=2)
    monkeypatch.undo()
    assert load_checkpoint(path).trainer["step"] == 1
    assert _hidden_entries(tmp_path) == []


def test_write_delay_hook_and_interrupted_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setenv("UNITRAIN_CHECKPOINT_WRITE_DELAY", "0.25")
    monkeypatch.setattr(_write.time, "sleep", slept.append)
    _save(tmp_path / "c")
    assert slept == [0.25] * len(FILES)  # once after each file

    def interrupt(seconds: float) -> None:  # as if Ctrl-C arrived after the first file
        raise KeyboardInterrupt

    monkeypatch.setattr(_write.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path / "d")
    assert os.listdir(tmp_path) == ["c"]


# What load refuses


def _corrupt(path: Path, name: str, how: str) -> None:
    data = bytearray((path / name).read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x01 if how == "flip" else 0
    edited = {"truncate": data[:middle], "append": data + b" "}.get(how, data)
    (path / name).write_bytes(bytes(edited))


@pytest.mark.parametrize("how", ["truncate", "flip", "append"])
@pytest.mark.parametrize("name", DATA_FILES)
def test_load_refuses_modified_files(tmp_path: Path, name: str, how: str) -> None:
    path = _save(tmp_path / "c")
    _corrupt(path, name, how)
    expected = "xxh3_64 mismatch" if how == "flip" else "size mismatch"
    with pytest.raises(CheckpointError, match=expected) as info:
        load_checkpoint(path)
    assert name in str(info.value) and "use an earlier checkpoint" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.replace('"format_version": 2', '"format_version": 4'), "upgrade unitrain"),
        (lambda m: m.replace('"format_version": 2', '"format_version": true'), "positive int"),
        (lambda m: m.replace('"format_version": 2', '"format_version": 1'), "'sha256': 64"),
        (lambda m: m.replace("  ", "   ", 1), "canonical form"),
        (lambda m: m + "\n", "canonical form"),
        (lambda m: m[:-10], "not valid JSON"),
        (lambda m: "[]", "exactly 'files'"),
        (lambda m: m.replace('"trainer.json"', '"other.json"'), "must list exactly"),
        (lambda m: m.replace('"size": ', '"size": -', 1), "'size': int >= 0"),
        (lambda m: m.replace('"xxh3_64": "', '"xxh3_64": "A', 1), "'xxh3_64': 16 lowercase hex"),
        (lambda m: m.replace('"xxh3_64": "', '"xxh3_64": "0', 1), "'xxh3_64': 16 lowercase hex"),
        (lambda m: m.replace('"xxh3_64"', '"sha256"', 1), "'xxh3_64': 16 lowercase hex"),
        (lambda m: m.replace('"xxh3_64"', '"crc32"', 1), "'xxh3_64': 16 lowercase hex"),
        (
            lambda m: m.replace(json.loads(m)["files"]["trainer.json"]["xxh3_64"], "0" * 16),
            r"trainer\.json: xxh3_64 mismatch \(expected 0{16}, found [0-9a-f]{16}\)",
        ),
    ],
)
def test_load_refuses_bad_manifest(tmp_path: Path, edit: Any, message: str) -> None:
    path = _save(tmp_path / "c")
    manifest = path / "manifest.json"
    manifest.write_text(edit(manifest.read_text()))
    with pytest.raises(CheckpointError, match=f"{re.escape(str(path))}/.*{message}"):
        load_checkpoint(path)


@pytest.mark.parametrize("kind", ["missing", "symlink", "fifo"])
@pytest.mark.parametrize("name", FILES)
def test_load_refuses_missing_or_special_files(tmp_path: Path, name: str, kind: str) -> None:
    path = _save(tmp_path / "c")
    shutil.move(path / name, tmp_path / "elsewhere")
    if kind == "symlink":  # same content, so only the symlink check objects
        (path / name).symlink_to(tmp_path / "elsewhere")
    elif kind == "fifo":  # opening a FIFO for reading would block without O_NONBLOCK
        os.mkfifo(path / name)
    message = {"missing": f"missing {name}.*incomplete", "symlink": f"{name}: is a symlink"}
    with pytest.raises(CheckpointError, match=message.get(kind, f"{name}: is not a regular")):
        load_checkpoint(path)


def test_load_refuses_extra_files(tmp_path: Path) -> None:
    path = _save(tmp_path / "c")
    (path / "notes.txt").write_text("x")
    (path / "zz").mkdir()
    with pytest.raises(CheckpointError, match=r"unexpected files notes\.txt, zz"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"step": 1, "epoch": ', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"step": 1, "step": 2, "epoch": 0, "format_version": 1}', "duplicate key"),
        (b"[1, 2]", "must hold a JSON object"),
        (_trainer_json(step="1"), "'step' must be an int"),
        (_trainer_json(step=True), "'step' must be an int"),
        (_trainer_json(epoch=-2), "'epoch' must be an int"),
        (_trainer_json(epoch=0.0), "'epoch' must be an int"),
        (_trainer_json(format_version=None), "'format_version' must be a positive int"),
        (_trainer_json(format_version=99), "newer.*upgrade unitrain"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (_trainer_json(x=json.loads("[" * 80 + "]" * 80)), "nested deeper"),
    ],
)
def test_load_refuses_bad_trainer_state(tmp_path: Path, content: bytes, message: str) -> None:
    path = _save(tmp_path / "c")
    (path / "trainer.json").write_bytes(content)
    _resign(path)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(path)
    assert "trainer.json" in str(info.value)


def test_load_refuses_oversized_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_read, "MAX_JSON_BYTES", 100)
    with pytest.raises(CheckpointError, match=r"manifest\.json: is \d+ bytes, over the 100"):
        load_checkpoint(_save(tmp_path / "c"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (safetensors.numpy.save({"../escape": np.zeros(2)}), "not allowed"),
        (safetensors.numpy.save({"a/b": np.zeros(2)}), "not allowed"),
        (struct.pack("<Q", 2**62) + b"{}", "header too large"),
        (struct.pack("<Q", 2**20) + b"{}", "not a readable safetensors"),
        (b"", "not a readable safetensors"),
        (_raw_safetensors({"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}), "BF16"),
        (_raw_safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}), "fit"),
        (
            _raw_safetensors(
                {
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
                }
            ),
            "invalid offsets for tensor 'b'",
        ),
        (
            _raw_safetensors({"w": {"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}}),
            "has shape",
        ),
        (_raw_safetensors({"w": {"dtype": "I32", "shape": [True], "data_offsets": [0, 4]}}), "int"),
        (_raw_safetensors({"w": {"dtype": "F32", "shape": [], "data_offsets": [4, 4, 4]}}), "offs"),
        (struct.pack("<Q", 2) + b"[]", "does not start with '{'"),
        (struct.pack("<Q", 8) + b'{"a":1} ', "must have exactly"),
        (struct.pack("<Q", 8) + b'{"a":1,"a":2}'[:8], "not valid JSON"),
        (struct.pack("<Q", 16) + b'{"a":{},"a":{}} ', "duplicate key"),
        (struct.pack("<Q", 24) + b'{"__metadata__":{"k":1}}', "'__metadata__' must map str"),
        (struct.pack("<Q", 8) + b"{}      " + bytes(4), "cover 0 bytes of data, but the file"),
        (struct.pack("<Q", 8) + b"{\xff}     ", "not UTF-8"),
        (struct.pack("<Q", 8) + b"{}", "invalid header length"),
        (b"1234567", "header too small"),
    ],
)
def test_load_refuses_bad_safetensors(tmp_path: Path, content: bytes, message: str) -> None:
    path = _save(tmp_path / "c")
    (path / "model.safetensors").write_bytes(content)
    _resign(path)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(path)
    assert "model.safetensors" in str(info.value)


def test_load_without_verify_salvages_but_still_parses(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "c", verify=False)
    path = _save(tmp_path / "c")
    (path / "manifest.json").unlink()
    (path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError):
        verify_checkpoint(path)
    assert load_checkpoint(path, verify=False).trainer["step"] == 150
    (path / "trainer.json").write_text('{"step": -1, "epoch": 0, "format_version": 1}')
    with pytest.raises(CheckpointError, match="'step' must be an int"):
        load_checkpoint(path, verify=False)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    name=st.sampled_from(FILES),
    truncate=st.booleans(),
    fraction=st.floats(0, 1, exclude_max=True),
    mask=st.integers(1, 255),
)
def test_any_byte_change_or_truncation_is_refused(
    pristine: Path, name: str, truncate: bool, fraction: float, mask: int
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(shutil.copytree(pristine, Path(scratch) / "c"))
        file = path / name
        data = bytearray(file.read_bytes())
        offset = int(fraction * len(data))
        if truncate:
            del data[offset:]
        else:
            data[offset] ^= mask
        file.write_bytes(bytes(data))
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        # A changed manifest entry is reported against the file it describes.
        named = FILES if name == "manifest.json" else (name,)
        assert any(f"{path / file_name}:" in str(info.value) for file_name in named)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("pristine") / "c")


# Finding checkpoints


def test_checkpoint_name_is_zero_padded_and_sortable() -> None:
    assert checkpoint_name(3, 150) == "epoch=0003-step=000150"
    names = [checkpoint_name(epoch, step) for epoch, step in [(0, 9), (1, 10), (10, 100)]]
    assert sorted(names) == names
    for bad in [(-1, 0), (0, -1), (True, 0), (0, 1.0)]:
        with pytest.raises(CheckpointError, match="must be an int >= 0"):
            checkpoint_name(*bad)  # type: ignore[arg-type]


def test_list_checkpoints_orders_by_step_and_ignores_the_rest(tmp_path: Path) -> None:
    _save(tmp_path / "b", step=5)
    _save(tmp_path / "a", step=10)
    _save(tmp_path / "c", step=1)
    broken = _save(tmp_path / "z-broken", step=99)
    (broken / "trainer.json").write_text("{")
    (tmp_path / ".c.tmp-123-abcd").mkdir()
    (tmp_path / ".c.tmp-123-abcd" / "manifest.json").write_text("{}")
    shutil.copytree(tmp_path / "a", tmp_path / ".a.old-1-ff")  # "a" exists: a stale leftover
    shutil.copytree(tmp_path / "a", tmp_path / ".d.del-1-ff")
    (tmp_path / "not-a-checkpoint").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["z-broken", "c", "b", "a"]
    assert list_checkpoints(tmp_path / "missing") == []


def test_displaced_copy_is_found_after_a_crash_mid_replacement(tmp_path: Path) -> None:
    path = _save(tmp_path / "last", step=7)
    displaced = tmp_path / ".last.old-4242-0badc0de"
    os.rename(path, displaced)  # a crash between the two renames leaves exactly this
    (tmp_path / ".last.tmp-4242-12345678").mkdir()
    assert list_checkpoints(tmp_path) == [displaced]
    assert resolve_checkpoint("latest", tmp_path) == displaced
    _save(path, step=8)  # the next save installs normally; the leftover is ignored again
    assert list_checkpoints(tmp_path) == [path]


def test_latest_falls_back_past_corrupted_newest(tmp_path: Path) -> None:
    good = _save(tmp_path / checkpoint_name(0, 10), step=10)
    newest = _save(tmp_path / checkpoint_name(0, 30), step=30)
    missing = _save(tmp_path / checkpoint_name(0, 20), step=20)
    _corrupt(newest, "model.safetensors", "flip")
    (missing / "optimizer.safetensors").unlink()
    with pytest.warns(CheckpointWarning) as caught:
        assert resolve_checkpoint("latest", tmp_path) == good
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 2
    assert str(newest) in messages[0] and "xxh3_64 mismatch" in messages[0]
    assert str(missing) in messages[1] and "missing optimizer.safetensors" in messages[1]


def test_resolve_refuses_invalid_paths_and_lists_what_latest_tried(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoints to resume"):
        resolve_checkpoint("latest", tmp_path)
    path = _save(tmp_path / "c")
    assert resolve_checkpoint(path, tmp_path / "elsewhere") == path
    assert resolve_checkpoint(str(path), tmp_path) == path
    _corrupt(path, "trainer.json", "truncate")
    with pytest.raises(CheckpointError, match="size mismatch"):
        resolve_checkpoint(path, tmp_path)
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError) as info:
        resolve_checkpoint("latest", tmp_path)
    assert f"Tried, newest first:\n  {path / 'trainer.json'}: size mismatch" in str(info.value)


def test_remove_checkpoint(tmp_path: Path) -> None:
    path = _save(tmp_path / "c")
    remove_checkpoint(path)
    assert os.listdir(tmp_path) == []
    with pytest.raises(CheckpointError, match="no checkpoint to remove"):
        remove_checkpoint(path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.npy").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="refusing to remove"):
        remove_checkpoint(tmp_path / "data")
    assert (tmp_path / "data" / "keep.npy").exists()
