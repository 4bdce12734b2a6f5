"""A tracker that writes Lightning's CSV layout: ``metrics.csv`` and ``hparams.yaml``.

``metrics.csv`` has one row per :meth:`~CSVTracker.log_metrics` call: the columns are
``epoch``, ``step``, then every metric key seen so far in sorted order, blank where a row
lacks a key. When a call brings a new key, the file is rewritten with the wider header (as
Lightning's ``CSVLogger`` does), through a temporary file and a rename, so a kill leaves the
old file or the new one. ``epoch`` is the 0-based epoch the row was logged in (Lightning's),
``step`` the update number the tracker interface carries.

Being a :class:`~unitrain.callbacks.trackers.TrackerLogger`, it gets the Trainer's
``train/loss`` and ``train/lr`` at every logging point, ``epoch/*`` at each epoch's end and
``step/val_*`` at each validation by steps. A resumed run cuts the rows logged after its
checkpoint (their updates run again and log again), like the epoch loggers.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import CheckpointError, ConfigError
from unitrain._files import open_regular, probe_writable, raising_write_errors, require_regular_file
from unitrain.callbacks.trackers import TrackerLogger

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["CSVTracker"]

#: The columns every row has, first.
_LEADING = ("epoch", "step")


class CSVTracker(TrackerLogger):
    """Log the run to ``metrics.csv`` and ``hparams.yaml`` in ``log_dir`` (Lightning's
    ``CSVLogger`` layout, in a folder you name rather than ``name/version_N``).

    Args:
        log_dir: the folder of the two files; made when missing.

    Examples:
        >>> import tempfile
        >>> tracker = CSVTracker(tempfile.mkdtemp())
        >>> tracker.log_metrics({"train/loss": 0.5}, step=1)
        >>> tracker.log_metrics({"train/loss": 0.4, "epoch/val_loss": 0.45}, step=2)
        >>> print(tracker.metrics_file.read_text(), end="")
        epoch,step,epoch/val_loss,train/loss
        ,1,,0.5
        ,2,0.45,0.4
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        if not str(log_dir):
            raise ConfigError("CSVTracker: log_dir must be a folder, got ''")
        self.log_dir = Path(log_dir)
        self.metrics_file = self.log_dir / "metrics.csv"
        self.hparams_file = self.log_dir / "hparams.yaml"
        self._columns: list[str] = list(_LEADING)
        self._rows: int | None = None  # None: this run has not written metrics.csv yet
        self._epoch: int | None = None

    # -- the tracker interface -----------------------------------------------------------------

    def log_hyperparams(self, params: Mapping[str, str]) -> None:
        """Write ``params`` to ``hparams.yaml``, one ``"key": "value"`` line each (JSON
        strings, which YAML reads as they are)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{json.dumps(str(k))}: {json.dumps(str(v))}\n" for k, v in params.items())
        self._replace(self.hparams_file, text, "write the run's hyperparameters")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Add a row: ``metrics`` at update ``step`` (the header widens for a new key)."""
        row = {"epoch": "" if self._epoch is None else self._epoch, "step": step, **metrics}
        new_keys = sorted(set(metrics) - set(self._columns))
        if self._rows is None or new_keys:
            columns = list(_LEADING) + sorted({*self._columns[2:], *new_keys})
            kept = self._read_rows() if self._rows else []
            self._rewrite(columns, [*kept, row])
            return
        buffer = io.StringIO()
        csv.DictWriter(buffer, self._columns, lineterminator="\n").writerow(row)
        with (
            raising_write_errors(self.metrics_file, "write the metrics"),
            open_regular(self.metrics_file, "a") as handle,
        ):
            handle.write(buffer.getvalue().encode("utf-8"))
        self._rows += 1

    def finalize(self, status: str) -> None:
        """Nothing is left to write: every row is on disk when it is logged."""

    def run_state(self) -> dict[str, Any]:
        return {"rows": self._rows or 0, "columns": list(self._columns)}

    def resume_run(self, state: Mapping[str, Any]) -> None:
        rows, columns = state.get("rows"), state.get("columns")
        if not isinstance(rows, int) or rows < 0 or not _is_header(columns):
            raise CheckpointError(
                "CSVTracker: the saved run must have 'rows' (an int >= 0) and 'columns' (a "
                f"list of str starting with epoch, step), got {dict(state)!r:.200}"
            )
        assert isinstance(columns, list)
        kept = self._read_rows()[:rows] if os.path.lexists(self.metrics_file) else []
        self._rewrite(columns, kept)

    # -- the Trainer's hooks -------------------------------------------------------------------

    def on_train_begin(self, trainer: Trainer) -> None:
        super().on_train_begin(trainer)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        probe_writable(self.log_dir)
        for path in (self.metrics_file, self.hparams_file):
            require_regular_file(path)
        self._columns, self._rows, self._epoch = list(_LEADING), None, None

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        self._epoch = trainer.state.epoch
        super().on_batch_end(trainer, batch, logs)

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._epoch = int(logs["epoch"]) - 1
        super().on_epoch_end(trainer, epoch, logs)

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        self._epoch = int(logs["epoch"]) - 1
        super().on_step_validation_end(trainer, logs)

    # -- files ---------------------------------------------------------------------------------

    def _read_rows(self) -> list[dict[str, str]]:
        with open(self.metrics_file, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))

    def _rewrite(self, columns: list[str], rows: Sequence[Mapping[str, Any]]) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._replace(self.metrics_file, buffer.getvalue(), "write the metrics")
        self._columns, self._rows = columns, len(rows)

    def _replace(self, path: Path, text: str, doing: str) -> None:
        """Write ``path`` whole: a temporary file beside it, then a rename."""
        temporary = path.with_name(f".{path.name}.tmp")
        with raising_write_errors(path, doing):
            with open_regular(temporary, "w") as handle:
                handle.write(text.encode("utf-8"))
            require_regular_file(path)
            os.replace(temporary, path)


def _is_header(columns: object) -> bool:
    return (
        isinstance(columns, list)
        and all(isinstance(c, str) for c in columns)
        and tuple(columns[:2]) == _LEADING
    )
