"""Integrity before memory: a checkpoint is checked before it can cost memory or reach a model.

A hostile or damaged checkpoint may declare tensors of any size, hold weights of the wrong
dtype, shape or value, or put terminal escape sequences in its names. These tests build such
checkpoints (large ones as sparse files, which cost no disk) and check that each is refused or
skipped with a clear message, at a bounded cost in memory.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import unitrain.checkpoint
import unitrain.checkpoint._discovery as discovery
from unitrain import CheckpointError, Trainer, TrainerConfig, export_weights, models
from unitrain.checkpoint import (
    CheckpointWarning,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from unitrain.checkpoint._discovery import load_resolved
from unitrain.checkpoint._format import MODEL_FILE, FileDigest, encode_manifest, parse_manifest
from unitrain.cli import main

#: Peak resident memory allowed to refuse a hostile checkpoint; importing unitrain and numpy
#: alone peaks near 35 MB here.
MAX_RSS_BYTES = 100 * 1024 * 1024
GIB = 1024**3


def _save(root: Path, name: str, step: int, model: dict[str, np.ndarray] | None = None) -> Path:
    weights = {"w": np.arange(4.0, dtype=np.float32)} if model is None else model
    trainer = {"epoch": 0, "step": step}
    return save_checkpoint(root / name, model=weights, optimizer={}, trainer=trainer)


def _make_sparse_model(checkpoint: Path, size: int) -> None:
    """Replaces the model file by a well-formed one of ``size`` bytes (one uint8 tensor, all
    holes) whose manifest entry has the right size and a wrong digest."""
    count = size - 8
    while True:  # the header's length depends on the digits of the tensor's length
        header = json.dumps({"w": {"dtype": "U8", "shape": [count], "data_offsets": [0, count]}})
        encoded = header.encode() + b" " * (-len(header) % 8)
        if 8 + len(encoded) + count == size:
            break
        count = size - 8 - len(encoded)
    file = checkpoint / MODEL_FILE
    with open(file, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded)
    os.truncate(file, size)
    manifest_file = checkpoint / "manifest.json"
    entries = parse_manifest(manifest_file.read_bytes(), manifest_file)
    entries[MODEL_FILE] = FileDigest(entries[MODEL_FILE].algorithm, "0123456789abcdef", size)
    manifest_file.write_bytes(encode_manifest(entries))


def _run_measured(code: str) -> tuple[dict, int]:
    """Runs ``code`` in a fresh interpreter; returns what it printed last (JSON) and its peak
    resident memory in bytes."""
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import json as _json
        print(_json.dumps(result))
        # VmHWM, the peak of this process's own memory: ru_maxrss would start from the
        # forking parent's (a pytest worker that had loaded TensorFlow read 929 MiB here).
        with open("/proc/self/status") as _status:
            print(next(l.split()[1] for l in _status if l.startswith("VmHWM:")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    *_, result, peak_kib = done.stdout.splitlines()
    return json.loads(result), int(peak_kib) * 1024  # VmHWM is in kB


needs_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc/self/status and sparse files: Linux"
)


@needs_linux
def test_a_200_gib_sparse_checkpoint_is_skipped_by_latest_at_bounded_memory(tmp_path):
    # Refused for being larger than this machine's memory; on a machine with more, by its
    # streamed digest (slower, and still within the memory bound).
    _save(tmp_path, "step10", 10)
    _make_sparse_model(_save(tmp_path, "step20", 20), 200 * GIB)
    result, peak = _run_measured(
        f"""
        import warnings
        from unitrain.checkpoint._discovery import load_resolved
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load_resolved("latest", {str(tmp_path)!r})
        result = {{
            "path": loaded.path.name,
            "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        }}
        """
    )
    assert result["path"] == "step10"
    [(category, message)] = result["warnings"]
    assert category == "CheckpointWarning" and "step20" in message and MODEL_FILE in message
    assert peak < MAX_RSS_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


@needs_linux
def test_inspect_lists_a_200_gib_sparse_checkpoint_as_damaged_at_bounded_memory(tmp_path):
    _save(tmp_path, "step10", 10)
    _make_sparse_model(_save(tmp_path, "step20", 20), 200 * GIB)
    result, peak = _run_measured(
        f"""
        import contextlib, io
        from unitrain.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(["inspect", {str(tmp_path)!r}])
        result = {{"status": status, "out": out.getvalue()}}
        """
    )
    assert result["status"] == 0
    [line] = [line for line in result["out"].splitlines() if line.startswith("step20")]
    assert "damaged" in line and MODEL_FILE in line
    assert any(
        line.startswith("step10") and line.endswith("ok") for line in result["out"].splitlines()
    )
    assert peak < MAX_RSS_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


@needs_linux
def test_a_wrong_digest_is_found_by_streaming_before_the_tensors_are_read(tmp_path):
    # 1 GiB fits in memory, so only checking the digest first keeps it out of memory.
    checkpoint = _save(tmp_path, "step20", 20)
    _make_sparse_model(checkpoint, GIB)
    result, peak = _run_measured(
        f"""
        from unitrain import CheckpointError
        from unitrain.checkpoint import load_checkpoint
        try:
            load_checkpoint({str(checkpoint)!r})
            result = "loaded"
        except CheckpointError as error:
            result = str(error)
        """
    )
    assert "xxh3_64 mismatch" in result and MODEL_FILE in result
    assert peak < MAX_RSS_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


def test_latest_skips_a_checkpoint_that_fails_with_any_error(tmp_path, monkeypatch):
    older, newer = _save(tmp_path, "step10", 10), _save(tmp_path, "step20", 20)
    real_load = discovery.load_checkpoint

    def load_or_run_out_of_memory(path, **options):
        if Path(path) == newer:
            raise MemoryError("cannot allocate 200 GiB")
        return real_load(path, **options)

    monkeypatch.setattr(discovery, "load_checkpoint", load_or_run_out_of_memory)
    with pytest.warns(CheckpointWarning, match="step20.*MemoryError: cannot allocate 200 GiB"):
        assert load_resolved("latest", tmp_path).path == older


def test_inspect_shows_a_checkpoint_that_fails_with_any_error_as_damaged(
    tmp_path, monkeypatch, capsys
):
    _save(tmp_path, "step10", 10)
    newer = _save(tmp_path, "step20", 20)
    real_load = unitrain.checkpoint.load_checkpoint

    def load_or_run_out_of_memory(path, **options):
        if Path(path) == newer:
            raise MemoryError("cannot allocate 200 GiB")
        return real_load(path, **options)

    monkeypatch.setattr(unitrain.checkpoint, "load_checkpoint", load_or_run_out_of_memory)
    assert main(["inspect", str(tmp_path)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step20")]
    assert "damaged" in line and "MemoryError" in line


def test_latest_warns_about_a_checkpoint_whose_trainer_json_is_truncated(tmp_path):
    older, newer = _save(tmp_path, "step10", 10), _save(tmp_path, "step20", 20)
    trainer_file = newer / "trainer.json"
    trainer_file.write_bytes(trainer_file.read_bytes()[:10])
    with pytest.warns(CheckpointWarning, match="step20"):
        assert resolve_checkpoint("latest", tmp_path) == older


def _numpy_trainer() -> Trainer:
    return Trainer(models.MLP((4, 3, 2)), backend="numpy")


def _model_tensors(trainer: Trainer) -> dict[str, np.ndarray]:
    return {
        name.removeprefix("model."): value
        for name, value in trainer.backend.state_dict().items()
        if name.startswith("model.")
    }


def _with_bad_weight(weights: dict[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    weights = {name: np.array(value) for name, value in weights.items()}
    name = "layers.0.weight"
    if how == "nan":
        weights[name][0, 0] = np.nan
    elif how == "missing":
        del weights[name]
    elif how == "extra":
        weights["layers.9.weight"] = np.zeros((2, 2), np.float32)
    elif how == "shape":
        weights[name] = np.zeros((3, 4), np.float32)
    else:  # a dtype
        weights[name] = weights[name].astype(how)
    return weights


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("nan", r"model\.safetensors: tensor 'layers\.0\.weight' holds 1 NaN"),
        ("int32", r"model\.safetensors: tensor 'layers\.0\.weight' has dtype int32"),
        ("float64", r"model\.safetensors: tensor 'layers\.0\.weight' has dtype float64"),
        ("complex64", r"model\.safetensors: tensor 'layers\.0\.weight' has dtype complex64"),
        ("missing", r"missing keys \['model\.layers\.0\.weight'\]"),
        ("extra", r"unexpected keys \['model\.layers\.9\.weight'\]"),
    ],
)
def test_load_weights_refuses_tensors_that_do_not_fit_the_model(tmp_path, how, expected):
    trainer = _numpy_trainer()
    before = trainer.backend.state_dict()
    bad = _with_bad_weight(_model_tensors(trainer), how)
    checkpoint = _save(tmp_path, "bad", 1, model=bad)
    with pytest.raises(CheckpointError, match=expected):
        trainer.load_weights(checkpoint)
    after = trainer.backend.state_dict()
    assert all(np.array_equal(before[name], after[name]) for name in before)


def test_load_weights_takes_a_checkpoint_of_the_same_model(tmp_path):
    source = _numpy_trainer()
    target = Trainer(models.MLP((4, 3, 2)), backend="numpy", config=TrainerConfig(seed=1))
    assert not np.array_equal(
        _model_tensors(target)["layers.0.weight"], _model_tensors(source)["layers.0.weight"]
    )
    checkpoint = source.save_checkpoint(tmp_path / "good")
    target.load_weights(checkpoint)
    for name, value in _model_tensors(source).items():
        np.testing.assert_array_equal(_model_tensors(target)[name], value)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("shape", r"layers\.0\.weight: expected shape \(4, 3\), got \(3, 4\)"),
        ("missing", r"missing keys \['model\.layers\.0\.weight'\]"),
        ("nan", r"model\.safetensors: tensor 'layers\.0\.weight' holds 1 NaN"),
        ("int32", r"model\.safetensors: tensor 'layers\.0\.weight' has dtype int32"),
    ],
)
def test_export_weights_refuses_a_checkpoint_whose_tensors_do_not_fit_its_model(
    tmp_path, how, expected
):
    saved = load_checkpoint(_numpy_trainer().save_checkpoint(tmp_path / "good"))
    trainer_state = {k: v for k, v in saved.trainer.items() if k != "format_version"}
    bad = save_checkpoint(
        tmp_path / "bad",
        model=_with_bad_weight(saved.model, how),
        optimizer=saved.optimizer,
        trainer=trainer_state,
        callbacks=saved.callbacks,
    )
    with pytest.raises(CheckpointError, match=expected):
        export_weights(bad, "keras")
    assert [w.shape for w in export_weights(saved.path, "keras")] == [(4, 3), (3,), (3, 2), (2,)]


def test_inspect_escapes_control_characters_from_the_checkpoint(tmp_path, capsys):
    hostile = "w\x1b[2J\x1b]0;owned\x07"
    weights = {hostile: np.zeros(2, np.float32)}
    trainer = {"epoch": 0, "step": 1, "backend": hostile, "history": [{"note": hostile}]}
    checkpoint = save_checkpoint(
        tmp_path / f"ck{hostile}", model=weights, optimizer={}, trainer=trainer
    )
    assert main(["inspect", str(checkpoint)]) == 0
    assert main(["inspect", str(tmp_path)]) == 0
    (checkpoint / "trainer.json").write_bytes(b"{")  # damaged: listed with its error
    assert main(["inspect", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out and "\x07" not in printed.out
    assert "\x1b" not in printed.err
    assert r"w\x1b[2J" in printed.out


def test_export_weights_refuses_a_checkpoint_whose_config_dtype_is_not_a_float(tmp_path):
    saved = load_checkpoint(_numpy_trainer().save_checkpoint(tmp_path / "good"))
    trainer_state = {k: v for k, v in saved.trainer.items() if k != "format_version"}
    trainer_state["config"] = {**trainer_state["config"], "dtype": "int8"}
    bad = save_checkpoint(
        tmp_path / "bad",
        model=saved.model,
        optimizer=saved.optimizer,
        trainer=trainer_state,
        callbacks=saved.callbacks,
    )
    with pytest.raises(CheckpointError, match=r"trainer\.json: 'config\.dtype' must be one of"):
        export_weights(bad, "keras")


def test_running_out_of_memory_while_loading_is_a_checkpoint_error(tmp_path, monkeypatch):
    checkpoint = _save(tmp_path, "step20", 20)

    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate")

    # Where the reader allocates each tensor; a verified file may still not fit what is free.
    monkeypatch.setattr("unitrain.checkpoint._safetensors.np.empty", out_of_memory)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: its \d+ bytes of tensors"):
        load_checkpoint(checkpoint)
