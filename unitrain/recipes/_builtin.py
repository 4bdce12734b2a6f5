"""Built-in recipes and their data: an MLP on scikit-learn's bundled digits.

``unitrain train`` runs the recipe file :mod:`unitrain.recipes.digits`; the parity tests of
every backend train :func:`default_trainer`, the same recipe as a function. The digits data
set (1,797 8x8 images, 10 classes) ships inside scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import callbacks as cb
from unitrain import schedules
from unitrain.data import ArrayLoader
from unitrain.models import MLP
from unitrain.optim import SGD
from unitrain.training.config import TrainerConfig
from unitrain.training.trainer import Trainer

__all__ = ["Digits", "DigitsSplit", "default_trainer", "load_digits"]

#: Examples in scikit-learn's digits data set.
DIGITS_EXAMPLES = 1797


@dataclasses.dataclass(frozen=True)
class DigitsSplit:
    """Train and validation arrays: float32 pixels scaled to [0, 1], int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


def load_digits(val_fraction: float = 0.2, seed: int = 0) -> DigitsSplit:
    """The digits data set, split into train and validation by a seeded permutation.

    Examples:
        >>> split = load_digits()
        >>> split.x_train.shape, split.x_val.shape, split.x_train.dtype
        ((1438, 64), (359, 64), dtype('float32'))
    """
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = round(len(x) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return DigitsSplit(x[train], y[train], x[val], y[val])


@dataclasses.dataclass(frozen=True)
class Digits:
    """The digits data set as a recipe's ``data``: :meth:`load` gives train and validation.

    Args:
        val_fraction: share of the examples held out for validation.
        seed: seeds the split (not the batch order, which ``TrainerConfig.seed`` sets).

    Examples:
        >>> Digits().train_size
        1438
    """

    val_fraction: float = 0.2
    seed: int = 0
    kind = "digits"

    @property
    def train_size(self) -> int:
        """Training examples, known without loading (recipes size their schedules by it)."""
        return DIGITS_EXAMPLES - round(DIGITS_EXAMPLES * self.val_fraction)

    def load(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """``((x_train, y_train), (x_val, y_val))``."""
        split = load_digits(self.val_fraction, self.seed)
        return (split.x_train, split.y_train), (split.x_val, split.y_val)

    def to_dict(self) -> dict[str, Any]:
        """JSON/TOML description: ``{"type": "digits", ...}``."""
        return {"type": self.kind, **dataclasses.asdict(self)}


def default_trainer(
    *,
    backend: Any = None,
    device: str = "auto",
    epochs: int = 10,
    seed: int = 0,
    out: str | Path | None = None,
    batch_size: int = 32,
    patience: int = 3,
    progress: bool | None = None,
    strategy: Any = None,
) -> tuple[Trainer, ArrayLoader, tuple[np.ndarray, np.ndarray]]:
    """Build the default recipe; return the Trainer, the train loader and validation arrays.

    The recipe: MLP 64-128-10 (ReLU), SGD with momentum 0.9, one epoch of linear warmup to
    LR 0.1 then cosine decay to 0.001 over the remaining epochs, batch 32, early stopping on
    ``val_loss`` with patience 3, and, when ``out`` is given, checkpoints every epoch (last
    three kept) in ``out/checkpoints`` and metrics in ``out/metrics.jsonl``. ``strategy``
    spreads it over workers (see :class:`~unitrain.training.trainer.Trainer`).
    """
    split = load_digits(seed=0)
    train = ArrayLoader(split.x_train, split.y_train, batch_size, seed=seed)
    steps_per_epoch = len(train)
    total = steps_per_epoch * epochs
    schedule = schedules.Warmup(
        schedules.CosineDecay(0.1, decay_steps=max(total - steps_per_epoch, 1), min_lr=1e-3),
        warmup_steps=steps_per_epoch,
    )
    hooks: list[Any] = [cb.EarlyStopping("val_loss", patience=patience), cb.ProgressBar(progress)]
    checkpoint_dir = None
    if out is not None:
        checkpoint_dir = str(Path(out) / "checkpoints")
        hooks += [
            cb.JSONLLogger(Path(out) / "metrics.jsonl"),
            cb.ModelCheckpoint(checkpoint_dir, every_n_epochs=1, keep_last=3),
        ]
    config = TrainerConfig(
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        device=device,
        log_every_n_steps=max(1, math.ceil(steps_per_epoch / 4)),
        checkpoint_dir=checkpoint_dir,
    )
    trainer = Trainer(
        MLP((64, 128, 10)),
        backend=backend,
        optimizer=SGD(momentum=0.9),
        schedule=schedule,
        callbacks=hooks,
        config=config,
        strategy=strategy,
    )
    return trainer, train, (split.x_val, split.y_val)
