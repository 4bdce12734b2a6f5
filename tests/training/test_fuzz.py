"""Hostile checkpoints: every damaged or crafted checkpoint ends in a CheckpointError.

Hypothesis builds thousands of bad checkpoints from real ones (a storage-level checkpoint and
checkpoints of a real Trainer run with every stateful callback) and feeds them to the public
readers: :func:`unitrain.checkpoint.load_checkpoint`, ``Trainer.fit(resume=...)`` and
``unitrain inspect``. The families are truncations, bit flips and appended bytes; crafted
safetensors headers (wrong or huge lengths, dtypes, shapes, offsets, names with ``..`` or
path separators); tensors of the wrong dtype or shape, missing or extra, NaN or Inf;
``trainer.json`` with wrong types, deep nesting and huge numbers; manifest edits; missing,
extra and special files (symlinks out of the checkpoint, FIFOs, directories). Where the
manifest would stop a crafted file before its parser sees it, the manifest is re-signed, so
the parser itself is exercised.

Every case must end in one of two ways, within a time bound: the checkpoint loads (a crafted
change can be harmless, e.g. a re-signed bit flip inside a weight), or a CheckpointError (a
:class:`unitrain.UnitrainError`) whose message names the checkpoint. Any other exception,
from unitrain or from a library, fails the test, and so does a case that runs past the bound.
Each test counts the cases it ran; ``UNITRAIN_HARDENING_REPORT=<dir>`` writes the counts, and
``UNITRAIN_FUZZ_SCALE`` multiplies them (the default run does over 2,000).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import struct
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from _backends import backends
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unitrain import (
    CheckpointError,
    Trainer,
    TrainerConfig,
    UnitrainError,
    models,
    optim,
    schedules,
)
from unitrain import callbacks as cb
from unitrain.checkpoint import load_checkpoint, save_checkpoint
from unitrain.checkpoint._digest import digest_hex
from unitrain.checkpoint._format import DATA_FILES, FileDigest, encode_manifest
from unitrain.cli import _main as cli

ROOT = Path(__file__).resolve().parents[2]
FILES = (*DATA_FILES, "manifest.json")
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "callbacks.safetensors")
SCALE = float(os.environ.get("UNITRAIN_FUZZ_SCALE", "1"))
TIME_BOUND = 20.0  # seconds per case; a parser that loops or a reader that blocks trips it
COUNTS: dict[str, int] = {}


def examples(n: int) -> Any:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs resumed here save checkpoints; their durability is not under test, so the fsyncs
    (most of the run time on a busy disk) are skipped."""
    monkeypatch.setattr(os, "fsync", lambda descriptor: None)


class Hang(BaseException):
    """A case ran past the time bound."""


@contextlib.contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(family: str, checkpoint: Path, call: Callable[[], Any]) -> str:
    """Run one case: ``"loaded"`` or ``"refused"`` (a CheckpointError naming the checkpoint).

    Anything else propagates and fails the test. Warnings are allowed when they are
    UserWarnings (a skipped checkpoint, a resumed finished run) or numeric RuntimeWarnings of
    training that continued after a successful load.
    """
    COUNTS[family] = COUNTS.get(family, 0) + 1
    with time_bound(TIME_BOUND), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except CheckpointError as error:
            assert isinstance(error, UnitrainError)
            assert str(checkpoint) in str(error), f"message does not name the checkpoint: {error}"
            return "refused"
    for warning in caught:
        assert issubclass(warning.category, (UserWarning, RuntimeWarning)), warning
    return "loaded"


def resign(checkpoint: Path) -> None:
    """Rewrite the manifest to match the files, so only the parsers can object."""
    files = {}
    for name in DATA_FILES:
        if (checkpoint / name).is_file() and not (checkpoint / name).is_symlink():
            data = (checkpoint / name).read_bytes()
            files[name] = FileDigest("xxh3_64", digest_hex("xxh3_64", data), len(data))
        else:
            files[name] = FileDigest("xxh3_64", "0" * 16, 0)
    (checkpoint / "manifest.json").write_bytes(encode_manifest(files))


@contextlib.contextmanager
def copy_of(pristine: Path) -> Iterator[Path]:
    """A scratch copy of a checkpoint, inside a directory of its own."""
    with tempfile.TemporaryDirectory() as scratch:
        yield Path(shutil.copytree(pristine, Path(scratch) / "ckpt" / pristine.name))


