"""A worker of test_sharded_launched_jax: one run of a small Adam recipe on jax, launched as
several processes (``Sharded()``) or as one (``1``), and what the test asserts of it.

``python _sharded_launched_jax_run.py MODE OUT [RESUME]``; MODE ``sharded`` trains with
``Sharded()`` (under the launcher: over its processes), ``one`` on one process,
``refuse-3`` asks for ``Sharded(3)``. Every process writes ``OUT/rank-R.json``: the shapes of
its addressable pieces of each parameter; rank 0 writes ``OUT/final.npz`` (the full state,
read on every process), ``OUT/predict.npy`` (the outputs for the validation inputs) and the
validation losses and epochs into ``OUT/rank-0.json``.
``RESUME``: a checkpoint to resume from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from unitrain import ConfigError, callbacks, optim, schedules
from unitrain.backends.sharded import Sharded
from unitrain.conformance._workers import data
from unitrain.models import MLP
from unitrain.training.config import TrainerConfig
from unitrain.training.trainer import Trainer


def train(out: Path, strategy: object, resume: Path | None) -> Trainer:
    """Four epochs of a 6-16-3 MLP with dropout, Adam, clipping, a checkpoint every epoch."""
    (x, y), val = data("float32")
    config = TrainerConfig(
        epochs=4,
        batch_size=16,  # 16, 16, 16, 2: every batch splits evenly over two processes
        seed=0,
        device="cpu",
        deterministic=True,
        log_every_n_steps=2,
        grad_clip_norm=1.0,
        checkpoint_dir=str(out / "checkpoints"),
    )
    trainer = Trainer(
        MLP((6, 16, 3), activation="tanh", dropout=0.2),
        backend="jax",
        optimizer=optim.Adam(),
        schedule=schedules.CosineDecay(0.05, 16, 1e-3),
        callbacks=[callbacks.ModelCheckpoint(out / "checkpoints", every_n_epochs=1)],
        config=config,
        strategy=strategy,
    )
    trainer.fit((x, y), val, resume=resume)
    return trainer


def main(mode: str, out: Path, resume: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    strategy = {"sharded": Sharded(), "one": 1, "refuse-3": Sharded(3)}[mode]
    try:
        trainer = train(out, strategy, resume)
    except ConfigError as error:
        import jax

        (out / f"refused-{jax.process_index()}.txt").write_text(str(error), encoding="utf-8")
        return
    import jax

    params = jax.tree.leaves(trainer.backend._state.params)
    report = {
        "world_size": trainer.strategy.world_size,
        "pieces": [[list(s.data.shape) for s in leaf.addressable_shards] for leaf in params],
        "shapes": [list(leaf.shape) for leaf in params],
    }
    state = trainer.backend.state_dict()  # on every process: the rows are gathered
    outputs = trainer.predict(data("float32")[1][0])  # on every process: gathered too
    if trainer.strategy.is_main:
        np.savez(out / "final.npz", **state)
        np.save(out / "predict.npy", outputs)
        report["val_loss"] = [row["val_loss"] for row in trainer.history]
        report["epochs"] = trainer.state.epoch
    rank = getattr(trainer.strategy, "rank", 0)
    (out / f"rank-{rank}.json").write_text(json.dumps(report), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
