"""The recipe written once: an MLP on the digits data, run on any backend by a flag.

    python examples/digits_mlp.py --backend torch
    python examples/digits_mlp.py --backend numpy --epochs 5 --out runs/example

Nothing in the recipe below names a framework: ``--backend`` (or ``UNITRAIN_BACKEND``) picks
PyTorch, JAX, TensorFlow or the numpy reference, and every one starts from the same weights,
sees the same batches and applies the same update rule.
"""

from __future__ import annotations

import argparse
import os

from unitrain import ArrayLoader, Trainer, TrainerConfig, callbacks, models, optim, schedules
from unitrain.recipes import load_digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=os.environ.get("UNITRAIN_BACKEND"))
    parser.add_argument("--device", default="auto", choices=("cpu", "gpu", "auto"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", default="runs/digits_mlp")
    parser.add_argument("--resume", help="'auto', 'latest' or a checkpoint path")
    args = parser.parse_args()

    data = load_digits()
    train = ArrayLoader(data.x_train, data.y_train, batch_size=32, seed=0)
    warmup = len(train)  # one epoch, then cosine decay over the rest (at least one step)
    decay_steps = max(len(train) * args.epochs - warmup, 1)
    schedule = schedules.Warmup(
        schedules.CosineDecay(0.1, decay_steps=decay_steps, min_lr=1e-3), warmup_steps=warmup
    )
    trainer = Trainer(
        models.MLP((64, 128, 10), activation="relu"),
        backend=args.backend,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedule,
        callbacks=[
            callbacks.EarlyStopping("val_loss", patience=3, restore_best_weights=True),
            callbacks.ModelCheckpoint(every_n_epochs=1, keep_last=2, monitor="val_accuracy"),
            callbacks.JSONLLogger(f"{args.out}/metrics.jsonl"),
            callbacks.ProgressBar(),
        ],
        config=TrainerConfig(
            epochs=args.epochs, device=args.device, checkpoint_dir=f"{args.out}/checkpoints"
        ),
    )
    trainer.fit(train, (data.x_val, data.y_val), resume=args.resume)
    result = trainer.validate((data.x_val, data.y_val))
    print(f"{trainer.backend.name}: val_accuracy={result['val_accuracy']:.4f}")


if __name__ == "__main__":
    main()
