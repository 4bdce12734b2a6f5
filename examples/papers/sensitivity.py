"""How far one float32 ulp in one initial weight moves a recipe's run, epoch by epoch.

    python examples/papers/sensitivity.py vae --backend torch
    python examples/papers/sensitivity.py vae --backend torch --dtype float64
    python examples/papers/sensitivity.py word_language_model --backend torch --stop-after 1

Trains the recipe of ``<name>.py`` (beside this file) twice on one backend: as it is, and
with one initial weight moved up to the next float32 number at the start of training (the
first element of ``--weight``, by default the first matrix of the model in name order), then
prints each epoch's validation losses and their relative difference. Put beside the spread
between backends, it tells whether backends part because they compute different things or
because the training amplifies any rounding: ``README.md`` has the VAE's table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
from typing import Any

import numpy as np

from unitrain import Trainer, callbacks


class NudgeWeight(callbacks.Callback):
    """Moves the first element of one weight to the next float32 number above it."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def on_train_begin(self, trainer: Any) -> None:
        """Read the backend's state, change one number, load it back."""
        state = dict(trainer.backend.state_dict())
        matrices = sorted(k for k, v in state.items() if k.startswith("model.") and v.ndim > 1)
        name = self.name or matrices[0]
        if name not in state:
            raise SystemExit(f"--weight {name!r} is not in the model; its matrices: {matrices}")
        weight = np.array(state[name])
        flat = weight.reshape(-1)
        flat[0] = np.nextafter(np.float32(flat[0]), np.float32(np.inf))
        state[name] = weight
        trainer.backend.load_state_dict(state)
        print(f"moved {name}[0] by one float32 ulp")


def validation_losses(recipe: Any, backend: str, extra: list[Any]) -> list[float]:
    """Train ``recipe`` on ``backend`` with ``extra`` callbacks; each validation's loss."""
    trainer = Trainer(
        recipe.model,
        backend=backend,
        optimizer=recipe.optimizer,
        schedule=recipe.schedule,
        loss=recipe.loss,
        metrics=recipe.metrics,
        callbacks=[*recipe.callbacks, *extra],
        config=recipe.config,
    )
    trainer.fit(*recipe.data)
    return [row["val_loss"] for row in trainer.history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="a recipe file beside this one, without .py: vae, ...")
    parser.add_argument("--backend", default=os.environ.get("UNITRAIN_BACKEND"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--stop-after", type=int, help="train only this many epochs")
    parser.add_argument("--weight", help="the weight to move, e.g. model.decoder.0.weight")
    args = parser.parse_args()
    recipe = importlib.import_module(args.recipe).recipe()
    config = dataclasses.replace(recipe.config, dtype=args.dtype, device="cpu")
    if args.stop_after:
        config = dataclasses.replace(config, epochs=args.stop_after)
    recipe = dataclasses.replace(recipe, config=config)
    as_is = validation_losses(recipe, args.backend, [])
    moved = validation_losses(recipe, args.backend, [NudgeWeight(args.weight)])
    print("| epoch | val_loss | one weight 1 ulp off | relative difference |")
    print("| --- | --- | --- | --- |")
    for epoch, (a, b) in enumerate(zip(as_is, moved), start=1):
        print(f"| {epoch} | {a:.7f} | {b:.7f} | {abs(b - a) / abs(a):.1e} |")


if __name__ == "__main__":
    main()