# -- the checkpoints fuzzed --------------------------------------------------------------------


def tiny_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype(np.float32), rng.integers(0, 3, 32)


def make_trainer(out: Path, epochs: int = 3) -> Trainer:
    """A small run with every stateful callback, so trainer.json holds all their states."""
    return Trainer(
        models.MLP((4, 8, 3), dropout=0.1),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Warmup(schedules.CosineDecay(0.1, 8), 4),
        callbacks=[
            cb.EarlyStopping("val_loss", patience=5, restore_best_weights=True),
            cb.ReduceLROnPlateau("val_loss", patience=1),
            cb.JSONLLogger(out / "metrics.jsonl"),
            cb.CSVLogger(out / "metrics.csv"),
            cb.LRMonitor("step"),
            cb.ModelCheckpoint(out / "ckpt", every_n_steps=3, monitor="val_accuracy"),
        ],
        config=TrainerConfig(
            epochs=epochs, batch_size=8, checkpoint_dir=str(out / "ckpt"), nonfinite="skip_batch"
        ),
    )


@pytest.fixture(scope="module")
def run_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints of a real run: mid-epoch (batch 2 of the second epoch) and finished."""
    out = tmp_path_factory.mktemp("run")
    x, y = tiny_data()
    make_trainer(out).fit((x, y), (x, y))
    return {
        "mid_epoch": out / "ckpt" / "epoch=0002-step=000006",
        "finished": out / "ckpt" / "epoch=0003-step=000012",
    }


@pytest.fixture(scope="module")
def storage_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1.0, -2.0], np.float64),
        "n": np.array(7, np.int64),
    }
    trainer = {"epoch": 2, "step": 40, "history": [{"loss": 1.5}], "nested": {"a": [1, 2]}}
    return save_checkpoint(
        tmp_path_factory.mktemp("storage") / "c",
        model=model,
        optimizer={"w.momentum": np.zeros((3, 4), np.float32)},
        trainer=trainer,
        callbacks={"cb.best": np.ones(2, np.float32)},
    )


def resume(checkpoint: Path, spec: str | Path | None = None) -> Callable[[], Any]:
    """``fit(resume=...)`` of the run's own recipe, in the checkpoint's parent directory."""

    def call() -> Any:
        out = checkpoint.parent.parent
        x, y = tiny_data()
        with np.errstate(all="ignore"):
            return make_trainer(out).fit((x, y), (x, y), resume=spec or checkpoint)

    return call


def inspect(checkpoint: Path) -> Callable[[], Any]:
    """``unitrain inspect CHECKPOINT``, output discarded (its errors are the CLI's exit 2)."""

    def call() -> Any:
        with contextlib.redirect_stdout(io.StringIO()):
            return cli._inspect(argparse.Namespace(path=str(checkpoint)))

    return call


def reader(name: str, checkpoint: Path) -> Callable[[], Any]:
    """One of the public ways to read a checkpoint."""
    if name == "fit":
        return resume(checkpoint)
    if name == "inspect":
        return inspect(checkpoint)
    return lambda: load_checkpoint(checkpoint)


def publish_counts() -> None:
    directory = os.environ.get("UNITRAIN_HARDENING_REPORT")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        name = f"fuzz-{os.getpid()}.json"
        (Path(directory) / name).write_text(json.dumps(COUNTS, indent=2, sort_keys=True))


def run_counted(family: str, fuzz: Callable[[], None], minimum: int) -> None:
    before = COUNTS.get(family, 0)
    fuzz()
    ran = COUNTS.get(family, 0) - before
    publish_counts()
    assert ran >= min(minimum, int(minimum * SCALE)), f"{family}: only {ran} cases ran"


# -- strategies --------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**53 + 1, 2**63, -1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)
tensor_names = st.one_of(
    st.sampled_from(
        ["w", "../w", "a/b", "a\\b", "", "x\0y", "..", "__metadata__", "layers.0.weight"]
    ),
    st.text(max_size=12),
)
dtype_names = st.one_of(
    st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "I8", "BOOL", "F8_E4M3"]),
    st.sampled_from(["C64", "U64", "F4", "", "f32", "float32"]),
    st.text(max_size=6),
)
shapes = st.one_of(
    st.lists(st.integers(0, 6), max_size=3),
    st.lists(st.sampled_from([-1, 2**31, 2**32, 2**63 - 1, 2**64]), min_size=1, max_size=3),
    json_values,
)
offsets = st.one_of(
    st.tuples(st.integers(0, 256), st.integers(0, 256)).map(list),
    st.lists(st.sampled_from([-1, 0, 7, 2**32, 2**63, 2**64 - 1]), max_size=3),
    json_values,
)
headers = st.dictionaries(
    tensor_names,
    st.one_of(
        st.fixed_dictionaries({"dtype": dtype_names, "shape": shapes, "data_offsets": offsets}),
        json_values,
    ),
    max_size=4,
)


