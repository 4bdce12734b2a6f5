"""The default recipe: an MLP on the digits, one epoch of warmup then cosine decay, early stop.

``unitrain train`` runs it when no recipe is named (``unitrain train digits`` names it).
Written as any recipe file is: ``recipe()`` returns a :class:`unitrain.recipes.Recipe`.
"""

from __future__ import annotations

import math

from unitrain import callbacks, optim, schedules
from unitrain.models import MLP
from unitrain.recipes import Digits, Recipe
from unitrain.recipes._epochs import updates_per_epoch
from unitrain.training.config import TrainerConfig, run_updates


def recipe(config: TrainerConfig | None = None) -> Recipe:
    """MLP 64-128-10 (ReLU), SGD momentum 0.9, batch 32, 10 epochs, checkpoint every epoch.

    Given a config (``--set config.epochs=3``), the schedule is sized to its epochs, or to
    ``max_steps`` when that ends the run sooner (the warmup then at most the whole run).
    """
    data = Digits()
    config = config or TrainerConfig(epochs=10, batch_size=32, log_every_n_steps=12)
    # The rule a TOML recipe writes as "1 epoch" and "(config.epochs - 1) epochs".
    steps_per_epoch = updates_per_epoch(data.train_size, config)
    total = run_updates(config, math.ceil(data.train_size / config.batch_size))
    warmup_steps = min(steps_per_epoch, total)
    decay_steps = max(total - steps_per_epoch, 1)  # the epochs after the warmup
    return Recipe(
        name="digits",
        model=MLP((64, 128, 10)),
        data=data,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Warmup(
            schedules.CosineDecay(0.1, decay_steps=decay_steps, min_lr=1e-3),
            warmup_steps=warmup_steps,
        ),
        callbacks=[
            callbacks.EarlyStopping("val_loss", patience=3),
            callbacks.ModelCheckpoint(every_n_epochs=1, keep_last=3),
        ],
        config=config,
        metrics=["accuracy"],
    )
