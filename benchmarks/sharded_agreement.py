"""Sharded workers against one, on the character Transformer (docs/scaling-out.md).

The decoder of ``examples/papers/char_transformer.py`` (learned token and position
embeddings, causal pre-LN blocks, Adam with betas 0.9/0.98 under the inverse square root
schedule), at a size a 2-core CPU trains in minutes: windows of 64 characters, width 64, 2
blocks of 4 heads, the first 1,024 training windows and 256 held out, batches of 32, float32,
with early stopping on the validation loss (patience 1, min_delta 0.02, so the decision is
taken and can differ). Each worker count trains the same global batches; rank 0 saves the
final state (gathered) and the history, and the comparison prints, for each sharded count
against one unsharded worker, the largest relative difference of the weights and of the
optimizer state (``max |a - b| / max |b|`` per tensor, the largest over tensors), the largest
difference of the validation losses, and the epoch each stopped at.

The attention's key bias is left out of the weights' and optimizer's figures and reported on
its own: it adds ``q . b`` to every score of a query alike, which the softmax cancels, so its
gradient is zero in exact arithmetic and in float32 is rounding noise (about 1e-12 here),
which Adam's division by the noise's own square root turns into steps of the learning rate's
size in a random direction. Its value is therefore noise on every engine, one device
included, and has no effect on any output (the validation losses show it).

    python benchmarks/sharded_agreement.py torch 1,2,4     # torchrun workers (gloo)
    python benchmarks/sharded_agreement.py jax 1,2,4       # one process over N CPU devices

Results go to ``benchmarks/results/sharded_agreement-BACKEND.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LENGTH, DIM, DEPTH, HEADS, BATCH, EPOCHS = 64, 64, 2, 4, 32, 8
TRAIN, HELD_OUT = 1024, 256


def train(backend: str, out: Path) -> None:
    """One run (under whatever launcher started this process); rank 0 writes ``out``."""
    sys.path.insert(0, str(ROOT / "examples" / "papers"))
    from char_transformer import corpus, model

    from unitrain import Trainer, TrainerConfig, callbacks, optim, schedules

    x_train, y_train, x_val, y_val, vocabulary = corpus(LENGTH)
    steps = TRAIN // BATCH
    trainer = Trainer(
        model(vocabulary, LENGTH, DIM, DEPTH, HEADS),
        backend=backend,
        optimizer=optim.Adam(beta1=0.9, beta2=0.98, eps=1e-9),
        schedule=schedules.InverseSqrt(base_lr=2e-3, warmup_steps=steps // 2),
        callbacks=[callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.02)],
        config=TrainerConfig(
            epochs=EPOCHS, batch_size=BATCH, dtype="float32", seed=0, deterministic=True
        ),
    )
    trainer.fit((x_train[:TRAIN], y_train[:TRAIN]), (x_val[:HELD_OUT], y_val[:HELD_OUT]))
    state = trainer.backend.state_dict()  # every worker: a sharded model is gathered
    if trainer.strategy.is_main:
        history = [entry["val_loss"] for entry in trainer.history]
        np.savez(out, val_loss=np.array(history), epochs=len(history), **state)


def launch(backend: str, workers: int, out: Path) -> None:
    """Run :func:`train` on ``workers`` sharded workers (1: unsharded, one process)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "UNITRAIN_SHARD": "1" if workers > 1 else "0"}
    command = [sys.executable, __file__, "--worker", backend, str(out)]
    if backend == "torch" and workers > 1:
        from unitrain.backends.torch.distributed import launch_command

        command = [*launch_command(workers), __file__, "--worker", backend, str(out)]
    if backend == "jax":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={workers}"
    subprocess.run(command, check=True, env=env, cwd=ROOT)


def compare(one: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> dict[str, Any]:
    """The differences the module doc lists, of ``other`` against ``one``."""

    def worst(prefix: str, key_bias: bool = False) -> float:
        return max(
            float(np.max(np.abs(other[k] - v)) / max(float(np.max(np.abs(v))), 1e-30))
            for k, v in one.items()
            if k.startswith(prefix)
            and v.size
            and v.dtype.kind == "f"
            and (".attention.key.bias" in k) == key_bias
        )

    return {
        "weights": worst("model."),
        "optimizer": worst("optimizer."),
        "key_bias": worst("model.", key_bias=True),
        "val_loss": float(np.max(np.abs(other["val_loss"] - one["val_loss"])))
        if len(other["val_loss"]) == len(one["val_loss"])
        else None,
        "epochs": int(other["epochs"]),
    }


def main(backend: str, counts: list[int]) -> None:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        runs = {}
        for workers in counts:
            out = Path(folder) / f"{workers}.npz"
            launch(backend, workers, out)
            with np.load(out) as saved:
                runs[workers] = dict(saved)
        base = runs[counts[0]]
        results["one"] = {"epochs": int(base["epochs"]), "val_loss": base["val_loss"].tolist()}
        for workers in counts[1:]:
            results[str(workers)] = compare(base, runs[workers])
    print(json.dumps(results, indent=2))
    target = ROOT / "benchmarks" / "results" / f"sharded_agreement-{backend}.json"
    target.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        train(sys.argv[2], Path(sys.argv[3]))
    else:
        main(sys.argv[1], [int(n) for n in sys.argv[2].split(",")])