def safetensors_bytes(header: Any, declared: int | None, padding: bytes, body: bytes) -> bytes:
    """A safetensors file: 8-byte little-endian header length, JSON header, data."""
    encoded = json.dumps(header).encode() + padding
    size = len(encoded) if declared is None else declared
    return struct.pack("<Q", size % 2**64) + encoded + body


# -- 1. bytes: truncation, bit flips, appended and replaced bytes -------------------------------


@pytest.mark.parametrize("target", ["storage", "trainer"])
def test_byte_damage_is_refused_or_harmless(target, storage_checkpoint, run_checkpoints):
    pristine = storage_checkpoint if target == "storage" else run_checkpoints["mid_epoch"]

    @examples(250)
    @given(
        name=st.sampled_from(FILES),
        how=st.sampled_from(["truncate", "flip", "append", "replace"]),
        fraction=st.floats(0, 1, exclude_max=True),
        bits=st.lists(st.integers(0, 7), min_size=1, max_size=8),
        junk=st.binary(max_size=64),
        signed=st.booleans(),
    )
    def fuzz(name, how, fraction, bits, junk, signed):
        with copy_of(pristine) as checkpoint:
            file = checkpoint / name
            data = bytearray(file.read_bytes())
            at = int(fraction * len(data))
            if how == "truncate":
                del data[at:]
            elif how == "flip":
                for bit in bits:
                    data[at] ^= 1 << bit
            elif how == "append":
                data += junk or b"\0"
            else:
                data = bytearray(junk)
            file.write_bytes(bytes(data))
            if signed and name != "manifest.json":
                resign(checkpoint)
            changed = file.read_bytes() != (pristine / name).read_bytes()
            load = lambda: load_checkpoint(checkpoint)  # noqa: E731
            result = outcome("bytes", checkpoint, load)
            if changed and not (signed and name != "manifest.json"):
                assert result == "refused"  # the manifest catches every unsigned change
            if target == "trainer":
                outcome("bytes_via_fit", checkpoint, resume(checkpoint))

    run_counted("bytes", fuzz, 250)


# -- 2. crafted safetensors headers -------------------------------------------------------------


def test_crafted_safetensors_headers_are_refused_or_loaded(run_checkpoints):
    pristine = run_checkpoints["mid_epoch"]

    @examples(400)
    @given(
        name=st.sampled_from(TENSOR_FILES),
        header=headers,
        declared=st.one_of(st.none(), st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 7, 2**63])),
        padding=st.sampled_from([b"", b" ", b"   ", b"\0", b"\n\t"]),
        body=st.binary(max_size=256),
        via=st.sampled_from(["load", "fit", "fit", "inspect"]),
    )
    def fuzz(name, header, declared, padding, body, via):
        with copy_of(pristine) as checkpoint:
            (checkpoint / name).write_bytes(safetensors_bytes(header, declared, padding, body))
            resign(checkpoint)
            result = outcome("safetensors_headers", checkpoint, reader(via, checkpoint))
            if via == "fit" and name != "callbacks.safetensors":
                assert result == "refused"  # it cannot hold this run's exact tensors

    run_counted("safetensors_headers", fuzz, 400)


# -- 3. well-formed tensors that do not fit the run ---------------------------------------------


