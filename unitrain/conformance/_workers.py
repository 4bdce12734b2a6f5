"""The data-parallel experiment the kit runs on N workers and on one, and its worker program.

:func:`experiment` trains a small classifier for :data:`EPOCHS` epochs with a checkpoint every epoch
and a JSON-lines log (run ``a``), then resumes a fresh Trainer from run ``a``'s checkpoint after
epoch 1 into another directory (run ``b``), then trains the same recipe with dropout :data:`DROPOUT`
(run ``c``): each worker's masks then shape the weights, which must be the simulated workers' (see
:func:`unitrain.backends.strategy.dropout_index`). Rank 0 saves the runs' final state and history.
Run as a program (``python -m unitrain.conformance._workers TARGET
DTYPE[,DTYPE...] OUT``, one ``OUT/DTYPE`` each) under a backend's launcher, every worker
executes it and the Trainer takes its place from the launcher's environment; in process,
``strategy`` says how many workers to simulate. With ``--local-devices=N`` first, one
process runs ``a`` and ``b`` on the backend's ``local_devices_strategy(N)`` (with ``--shard``
next, its ``sharded_strategy(N)``), made before anything else (the caller sets
``local_devices_environment(N)``), with batches of :data:`LOCAL_BATCH`; run ``c`` is left
out, as such a strategy may draw one worker's masks or N workers'.

Every worker records that it finished (``OUT/DTYPE/finished/rank-R``) and, when it fails, its
traceback (``OUT/errors/PID.txt``): a launcher that exits 0 although a worker died, or that
drops the workers' output, still leaves the kit what it needs to say so.

The global batch of 15 splits 8/7 on two workers and the last batch of each epoch (5
examples) 3/2, so the weighting of uneven slices is exercised on every epoch.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import callbacks, optim, schedules
from unitrain.models import MLP
from unitrain.training.config import TrainerConfig
from unitrain.training.trainer import Trainer

__all__ = [
    "DROPOUT",
    "EPOCHS",
    "LOCAL_BATCH",
    "RESUME_EPOCH",
    "data",
    "experiment",
    "finished_ranks",
    "read_result",
    "train",
    "worker_errors",
]

#: Early stopping (patience 1, min_delta 0.05) ends the run after 3 of these epochs, so the
#: kit sees a stopping decision taken before the last epoch.
EPOCHS = 5
#: Run ``b`` resumes from the checkpoint written after this many epochs.
RESUME_EPOCH = 1
BATCH = 15
#: The batch of the local-devices runs: 50 examples make batches of 16, 16, 16 and 2, each
#: split evenly over 2 devices (JAX computes a batch that does not divide on every device).
LOCAL_BATCH = 16
#: The dropout rate of run ``c``.
DROPOUT = 0.3


def data(dtype: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Training (50 examples) and validation (20) arrays of three separable blobs."""
    generator = np.random.default_rng(13)
    centers = generator.normal(size=(3, 6)) * 2.0
    host = np.float64 if dtype == "float64" else np.float32

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = generator.integers(0, 3, n)
        return (centers[labels] + generator.normal(size=(n, 6))).astype(host), labels

    return draw(50), draw(20)


def train(
    backend: Any,
    dtype: str,
    directory: Path,
    strategy: Any,
    resume: Path | None = None,
    dropout: float = 0.0,
    batch: int = BATCH,
) -> Trainer:
    """One run of the experiment's recipe, checkpointing every epoch into ``directory``."""
    (x, y), val = data(dtype)
    config = TrainerConfig(
        epochs=EPOCHS,
        batch_size=batch,
        seed=0,
        device="cpu",
        dtype=dtype,
        deterministic=True,
        log_every_n_steps=2,
        checkpoint_dir=str(directory / "checkpoints"),
    )
    hooks = [
        callbacks.ModelCheckpoint(directory / "checkpoints", every_n_epochs=1),
        callbacks.JSONLLogger(directory / "metrics.jsonl"),
        callbacks.EarlyStopping("val_loss", patience=1, min_delta=0.05),
    ]
    trainer = Trainer(
        MLP((6, 16, 3), activation="tanh", dropout=dropout),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Warmup(schedules.CosineDecay(0.2, 12, 1e-3), warmup_steps=3),
        callbacks=hooks,
        config=config,
        strategy=strategy,
    )
    trainer.fit((x, y), val, resume=resume)
    return trainer


