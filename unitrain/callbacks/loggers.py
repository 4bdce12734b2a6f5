"""Metric files (CSV, JSON lines) that survive kills and resumes without duplicate rows."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import CheckpointError
from unitrain._files import open_regular, probe_writable, raising_write_errors, require_regular_file
from unitrain.callbacks._base import Callback, restored

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["CSVLogger", "ConsoleLogger", "JSONLLogger"]


class ConsoleLogger(Callback):
    """Prints one line per epoch as soon as it ends (``epoch 3/10: loss=... val_loss=...``),
    and one per validation by steps (``step 200/1000 (epoch 2): loss=... val_loss=...``).

    With several workers, only rank 0 keeps it (see :mod:`unitrain.backends.strategy`).

    Lines are flushed at once, so a log file fills while training runs, not when it ends.
    Off a terminal, where no progress bar shows, a line also says when the first epoch of
    each ``fit`` starts: the first epoch can take long (JAX compiles; 25 s on the digits)
    and a log that stays empty that long looks hung.

    Args:
        stream: where to print; None is ``sys.stdout`` at the time of printing.
    """

    main_process_only = True

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._started = False

    def on_train_begin(self, trainer: Trainer) -> None:
        self._started = False

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        if self._started:
            return
        self._started = True
        stream = self.stream or sys.stdout
        isatty = getattr(stream, "isatty", None)
        if not (callable(isatty) and isatty()):
            print(
                f"epoch {epoch + 1}/{trainer.config.epochs}: training ...", file=stream, flush=True
            )

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._print(f"epoch {logs['epoch']}/{trainer.config.epochs}", logs)

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        limit = f"/{trainer.config.max_steps}" if trainer.config.max_steps else ""
        self._print(f"step {logs['step']}{limit} (epoch {logs['epoch']})", logs)

    def _print(self, where: str, logs: dict[str, Any]) -> None:
        shown = [
            f"{key}={value:.4f}"
            for key, value in logs.items()
            if key not in ("epoch", "step", "seconds", "skipped_steps", "lr")
            and isinstance(value, float)
        ]
        shown.append(f"lr={logs['lr']:.3g}")
        print(
            f"{where}: {', '.join(shown)} ({logs['seconds']:.1f}s)",
            file=self.stream or sys.stdout,
            flush=True,
        )


class _EpochFileLogger(Callback):
    """Appends one line per epoch and closes the file again, so a kill loses at most the
    line in flight and no handle outlives an interrupted run. A validation by steps
    (``val_every_n_steps``) is a line of its own, written as an epoch's is.

    The file's length after each line is part of the callback's checkpoint state; a resumed
    run cuts the file back to that length first, so epochs re-run after the checkpoint are
    not written twice.

    When training begins, the folder is checked to be writable and the file to be a regular
    one (or absent): a read-only or full folder, or a symlink, FIFO or device in the file's
    place, is refused before the first update rather than after the first epoch. A write that
    fails later is a :class:`~unitrain._errors.RunFolderError` (see :mod:`unitrain._files`).
    """

    #: With several workers, only rank 0 keeps this callback (see unitrain.backends.strategy).
    main_process_only = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def on_train_begin(self, trainer: Trainer) -> None:
        self._offset = 0
        probe_writable(self.path.parent)
        require_regular_file(self.path)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._offset = restored(state, "offset", (int,), 0)
        self._restore_extra(state)

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self._offset, **self._extra_state()}

    def _write(self, text: str) -> None:
        # The file is opened as bytes: the saved offset counts bytes, whatever the text.
        resuming = self._offset > 0 and os.path.lexists(self.path)
        with (
            raising_write_errors(self.path, "write the epoch's metrics"),
            open_regular(self.path, "r+" if resuming else "w") as handle,
        ):
            if resuming:
                # A file shorter than the saved offset lost lines since (edited, or restored
                # from a backup): append after what is there rather than pad it with NUL bytes.
                offset = min(self._offset, os.fstat(handle.fileno()).st_size)
                handle.truncate(offset)
                handle.seek(offset)
            handle.write(text.encode("utf-8"))
            written = handle.tell()
        self._offset = written  # only once the line is out: a failed write keeps the old one

    def _row(self, trainer: Trainer, logs: dict[str, Any]) -> dict[str, Any]:
        """The epoch's metrics, then the id of the run that wrote them (see
        unitrain.training._lineage): a file that two runs wrote shows where one ends."""
        lineage = getattr(trainer, "lineage", None)
        return logs if lineage is None else {**logs, "run_id": lineage.id}

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        self.on_epoch_end(trainer, logs["epoch"] - 1, logs)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        pass


class JSONLLogger(_EpochFileLogger):
    """One JSON object per epoch (``epoch, step, lr, loss, val_loss, ..., seconds, run_id``).

    Non-finite values are written as ``null`` so every line is strict JSON.
    """

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        row = {
            k: (v if not isinstance(v, float) or math.isfinite(v) else None)
            for k, v in self._row(trainer, logs).items()
        }
        self._write(json.dumps(row, allow_nan=False) + "\n")


class CSVLogger(_EpochFileLogger):
    """One CSV row per epoch, with the first epoch's metrics as columns (as Keras does).

    A metric missing from a later epoch is left empty; validate in the first epoch (the
    default ``val_every_n_epochs=1``) to get validation columns. With ``val_every_n_steps``,
    a first validation before the first epoch ends gives them; epoch rows leave them empty.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.columns: list[str] | None = None

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        buffer, row = io.StringIO(), self._row(trainer, logs)
        if self.columns is None:
            self.columns = list(row)
            csv.writer(buffer).writerow(self.columns)
        csv.DictWriter(buffer, self.columns, extrasaction="ignore").writerow(row)
        self._write(buffer.getvalue())

    def on_train_begin(self, trainer: Trainer) -> None:
        super().on_train_begin(trainer)
        self.columns = None

    def _extra_state(self) -> dict[str, Any]:
        return {"columns": self.columns}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        columns = restored(state, "columns", (list, type(None)), None)
        if columns is not None and not all(isinstance(c, str) for c in columns):
            raise CheckpointError("'columns' must be a list of str")
        self.columns = columns
