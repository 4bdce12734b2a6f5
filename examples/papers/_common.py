"""What the paper recipes share: the command line, the digits as images, one training run.

Each recipe builds a portable model and calls :func:`run`, which trains it on the backend
named by ``--backend`` (or ``UNITRAIN_BACKEND``) and writes the per-epoch history to
``<out>/<recipe>-<backend>.json``, the file the README's tables are made from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import ArrayLoader, Trainer, TrainerConfig, callbacks
from unitrain.recipes import Recipe, load_digits


def arguments(description: str, epochs: int, **extra: Any) -> argparse.Namespace:
    """Parse ``--backend``, ``--device``, ``--epochs``, ``--stop-after``, ``--out`` and
    ``extra`` (``--name`` options of the defaults' types)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", default=os.environ.get("UNITRAIN_BACKEND"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"))
    parser.add_argument("--epochs", type=int, default=epochs, help="length of the schedule")
    parser.add_argument(
        "--stop-after", type=int, help="train only this many epochs of the schedule"
    )
    parser.add_argument("--out", default="runs/papers")
    for name, default in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser.parse_args()


def digit_images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits split of :func:`unitrain.recipes.load_digits` as ``(N, 8, 8, 1)`` images."""
    split = load_digits()
    as_images = lambda x: x.reshape(-1, 8, 8, 1)  # noqa: E731  (pixels are row-major)
    return as_images(split.x_train), split.y_train, as_images(split.x_val), split.y_val


def run(
    recipe: str,
    args: argparse.Namespace,
    model: Any,
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    optimizer: Any,
    schedule: Any,
    batch_size: int,
) -> dict[str, Any]:
    """Train ``model`` deterministically in float32 and save the per-epoch history."""
    x_train, y_train, x_val, y_val = data
    train = ArrayLoader(x_train, y_train, batch_size=batch_size, seed=0)
    trainer = Trainer(
        model,
        backend=args.backend,
        optimizer=optimizer,
        schedule=schedule,
        callbacks=[callbacks.ProgressBar()],
        config=TrainerConfig(
            epochs=args.stop_after or args.epochs,
            batch_size=batch_size,
            device=args.device,
            deterministic=True,
        ),
    )
    return _fit_and_save(recipe, args, trainer, train, (x_val, y_val))


def train_recipe(name: str, args: argparse.Namespace, recipe: Recipe) -> dict[str, Any]:
    """Train a :class:`~unitrain.recipes.Recipe` whose data is a ``(train, val)`` pair.

    ``--stop-after K`` ends the run after K validations: K epochs, or K times
    ``val_every_n_steps`` updates for a recipe that validates by steps. Saves what :func:`run`
    saves, one row per validation.
    """
    config = recipe.config
    if args.stop_after and config.val_every_n_steps:
        config = dataclasses.replace(config, max_steps=args.stop_after * config.val_every_n_steps)
    elif args.stop_after:
        config = dataclasses.replace(config, epochs=args.stop_after)
    trainer = Trainer(
        recipe.model,
        backend=args.backend,
        optimizer=recipe.optimizer,
        schedule=recipe.schedule,
        loss=recipe.loss,
        metrics=recipe.metrics,
        callbacks=[callbacks.ProgressBar(), *recipe.callbacks],
        config=dataclasses.replace(config, device=args.device),
    )
    train, val = recipe.data
    return _fit_and_save(name, args, trainer, train, val)


def _fit_and_save(
    recipe: str, args: argparse.Namespace, trainer: Trainer, train: Any, val: Any
) -> dict[str, Any]:
    start = time.perf_counter()
    history = trainer.fit(train, val)
    seconds = time.perf_counter() - start
    rows = trainer.step_history or history  # validations by steps, else by epochs
    result = {
        "recipe": recipe,
        "backend": trainer.backend.name,
        "versions": trainer.backend.versions(),
        "seconds": round(seconds, 1),
        "history": [{k: v for k, v in row.items() if k != "seconds"} for row in rows],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{recipe}-{trainer.backend.name}.json").write_text(json.dumps(result, indent=1))
    last = result["history"][-1]
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in last.items() if k.startswith("val_"))
    print(f"{recipe} on {trainer.backend.name}: {metrics} ({seconds:.0f} s)")
    return result
