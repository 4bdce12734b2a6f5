"""A float64 torch run with a checkpoint after every epoch, for test_sharded's resume and
kill tests: on one process, or on torchrun workers with ``UNITRAIN_SHARD=1`` (sharded).

    python _sharded_resume_run.py OUT [RESUME] [KILL_EPOCH]

Checkpoints go to ``OUT/checkpoints``; rank 0 writes the final state to ``OUT/final.npz``.
``RESUME``: a checkpoint to resume from, ``latest``, or ``none``. ``KILL_EPOCH``: worker 1 kills
itself (SIGKILL) while the checkpoint of that epoch is being written — once its own shard
files are in the staging directory and before rank 0 has installed it (saves are slowed by
``UNITRAIN_CHECKPOINT_WRITE_DELAY``, which the test sets).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from unitrain import Trainer, TrainerConfig, callbacks, optim
from unitrain.models import MLP

EPOCHS, BATCH = 3, 16


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    return generator.normal(size=(n, 6)), generator.integers(0, 3, n)


def kill_while_saving(folder: Path, epoch: int) -> None:
    """Worker 1: SIGKILL this process once its rows of epoch ``epoch``'s checkpoint are
    written to the staging directory (a hidden ``.epoch=000E-...tmp-*`` folder)."""

    def watch() -> None:
        while True:
            for staging in folder.glob(f".epoch={epoch:04d}-*.tmp-*"):
                if (staging / "optimizer-00001-of-00004.safetensors").exists():
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


def main(out: Path, resume: str | None, kill_epoch: int | None) -> None:
    if kill_epoch is not None and os.environ.get("RANK") == "1":
        kill_while_saving(out / "checkpoints", kill_epoch)
    config = TrainerConfig(
        epochs=EPOCHS,
        batch_size=BATCH,
        dtype="float64",
        seed=0,
        deterministic=True,
        checkpoint_dir=str(out / "checkpoints"),
    )
    trainer = Trainer(
        MLP((6, 16, 16, 3), activation="tanh"),
        backend="torch",
        optimizer=optim.AdamW(weight_decay=0.01),
        callbacks=[callbacks.ModelCheckpoint(every_n_epochs=1)],
        config=config,
    )
    trainer.fit(data(64, 1), data(32, 2), resume=resume)
    state = trainer.backend.state_dict()  # every worker: the shards are gathered
    if trainer.strategy.is_main:
        losses = [entry["val_loss"] for entry in trainer.history]
        np.savez(
            out / "final.npz",
            world=getattr(trainer.strategy, "world_size", 1),
            val_loss=np.array(losses),
            **state,
        )


if __name__ == "__main__":
    out, resume, kill = [*sys.argv[1:], None, None][:3]
    assert out is not None, __doc__
    main(Path(out), None if resume in (None, "none") else resume, kill and int(kill))