def test_tensors_that_do_not_fit_the_run_are_refused(run_checkpoints):
    pristine = run_checkpoints["mid_epoch"]

    @examples(300)
    @given(
        name=st.sampled_from(TENSOR_FILES),
        pick=st.integers(0, 100),
        change=st.sampled_from(
            [
                "float16",
                "float64",
                "int32",
                "int64",
                "bool",
                "uint8",
                "transpose",
                "flatten",
                "grow",
                "scalar",
                "nan",
                "inf",
                "-inf",
                "drop",
                "extra",
                "rename",
                "negative",
            ]
        ),
        where=st.floats(0, 1, exclude_max=True),
    )
    def fuzz(name, pick, change, where):
        with copy_of(pristine) as checkpoint:
            tensors = safetensors.numpy.load((checkpoint / name).read_bytes())
            key = sorted(tensors)[pick % len(tensors)]
            array = tensors[key]
            if change in ("float16", "float64", "int32", "int64", "bool", "uint8"):
                tensors[key] = array.astype(change)
            elif change == "transpose":
                tensors[key] = np.ascontiguousarray(array.T) if array.ndim == 2 else array[None]
            elif change == "flatten":
                tensors[key] = array.reshape(-1, 1)
            elif change == "grow":
                tensors[key] = np.concatenate([array.reshape(-1), array.reshape(-1)[:1]])
            elif change == "scalar":
                tensors[key] = np.asarray(array.reshape(-1)[0] if array.size else 0, array.dtype)
            elif change in ("nan", "inf", "-inf"):
                if array.dtype.kind != "f" or array.size == 0:
                    tensors[key] = np.array([float(change)], np.float32)
                else:
                    array = array.copy()
                    array.reshape(-1)[int(where * array.size)] = float(change)
                    tensors[key] = array
            elif change == "drop":
                del tensors[key]
            elif change == "extra":
                tensors[key + ".extra"] = np.zeros(2, np.float32)
            elif change == "rename":
                tensors[key + "x"] = tensors.pop(key)
            else:
                tensors[key] = np.full(array.shape, -1, np.int64)
            (checkpoint / name).write_bytes(safetensors.numpy.save(tensors))
            resign(checkpoint)
            result = outcome("tensors", checkpoint, resume(checkpoint))
            # An update counter stored in another integer type, or an unused extra tensor in
            # the callbacks file, changes nothing; every other change must be refused.
            harmless = (key == "step" and change in ("int32", "int64", "uint8", "scalar")) or (
                name == "callbacks.safetensors" and change == "extra"
            )
            assert result == ("loaded" if harmless else "refused"), f"{change} of {name}:{key}"

    run_counted("tensors", fuzz, 300)


# -- 4. trainer.json: wrong types, deep nesting, huge numbers ------------------------------------


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every dict entry and to the first and last item of every list."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from paths_of(child, (*prefix, key))
    elif isinstance(value, list) and value:
        for index in {0, len(value) - 1}:
            yield (*prefix, index)
            yield from paths_of(value[index], (*prefix, index))