def _save(trainer: Trainer, directory: Path) -> None:
    state = trainer.backend.state_dict()  # on every worker: a sharded model is gathered
    if not trainer.strategy.is_main:
        return
    from unitrain.backends.strategy import SimulatedWorkers

    np.savez(directory / "final.npz", **state)
    strategy = type(trainer.strategy)
    outcome = {
        "strategy": f"{strategy.__module__}.{strategy.__qualname__}",
        "simulated": isinstance(trainer.strategy, SimulatedWorkers),
        "world_size": trainer.strategy.world_size,
        "epoch": trainer.state.epoch,
        "step": trainer.state.step,
        "stop_training": trainer.state.stop_training,
        "history": [{k: row[k] for k in ("epoch", "step", "lr")} for row in trainer.history],
    }
    (directory / "outcome.json").write_text(json.dumps(outcome), encoding="utf-8")


def experiment(
    backend: Any, dtype: str, out: Path, strategy: Any = None, local_devices: bool = False
) -> None:
    """Run ``a`` (uninterrupted), ``b`` (resumed after epoch 1) and ``c`` (with dropout)
    under ``out``; for a local-devices strategy (or its one-device reference), ``a`` and ``b``
    with batches of :data:`LOCAL_BATCH`. Then mark this worker finished."""
    batch = LOCAL_BATCH if local_devices else BATCH
    first = train(backend, dtype, out / "a", strategy, batch=batch)
    _save(first, out / "a")
    checkpoint = resume_point(out / "a")
    _save(train(backend, dtype, out / "b", strategy, resume=checkpoint, batch=batch), out / "b")
    if not local_devices:
        _save(train(backend, dtype, out / "c", strategy, dropout=DROPOUT), out / "c")
    marks = out / "finished"
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"rank-{first.strategy.rank}").write_text(str(first.strategy.world_size))


def finished_ranks(out: Path) -> set[int]:
    """The workers that finished the experiment in ``out`` (one dtype's directory)."""
    marks = out / "finished"
    names = marks.iterdir() if marks.is_dir() else ()
    return {int(path.name.partition("-")[2]) for path in names}


def worker_errors(out: Path) -> list[str]:
    """The tracebacks of workers that failed, as they recorded them under ``out``."""
    folder = out / "errors"
    files = sorted(folder.iterdir()) if folder.is_dir() else []
    return [path.read_text(encoding="utf-8", errors="replace") for path in files]


def resume_point(directory: Path) -> Path:
    """The checkpoint of run ``directory`` written after :data:`RESUME_EPOCH` epochs."""
    from unitrain.checkpoint import list_checkpoints

    for path in list_checkpoints(directory / "checkpoints"):
        info = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
        if info["epoch"] == RESUME_EPOCH and info["batch"] == 0:
            return path
    raise AssertionError(f"no checkpoint after epoch {RESUME_EPOCH} in {directory}")


def read_result(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A run's final state dict and outcome, as rank 0 saved them."""
    with np.load(directory / "final.npz", allow_pickle=False) as saved:
        state = {key: saved[key] for key in saved.files}
    return state, json.loads((directory / "outcome.json").read_text(encoding="utf-8"))


def _main(arguments: list[str]) -> None:
    try:
        _experiments(list(arguments))
    except BaseException:  # recorded for the kit, whatever the launcher does with stderr
        errors = Path(arguments[-1]) / "errors"
        errors.mkdir(parents=True, exist_ok=True)
        (errors / f"{os.getpid()}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        raise


def _experiments(arguments: list[str]) -> None:
    local = None
    if arguments[0].startswith("--local-devices="):
        from unitrain.backends.registry import get_backend
        from unitrain.backends.strategy import LocalDeviceParallel

        devices = int(arguments.pop(0).partition("=")[2])
        shard = arguments[0] == "--shard"  # the kit's sharded family: the state split too
        arguments = arguments[1:] if shard else arguments
        factory = get_backend(arguments[0])
        assert isinstance(factory, LocalDeviceParallel), factory  # the kit checked it
        maker = getattr(factory, "sharded_strategy" if shard else "local_devices_strategy")
        local = maker(devices)  # before anything else
    # One launch runs every dtype asked for (comma-separated): starting workers costs seconds.
    target, dtype_names, output = arguments
    for dtype_name in dtype_names.split(","):
        experiment(target, dtype_name, Path(output) / dtype_name, local, local is not None)


if __name__ == "__main__":
    _main(sys.argv[1:])
