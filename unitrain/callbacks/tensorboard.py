"""TensorBoard event files: every logged metric and the learning rate, as scalars."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import MissingFrameworkError
from unitrain.callbacks._base import Callback

if TYPE_CHECKING:
    from unitrain.trainer import Trainer

__all__ = ["TensorBoardLogger"]

#: Logged values that are bookkeeping, not metrics.
_NOT_SCALARS = ("epoch", "step", "seconds")


class TensorBoardLogger(Callback):
    """Writes scalars for ``tensorboard --logdir DIR``, using tensorboardX (no framework).

    At each logging point (every ``log_every_n_steps`` updates) it writes ``train/loss`` and
    ``train/lr`` at the global step; at each epoch's end every metric of the epoch
    (``epoch/loss``, ``epoch/val_loss``, ``epoch/val_accuracy``, ``epoch/lr``, ...) at the
    step the epoch ended on. Events are flushed at each epoch's end.

    Args:
        log_dir: the directory of the event files.

    Raises:
        MissingFrameworkError: tensorboardX is not installed (``pip install
            'unitrain[tensorboard]'``).
    """

    #: With several workers, only rank 0 keeps this callback (see unitrain.strategy).
    main_process_only = True

    def __init__(self, log_dir: str | Path) -> None:
        if importlib.util.find_spec("tensorboardX") is None:  # found now, imported when used
            raise MissingFrameworkError(
                "TensorBoardLogger needs tensorboardX: pip install 'unitrain[tensorboard]'"
            )
        self.log_dir = Path(log_dir)
        self._writer: Any = None

    def on_train_begin(self, trainer: Trainer) -> None:
        self._writer = _summary_writer()(str(self.log_dir), flush_secs=30)

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        if "loss" in logs and self._writer is not None:  # a logging point: the loss is read
            self._writer.add_scalar("train/loss", logs["loss"], logs["step"])
            self._writer.add_scalar("train/lr", logs["lr"], logs["step"])

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        if self._writer is None:
            return
        for key, value in logs.items():
            if key not in _NOT_SCALARS and isinstance(value, (int, float)):
                self._writer.add_scalar(f"epoch/{key}", value, logs["step"])
        self._writer.flush()

    def on_train_end(self, trainer: Trainer) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _summary_writer() -> Any:
    """tensorboardX's ``SummaryWriter``, imported without importing torch.

    tensorboardX imports torch whenever it is installed, only to accept torch tensors as
    values; this logger passes floats, so a JAX, TensorFlow or numpy run would load torch
    (seconds, and a second framework in the process) for nothing. While tensorboardX is
    imported, ``import torch`` fails as if torch were absent, which tensorboardX handles.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter
