"""TensorBoard event files: every logged metric and the learning rate, as scalars.

The events are written in the caller's thread and flushed at every logging point, into a
file this logger opens itself, with tensorboardX providing the protocol buffers and the
checksum of the record framing. tensorboardX's ``SummaryWriter`` hands events to a background
thread through a ``multiprocessing.Queue`` and closes it from an ``atexit`` hook; a Ctrl-C
that lands inside that queue's code leaves the thread waiting for a shutdown message that
never arrives, and the process hung at exit after printing its resume line (2 of 40
interrupted CLI runs here). A few scalars per logging point need no thread. Its plain
``EventsWriter`` has no thread but opens its file with ``open(name, "wb")``, which follows a
symlink at that name and empties the file it points to; this logger creates the file with
``O_EXCL | O_NOFOLLOW`` instead (:mod:`unitrain._files`), so it only ever writes a new file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import MissingFrameworkError, RunFolderError
from unitrain._files import open_regular, probe_writable, raising_write_errors, write_error
from unitrain.callbacks._base import Callback

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["TensorBoardLogger"]

#: Logged values that are bookkeeping, not metrics.
_NOT_SCALARS = ("epoch", "step", "seconds")


class TensorBoardLogger(Callback):
    """Writes scalars for ``tensorboard --logdir DIR``, using tensorboardX (no framework).

    At each logging point (every ``log_every_n_steps`` updates) it writes ``train/loss`` and
    ``train/lr`` at the global step; at each epoch's end every metric of the epoch
    (``epoch/loss``, ``epoch/val_loss``, ``epoch/val_accuracy``, ``epoch/lr``, ...) at the
    step the epoch ended on; with ``val_every_n_steps``, each validation's metrics
    (``step/val_loss``, ...) at its step. Each logging point's events are on disk when it
    returns.

    Each ``fit`` writes a new event file, named as TensorBoard expects; the folder is checked
    to be writable when training begins, and a write that fails is a
    :class:`~unitrain._errors.RunFolderError` (see :mod:`unitrain._files`).

    Args:
        log_dir: the directory of the event files.

    Raises:
        MissingFrameworkError: tensorboardX is not installed (``pip install
            'unitrain[tensorboard]'``).
    """

    #: With several workers, only rank 0 keeps this callback (see unitrain.backends.strategy).
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

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        if self._writer is not None:  # val_every_n_steps: the validation metrics at the step
            scalars = {f"step/{k}": v for k, v in logs.items() if k.startswith("val_")}
            self._writer.write(logs["step"], scalars)

    def on_train_end(self, trainer: Trainer) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _EventFile:
    """A new event file in ``log_dir``, named as TensorBoard expects, written synchronously.

    The file is TFRecord framing around ``Event`` protocol buffers (what tensorboardX's
    ``RecordWriter`` writes): per record the length, its masked CRC32C, the bytes and theirs.
    """

    def __init__(self, log_dir: Path) -> None:
        tensorboard = _tensorboardx()
        self._summary, self._event = tensorboard.summary, tensorboard.proto.event_pb2.Event
        self._crc = tensorboard.record_writer.masked_crc32c
        probe_writable(log_dir)
        self.path, self._file = _create_event_file(log_dir)
        first = self._event(wall_time=time.time(), file_version="brain.Event:2")
        self._append([first])

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """``scalars`` at ``step``, one event each, then flushed to the file."""
        now = time.time()
        self._append(
            [
                self._event(
                    wall_time=now, step=int(step), summary=self._summary.scalar(tag, float(value))
                )
                for tag, value in scalars.items()
            ]
        )

    def _append(self, events: list[Any]) -> None:
        frames = []
        for event in events:
            data = event.SerializeToString()
            header = struct.pack("<Q", len(data))
            frames += [header, struct.pack("<I", self._crc(header))]
            frames += [data, struct.pack("<I", self._crc(data))]
        with raising_write_errors(self.path, "write TensorBoard events"):
            try:
                self._file.write(b"".join(frames))
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError:
                with contextlib.suppress(OSError):  # the run ends here: leave no open handle
                    self._file.close()
                raise

    def close(self) -> None:
        with raising_write_errors(self.path, "write TensorBoard events"):
            self._file.close()


def _create_event_file(log_dir: Path) -> tuple[Path, Any]:
    """A new file ``events.out.tfevents.<seconds>.<host>`` (with ``.1``, ``.2``, ... after
    it when that name is taken: another run of the same second, or anything put there)."""
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
    for suffix in ["", *(f".{n}" for n in range(1, 100))]:
        path = log_dir / (name + suffix)
        try:
            return path, open_regular(path, "x")
        except FileExistsError:
            continue
        except OSError as error:
            raise write_error(log_dir, error, "create the TensorBoard event file") from error
    raise RunFolderError(
        f"{log_dir}: 100 event files named {name}* are there already; give the "
        "TensorBoardLogger another log_dir"
    )


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
        import tensorboardX.proto.event_pb2
        import tensorboardX.record_writer
        import tensorboardX.summary
    finally:
        if hide:
            del sys.modules["torch"]
    return tensorboardX