def mutate(info: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    parent = info
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "delete" and isinstance(parent, dict):
        del parent[last]
    elif how == "nest":
        parent[last] = json.loads("[" * 200 + json.dumps(parent[last]) + "]" * 200)
    else:
        parent[last] = value
    return info


NUMBER = re.compile(rb"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?")
HUGE_TOKENS = [b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity", b"9" * 5000, b"1" * 300]


@pytest.mark.parametrize("which", ["mid_epoch", "finished"])
def test_trainer_json_damage_is_refused_or_harmless(which, run_checkpoints):
    pristine = run_checkpoints[which]
    info = json.loads((pristine / "trainer.json").read_text())
    paths = sorted(set(paths_of(info)), key=repr)

    @examples(300)
    @given(
        path=st.sampled_from(paths),
        how=st.sampled_from(["replace", "replace", "delete", "nest", "token"]),
        value=json_values,
        token=st.sampled_from(HUGE_TOKENS),
        where=st.floats(0, 1, exclude_max=True),
        via=st.sampled_from(["load", "fit", "inspect"]),
    )
    def fuzz(path, how, value, token, where, via):
        with copy_of(pristine) as checkpoint:
            file = checkpoint / "trainer.json"
            if how == "token":  # raw text: a number token becomes a huge or non-finite one
                data = file.read_bytes()
                spots = list(NUMBER.finditer(data))
                spot = spots[int(where * len(spots))]
                data = data[: spot.start()] + token + data[spot.end() :]
            else:
                edited = mutate(json.loads(file.read_text()), path, how, value)
                data = json.dumps(edited, allow_nan=True).encode()
            file.write_bytes(data)
            resign(checkpoint)
            call, results = reader(via, checkpoint), []
            if outcome("trainer_json", checkpoint, lambda: results.append(call())) == "loaded":
                harmless(via, results[0])

    run_counted("trainer_json", fuzz, 300)


def harmless(via: str, result: Any) -> None:
    """A damaged trainer.json that a resume accepted left a usable run: its history has one
    row per epoch, numbered consecutively, up to the run's last epoch (3) at most. (``load``
    and ``inspect`` only read the file; they validate nothing that a resume would use.)"""
    if via == "fit" and result:
        epochs = [row["epoch"] for row in result]
        assert epochs == list(range(epochs[0], epochs[0] + len(epochs))), epochs
        assert all(type(e) is int for e in epochs) and epochs[-1] <= 3, epochs  # 3 epochs


# -- 5. manifest edits --------------------------------------------------------------------------


def test_manifest_edits_are_refused(storage_checkpoint):
    pristine = storage_checkpoint
    manifest = json.loads((pristine / "manifest.json").read_text())
    paths = sorted(set(paths_of(manifest)), key=repr)

    @examples(200)
    @given(
        path=st.sampled_from(paths),
        how=st.sampled_from(["replace", "delete", "nest", "swap", "reformat"]),
        value=json_values,
    )
    def fuzz(path, how, value):
        with copy_of(pristine) as checkpoint:
            file = checkpoint / "manifest.json"
            edited = json.loads(file.read_text())
            if how == "swap":  # two files' entries exchanged
                files = edited["files"]
                files["model.safetensors"], files["optimizer.safetensors"] = (
                    files["optimizer.safetensors"],
                    files["model.safetensors"],
                )
                data = json.dumps(edited, indent=2, sort_keys=True).encode() + b"\n"
            elif how == "reformat":  # same content, other whitespace
                data = json.dumps(edited).encode()
            else:
                edited = mutate(edited, path, how, value)
                data = json.dumps(edited, indent=2, sort_keys=True, allow_nan=True).encode() + b"\n"
            file.write_bytes(data)
            changed = data != (pristine / "manifest.json").read_bytes()
            result = outcome("manifest", checkpoint, lambda: load_checkpoint(checkpoint))
            assert result == ("refused" if changed else "loaded")

    run_counted("manifest", fuzz, 200)


# -- 6. missing, extra and special files ---------------------------------------------------------


def test_missing_extra_and_special_files_are_refused(run_checkpoints, tmp_path_factory):
    pristine = run_checkpoints["mid_epoch"]
    outside = tmp_path_factory.mktemp("outside")
    for name in FILES:  # the same bytes, outside: only the link itself is wrong
        shutil.copy(pristine / name, outside / name)

    hows = [
        "missing", "extra_file", "extra_dir", "symlink_out", "symlink_dev", "symlink_loop",
        "fifo", "directory", "hidden_extra",
    ]  # fmt: skip

    @examples(150)
    @given(
        changes=st.lists(
            st.tuples(st.sampled_from(FILES), st.sampled_from(hows)),
            min_size=1,
            max_size=3,
            unique_by=lambda change: change[0],
        ),
        via=st.sampled_from(["load", "fit", "inspect"]),
    )
    def fuzz(changes, via):
        with copy_of(pristine) as checkpoint:
            for name, how in changes:
                damage(checkpoint, name, how)
            assert outcome("files", checkpoint, reader(via, checkpoint)) == "refused"

    def damage(checkpoint: Path, name: str, how: str) -> None:
        file = checkpoint / name
        if how in ("missing", "symlink_out", "symlink_dev", "symlink_loop", "fifo", "directory"):
            file.unlink()
        if how == "extra_file":
            (checkpoint / "notes.txt").write_text("x")
        elif how == "extra_dir":
            (checkpoint / "sub").mkdir(exist_ok=True)
        elif how == "hidden_extra":
            (checkpoint / ".hidden").write_text("x")
        elif how == "symlink_out":
            file.symlink_to(outside / name)
        elif how == "symlink_dev":
            file.symlink_to("/dev/zero")
        elif how == "symlink_loop":
            file.symlink_to(file)
        elif how == "fifo":
            os.mkfifo(file)
        elif how == "directory":
            file.mkdir()

    run_counted("files", fuzz, 150)


def test_checkpoint_paths_that_are_not_directories_are_refused(run_checkpoints, tmp_path):
    target = tmp_path / "ckpt" / "c"
    target.parent.mkdir()
    cases = {
        "missing": lambda: None,
        "file": lambda: target.write_text("x"),
        "dangling": lambda: target.symlink_to(tmp_path / "nothing"),
        "loop": lambda: target.symlink_to(target),
        "fifo": lambda: os.mkfifo(target),
        "empty": lambda: target.mkdir(),
    }
    for make in cases.values():
        make()
        for call in (lambda: load_checkpoint(target), resume(target)):
            assert outcome("paths", target, call) == "refused"
        if target.is_dir() and not target.is_symlink():
            target.rmdir()
        elif os.path.lexists(target):
            target.unlink()
    # A symlink *to* a checkpoint directory is allowed: only its files may not be links.
    target.symlink_to(shutil.copytree(run_checkpoints["finished"], tmp_path / "real"))
    assert outcome("paths", target, resume(target)) == "loaded"


# -- 7. resume="latest" over a directory of damaged checkpoints -----------------------------------


def test_latest_falls_back_or_refuses(run_checkpoints, tmp_path_factory):
    pristine = run_checkpoints["mid_epoch"].parent

    @examples(100)
    @given(damaged=st.lists(st.booleans(), min_size=8, max_size=8), seed=st.integers(0, 2**32))
    def fuzz(damaged, seed):
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(shutil.copytree(pristine, Path(scratch) / "ckpt"))
            rng = np.random.default_rng(seed)
            checkpoints = sorted(p for p in directory.iterdir() if p.is_dir())
            for checkpoint, damage in zip(checkpoints, damaged):
                if damage:
                    file = checkpoint / FILES[rng.integers(len(FILES))]
                    data = bytearray(file.read_bytes())
                    data[rng.integers(len(data))] ^= 1 << int(rng.integers(8))
                    file.write_bytes(bytes(data))
            result = outcome("latest", directory, resume(checkpoints[-1], "latest"))
            intact = [not d for _, d in zip(checkpoints, damaged)]
            assert result == ("loaded" if any(intact) else "refused")

    run_counted("latest", fuzz, 100)


#: Fuzz family -> (cases per test, tests that run it): the plan of a default run. Each test
#: asserts its own count through run_counted; this table is what docs/errors.md promises.
PLANNED = {
    "bytes": (250, 2),
    "safetensors_headers": (400, 1),
    "tensors": (300, 1),
    "trainer_json": (300, 2),
    "manifest": (200, 1),
    "files": (150, 1),
    "latest": (100, 1),
}


def test_the_fuzz_plan_matches_docs_errors_md():
    """docs/errors.md names the fuzz families and the number of checkpoints per default run;
    both must be what this file runs."""
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"fuzz family `(\w+)`", text))
    assert documented and documented <= set(PLANNED), documented - set(PLANNED)
    figure = re.search(
        r"over\s+([\d,]+)\s+generated\s+checkpoints\s+per\s+default\s+test\s+run", text
    )
    assert figure is not None, "docs/errors.md no longer states how many checkpoints are fuzzed"
    assert sum(cases * tests for cases, tests in PLANNED.values()) >= int(
        figure.group(1).replace(",", "")
    )
    source = Path(__file__).read_text(encoding="utf-8")
    for family, (cases, _) in PLANNED.items():
        assert f'run_counted("{family}", fuzz, {cases})' in source, family


