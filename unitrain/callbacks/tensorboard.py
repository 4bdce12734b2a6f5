"""TensorBoard event files: every logged metric and the learning rate, as scalars.

The events are written in the caller's thread and flushed at every logging point, through
tensorboardX's plain file writer (``EventsWriter``) rather than its ``SummaryWriter``. The
SummaryWriter hands events to a background thread through a ``multiprocessing.Queue`` and
closes it from an ``atexit`` hook; a Ctrl-C that lands inside that queue's code leaves the
thread waiting for a shutdown message that never arrives, and the process hung at exit
after printing its resume line (2 of 40 interrupted CLI runs here). A few scalars per
logging point need no thread.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
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
    step the epoch ended on. Each logging point's events are on disk when it returns.

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
        self._writer = _EventFile(self.log_dir)

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        if "loss" in logs and self._writer is not None:  # a logging point: the loss is read
            self._writer.write(logs["step"], {"train/loss": logs["loss"], "train/lr": logs["lr"]})

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        if self._writer is None:
            return
        scalars = {
            f"epoch/{key}": value
            for key, value in logs.items()
            if key not in _NOT_SCALARS and isinstance(value, (int, float))
        }
        self._writer.write(logs["step"], scalars)

    def on_train_end(self, trainer: Trainer) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _EventFile:
    """One event file of ``log_dir``, named as TensorBoard expects, written synchronously."""

    def __init__(self, log_dir: Path) -> None:
        tensorboard = _tensorboardx()
        log_dir.mkdir(parents=True, exist_ok=True)
        self._summary, self._event = tensorboard.summary, tensorboard.proto.event_pb2.Event
        self._file = tensorboard.event_file_writer.EventsWriter(os.fspath(log_dir / "events"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """``scalars`` at ``step``, one event each, then flushed to the file."""
        now = time.time()
        for tag, value in scalars.items():
            summary = self._summary.scalar(tag, float(value))
            self._file.write_event(self._event(wall_time=now, step=int(step), summary=summary))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _tensorboardx() -> Any:
    """The tensorboardX package, imported without importing torch.

    tensorboardX imports torch whenever it is installed, only to accept torch tensors as
    values; this logger passes floats, so a JAX, TensorFlow or numpy run would load torch
    (seconds, and a second framework in the process) for nothing. While tensorboardX is
    imported, ``import torch`` fails as if torch were absent, which tensorboardX handles.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX
        import tensorboardX.event_file_writer
        import tensorboardX.proto.event_pb2
        import tensorboardX.summary
    finally:
        if hide:
            del sys.modules["torch"]
    return tensorboardX
