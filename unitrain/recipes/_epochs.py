"""Schedule lengths written in epochs in a recipe given as data, turned into update counts.

Schedules count optimizer updates, and a Python recipe computes them from its data and
config (the digits recipe: one epoch of warmup, then a cosine over the epochs after it). A
TOML recipe is data and cannot compute, so its step counts were fixed numbers: ``--set
config.epochs=3`` then left the cosine sized for ten epochs, ending at lr 0.0887 where the
Python recipe ends at 0.001. Written in epochs (``"1 epoch"``, ``"(config.epochs - 1)
epochs"``), the count follows the config the recipe is finally read with, ``--set``
included, by the same rule as the Python recipe.

``config.epochs`` in a length is the run's length in epochs: with ``config.max_steps`` set
and reached first, ``max_steps`` divided by the updates in one epoch (a fraction), so a
cosine written as ``"(config.epochs - 1) epochs"`` ends where ``max_steps`` ends the run.
"""

from __future__ import annotations

import math
import re
from typing import Any

from unitrain._errors import ConfigError
from unitrain.training.config import TrainerConfig, run_updates

__all__ = ["schedule_in_updates", "updates_per_epoch"]

#: ``2 epochs``, ``0.5 epochs``, ``config.epochs epochs``, ``(config.epochs - 1) epochs``.
_IN_EPOCHS = re.compile(
    r"\s*\(?\s*(?:(?P<run>config\.epochs)\s*(?:-\s*(?P<less>\d+(?:\.\d*)?))?"
    r"|(?P<count>\d+(?:\.\d*)?))\s*\)?\s*epochs?\s*"
)


def updates_per_epoch(train_size: int, config: TrainerConfig) -> int:
    """Optimizer updates in one epoch: batches (the last one may be short) per accumulation.

    Examples:
        >>> updates_per_epoch(1438, TrainerConfig(batch_size=32))
        45
        >>> updates_per_epoch(1438, TrainerConfig(batch_size=32, grad_accum_steps=2))
        23
    """
    return math.ceil(math.ceil(train_size / config.batch_size) / config.grad_accum_steps)


def schedule_in_updates(table: Any, data: Any, config: TrainerConfig) -> Any:
    """``table`` (a schedule's fields, nested) with each length written in epochs counted in
    updates; other values are kept. A length comes out at least 1 (a one-epoch run's cosine
    after a one-epoch warmup), as the digits recipe's does.

    Args:
        table: the ``[schedule]`` table as read.
        data: the recipe's data; its ``train_size`` gives the updates per epoch.
        config: the run's config, after ``--set``.

    Raises:
        ConfigError: a length is in epochs but the data does not know its ``train_size``.

    Examples:
        >>> from unitrain.recipes import Digits
        >>> table = {"type": "warmup", "warmup_steps": "1 epoch",
        ...          "schedule": {"decay_steps": "(config.epochs - 1) epochs"}}
        >>> schedule_in_updates(table, Digits(), TrainerConfig(epochs=3))
        {'type': 'warmup', 'warmup_steps': 45, 'schedule': {'decay_steps': 90}}
        >>> schedule_in_updates(table, Digits(), TrainerConfig(epochs=3, max_steps=100))
        {'type': 'warmup', 'warmup_steps': 45, 'schedule': {'decay_steps': 55}}
    """
    if isinstance(table, dict):
        return {key: schedule_in_updates(value, data, config) for key, value in table.items()}
    if isinstance(table, list):
        return [schedule_in_updates(value, data, config) for value in table]
    if not isinstance(table, str) or not (found := _IN_EPOCHS.fullmatch(table)):
        return table
    train_size = getattr(data, "train_size", None)
    if not isinstance(train_size, int):
        raise ConfigError(
            f"schedule: {table!r} is a length in epochs, but the data ({type(data).__name__}) "
            "has no train_size to count an epoch's updates; write the length in updates"
        )
    per_epoch = updates_per_epoch(train_size, config)
    batches = math.ceil(train_size / config.batch_size)
    run_epochs = run_updates(config, batches) / per_epoch  # config.epochs, or max_steps sooner
    epochs = run_epochs - float(found["less"] or 0) if found["run"] else float(found["count"])
    return max(round(epochs * per_epoch), 1)