# -- nothing on the load path may execute code from a file --------------------------------------

UNSAFE = [
    (r"^\s*(import|from)\s+((?i:c?pickle)|dill|cloudpickle|joblib|shelve|marshal)\b", "pickle"),
    (r"\b((?i:c?pickle)|dill|cloudpickle|joblib|marshal)\.(load|loads|Unpickler)\b", "unpickling"),
    (r"\btorch\.load\((?![^)]*weights_only\s*=\s*True)", "torch.load without weights_only=True"),
    (r"\bnp\.load\([^)]*allow_pickle\s*=\s*True", "np.load with allow_pickle=True"),
    (r"\byaml\.load\((?![^)]*SafeLoader)", "yaml.load without SafeLoader"),
    (r"(?<![.\w])(eval|exec)\(", "eval/exec"),
]
#: Reviewed exceptions, by file and code. The conformance kit's ``-k`` matcher evaluates an
#: expression it composes itself from ``and``/``or``/``not``/parentheses and ``_w[i]``
#: lookups, with no builtins; the user's words never reach the evaluated source.
ALLOWED = {("unitrain/conformance/_registry.py", 'eval(compiled, {"__builtins__": {}}')}


@pytest.mark.parametrize(
    ("line", "unsafe"),
    [
        ("import pickle", True),
        ("from cPickle import loads", True),
        ("state = dill.load(handle)", True),
        ("torch.load(path)", True),
        ("torch.load(path, map_location='cpu')", True),
        ("np.load(path, allow_pickle=True)", True),
        ("yaml.load(text)", True),
        ("exec(code)", True),
        ("torch.load(path, weights_only=True)", False),
        ("np.load(path)", False),
        ("self.module.eval()", False),
        ("yaml.load(text, Loader=yaml.SafeLoader)", False),
    ],
)
def test_the_unsafe_code_patterns_catch_what_they_should(line, unsafe):
    assert any(re.search(pattern, line) for pattern, _ in UNSAFE) is unsafe


