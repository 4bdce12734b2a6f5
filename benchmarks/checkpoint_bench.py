"""Checkpoint save/load of a 100M-parameter model, and the cost of resuming mid-epoch.

``python -m benchmarks.checkpoint_bench [--repeats N] [--params N] [--dir DIR]`` prints one
JSON object:

- ``checkpoint``: seconds to save and to load ~100M float32 parameters (24 layers of
  2048x2048 + bias, 403 MB) through :mod:`unitrain.checkpoint`, against writing and reading
  the same arrays with ``safetensors.numpy`` directly (``save_file``/``load_file``), and
  against safetensors plus the ``fsync`` that unitrain's atomic save does, interleaved.
  unitrain is timed twice: ``save_checkpoint`` (durable when it returns) and
  ``CheckpointWriter.save`` (what ``ModelCheckpoint`` does by default: the time the caller is
  blocked, with the digest, fsync and rename finished by a background thread, whose end is
  recorded as ``until_durable``);
- ``resume``: seconds from ``Trainer.fit(resume=...)`` to the end of the first update after
  it, from a checkpoint taken mid-epoch in epoch 1 and one taken at the same batch of epoch
  50 (the numpy backend, so only unitrain's own work is timed), interleaved, plus the time
  :meth:`unitrain.ArrayLoader.batches` takes to reach a batch at either position.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["STEADY_MEMORY_ENV", "bench_checkpoint", "bench_resume", "checkpoint_arrays"]

#: glibc settings under which the process keeps the memory of freed 400 MB arrays, so every
#: method's load fills memory in the same state. Without them a load's time depends on whether
#: the previous round gave its memory back to the kernel: on this VM, which reports freed
#: memory to its host, touching such memory again made ``load_file`` alone swing from 0.03 s
#: to 0.16 s with no code change. ``run.py`` sets them for this benchmark's process.
STEADY_MEMORY_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(10**11),
}

_LAYER = 2048


def checkpoint_arrays(num_params: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 layers of ``2048 x 2048`` weights plus bias, at least ``num_params`` in all."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    total, index = 0, 0
    while total < num_params:
        arrays[f"layers.{index}.weight"] = rng.random((_LAYER, _LAYER), dtype=np.float32)
        arrays[f"layers.{index}.bias"] = rng.random(_LAYER, dtype=np.float32)
        total += _LAYER * _LAYER + _LAYER
        index += 1
    return arrays


def _fsync_file(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def bench_checkpoint(num_params: int, repeats: int, directory: Path) -> dict[str, Any]:
    """Interleaved save/load timings of unitrain.checkpoint and safetensors (see module doc)."""
    import safetensors.numpy

    from unitrain.checkpoint import (
        CheckpointWriter,
        load_checkpoint,
        remove_checkpoint,
        save_checkpoint,
    )

    arrays = checkpoint_arrays(num_params)
    count = sum(a.size for a in arrays.values())
    writer = CheckpointWriter()
    until_durable: list[float] = []

    def unitrain_round(background: bool) -> tuple[float, float]:
        path = directory / "unitrain-checkpoint"
        state: dict[str, Any] = {
            "model": arrays,
            "optimizer": {},
            "trainer": {"epoch": 0, "step": 0},
        }
        started = time.perf_counter()
        if background:
            writer.save(path, **state)
            saved = time.perf_counter()
            writer.wait()
            until_durable.append(time.perf_counter() - started)
        else:
            save_checkpoint(path, **state)
            saved = time.perf_counter()
        loading = time.perf_counter()
        loaded = load_checkpoint(path)
        done = time.perf_counter()
        assert np.array_equal(loaded.model["layers.0.weight"], arrays["layers.0.weight"])
        del loaded
        remove_checkpoint(path)
        return saved - started, done - loading

    def safetensors_round(fsync: bool) -> tuple[float, float]:
        path = directory / "direct.safetensors"
        started = time.perf_counter()
        safetensors.numpy.save_file(arrays, str(path))
        if fsync:
            _fsync_file(path)
        saved = time.perf_counter()
        loaded = safetensors.numpy.load_file(str(path))
        done = time.perf_counter()
        assert np.array_equal(loaded["layers.0.weight"], arrays["layers.0.weight"])
        del loaded
        path.unlink()
        return saved - started, done - saved

    rounds = {
        "unitrain": lambda: unitrain_round(False),
        "unitrain background": lambda: unitrain_round(True),
        "safetensors": lambda: safetensors_round(False),
        "safetensors+fsync": lambda: safetensors_round(True),
    }
    timings: dict[str, dict[str, list[float]]] = {k: {"save": [], "load": []} for k in rounds}
    rng = np.random.default_rng(0)
    names = list(rounds)
    for name in names:  # untimed: the first write of 403 MB to a new file is 2-5x slower
        rounds[name]()
    until_durable.clear()
    for _ in range(repeats):
        for index in rng.permutation(len(names)):
            save, load = rounds[names[index]]()
            timings[names[index]]["save"].append(save)
            timings[names[index]]["load"].append(load)
    medians = {k: {op: statistics.median(v) for op, v in t.items()} for k, t in timings.items()}
    return {
        "parameters": int(count),
        "megabytes": count * 4 / 1e6,
        "repeats": repeats,
        "seconds": timings,
        "median_seconds": medians,
        "until_durable_seconds": until_durable,
        "ratio": {
            op: medians["unitrain"][op] / medians["safetensors"][op] for op in ("save", "load")
        },
        "ratio_background_save": medians["unitrain background"]["save"]
        / medians["safetensors"]["save"],
        "ratio_to_fsynced": {
            op: medians["unitrain"][op] / medians["safetensors+fsync"][op]
            for op in ("save", "load")
        },
    }


class _Stop(Exception):
    """Ends a benchmark run from inside a callback."""


class _SaveAt:
    """Saves checkpoints at given ``(epoch, batch)`` positions; stops after the last one."""

    def __init__(self, positions: dict[tuple[int, int], Path]) -> None:
        self.positions = dict(positions)

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        path = self.positions.pop((trainer.state.epoch, batch), None)
        if path is not None:
            trainer.save_checkpoint(path)
            if not self.positions:
                raise _Stop


class _StopAfterFirstUpdate:
    def __init__(self) -> None:
        self.at = 0.0

    def on_batch_end(self, trainer: Any, batch: int, logs: dict[str, Any]) -> None:
        self.at = time.perf_counter()
        raise _Stop


def bench_resume(repeats: int, directory: Path, epoch: int = 50) -> dict[str, Any]:
    """Resume cost mid-epoch at epoch 1 and at ``epoch`` (see the module doc)."""
    from unitrain import ArrayLoader, Trainer, TrainerConfig, models, optim

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8192, 32), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    loader = ArrayLoader(x, y, batch_size=32, seed=0)
    middle = len(loader) // 2

    def trainer(callbacks: list[Any]) -> Trainer:
        return Trainer(
            models.MLP((32, 64, 10)),
            backend="numpy",
            optimizer=optim.SGD(momentum=0.9),
            callbacks=callbacks,
            config=TrainerConfig(epochs=epoch + 10, log_every_n_steps=len(loader)),
        )

    checkpoints = {1: directory / "resume-epoch-1", epoch: directory / f"resume-epoch-{epoch}"}
    started = time.perf_counter()
    with contextlib.suppress(_Stop):
        trainer([_SaveAt({(e, middle): p for e, p in checkpoints.items()})]).fit(loader)
    training_seconds = time.perf_counter() - started

    def resume(at: int) -> float:
        stopper = _StopAfterFirstUpdate()
        begin = time.perf_counter()
        with contextlib.suppress(_Stop):
            trainer([stopper]).fit(loader, resume=checkpoints[at])
        return stopper.at - begin

    def seek(at: int) -> float:
        begin = time.perf_counter()
        next(loader.batches(at, middle))
        return time.perf_counter() - begin

    timings: dict[int, dict[str, list[float]]] = {
        e: {"resume": [], "seek": []} for e in checkpoints
    }
    resume(1)  # first use imports and warms the numpy backend
    order = list(checkpoints)
    for r in range(3 * max(repeats, 5)):  # each resume takes milliseconds: more rounds, less noise
        for at in order if r % 2 == 0 else reversed(order):
            timings[at]["resume"].append(resume(at))
            timings[at]["seek"].append(seek(at))
    medians = {e: {k: statistics.median(v) for k, v in t.items()} for e, t in timings.items()}
    return {
        "batches_per_epoch": len(loader),
        "resumed_at_batch": middle,
        "epochs": list(checkpoints),
        "training_to_checkpoints_seconds": training_seconds,
        "seconds": {str(e): t for e, t in timings.items()},
        "median_seconds": {str(e): m for e, m in medians.items()},
        "ratio": medians[epoch]["resume"] / medians[1]["resume"],
        "batches_a_replay_would_skip": {str(e): e * len(loader) + middle for e in checkpoints},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (a temp dir)")
    parser.add_argument("--skip-checkpoint", action="store_true")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="unitrain-bench-", dir=args.dir))
    try:
        result: dict[str, Any] = {}
        if not args.skip_checkpoint:
            result["checkpoint"] = bench_checkpoint(args.params, args.repeats, directory)
        result["resume"] = bench_resume(args.repeats, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