def test_no_pickle_or_code_execution_anywhere_in_the_package():
    found = []
    for file in sorted((ROOT / "unitrain").rglob("*.py")):
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            where = str(file.relative_to(ROOT))
            if any(where == f and snippet in code for f, snippet in ALLOWED):
                continue
            found += [
                f"{where}:{number}: {what}: {line.strip()}"
                for pattern, what in UNSAFE
                if re.search(pattern, code)
            ]
    assert found == [], "\n".join(found)


# -- every backend's part of a resume: its state loader and its RNG ------------------------------

BACKEND_CASES = {
    "rng_not_an_object": ("rng", "backend", "garbage"),
    "rng_bad_base64": ("rng", "backend", {"cpu": "!!not base64!!", "global_generator": "x"}),
    "rng_wrong_size": ("rng", "backend", {"cpu": "AAAA", "global_generator": [1, 2]}),
    "rng_huge_numbers": ("rng", "backend", {"cpu": 10**30, "global_generator": [2**70] * 3}),
    "numpy_rng_garbage": ("rng", "numpy", ["MT19937", [1, 2], 0, 0, 0.0]),
    "python_rng_garbage": ("rng", "python", [3, [0] * 5, None]),
}


@pytest.mark.parametrize("case", sorted(BACKEND_CASES))
@pytest.mark.parametrize("backend", backends())
def test_every_backend_refuses_or_ignores_hostile_rng_states(backend, case, tmp_path):
    run = Trainer(
        models.MLP((4, 8, 3)),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        callbacks=[cb.ModelCheckpoint(tmp_path / "ckpt")],
        config=TrainerConfig(epochs=1, batch_size=8, device="cpu"),
    )
    run.fit(tiny_data())
    checkpoint = run.callbacks.callbacks[0].last_saved
    section, key, value = BACKEND_CASES[case]
    info = json.loads((checkpoint / "trainer.json").read_text())
    info[section][key] = value
    (checkpoint / "trainer.json").write_text(json.dumps(info))
    resign(checkpoint)
    again = Trainer(
        models.MLP((4, 8, 3)),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        config=TrainerConfig(epochs=2, batch_size=8, device="cpu"),
    )
    result = outcome("backend_rng", checkpoint, lambda: again.fit(tiny_data(), resume=checkpoint))
    publish_counts()
    if key in ("numpy", "python"):  # the global generators: restored by unitrain itself
        assert result == "refused"
    elif result == "loaded":
        # Harmless only if the backend never read the value: it restores no generator, or
        # none of the generators the hostile state names. A backend that silently ignores a
        # garbage state for a generator it does restore would resume another random stream.
        restores = set(again.backend.rng_state())
        named = set(value) if isinstance(value, dict) else restores
        assert not restores & named, f"{backend}: hostile rng state {value!r} loaded silently"
