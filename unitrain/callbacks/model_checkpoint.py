"""Save checkpoints every N epochs or steps, keep the last few, and keep the best one."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import CheckpointError, ConfigError
from unitrain._files import probe_writable
from unitrain.callbacks._base import Callback, restored
from unitrain.callbacks._monitor import Monitor
from unitrain.checkpoint import (
    CheckpointWarning,
    checkpoint_name,
    list_checkpoints,
    remove_checkpoint,
)

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["ModelCheckpoint"]

BEST = "best"


class ModelCheckpoint(Callback):
    """Write resumable checkpoints into ``dirpath`` as training goes.

    Periodic checkpoints are named ``epoch=EEEE-step=SSSSSS`` (``EEEE`` is the epoch the step
    belongs to, counting from 1, so a step saved both by step and at its epoch's end has one
    name: the later save replaces the earlier) and the newest ``keep_last`` of this run are
    kept; checkpoints of other runs in the folder (the run a resume branched from, see
    :mod:`unitrain.training._lineage`) are never deleted. With
    ``monitor`` set, the checkpoint of the best epoch so far is also kept under ``dirpath/best``
    (with ``TrainerConfig(val_every_n_steps=N)``, of the best validated step).
    Every write is atomic (a temporary directory renamed into place), so a kill at any moment
    leaves the previous checkpoints valid, and ``fit(resume="latest")`` continues from the
    newest one that verifies.

    This callback runs after all others in each hook, so the state it saves includes every
    other callback's decision for the epoch (early stopping's counter, a logger's position).

    By default training goes on while a checkpoint is finished: the hook returns once the
    files are written, and a background thread digests, fsyncs and renames them into place
    (``Trainer.save_checkpoint(background=True)``); older checkpoints are deleted only after
    the new one is in place, and ``fit`` returns only when the last one is durable.

    Args:
        dirpath: directory of the checkpoints; defaults to ``TrainerConfig.checkpoint_dir``.
        every_n_epochs: save after every n-th epoch (None: never by epoch).
        every_n_steps: save after every n-th optimizer update (None: never by step).
        keep_last: how many periodic checkpoints to keep (None: all).
        monitor: metric whose best value selects the ``best`` checkpoint (None: no best).
        mode: ``"min"``, ``"max"`` or ``"auto"`` for ``monitor``.
        min_delta: improvement needed for a new best.
        background: finish each save on a background thread (see above); False makes each
            checkpoint durable before the hook returns.
    """

    runs_last = True

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        every_n_epochs: int | None = 1,
        every_n_steps: int | None = None,
        keep_last: int | None = None,
        monitor: str | None = None,
        mode: str = "auto",
        min_delta: float = 0.0,
        background: bool = True,
    ) -> None:
        for name, value in (
            ("every_n_epochs", every_n_epochs),
            ("every_n_steps", every_n_steps),
            ("keep_last", keep_last),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(
                    f"ModelCheckpoint: {name} must be an int >= 1 or None, got {value!r}"
                )
        if every_n_epochs is None and every_n_steps is None and monitor is None:
            raise ConfigError(
                "ModelCheckpoint: nothing would ever be saved; set every_n_epochs, "
                "every_n_steps or monitor"
            )
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.every_n_epochs, self.every_n_steps, self.keep_last = (
            every_n_epochs,
            every_n_steps,
            keep_last,
        )
        self.monitor = (
            None if monitor is None else Monitor("ModelCheckpoint", monitor, mode, min_delta)
        )
        self.best = self.monitor.worst if self.monitor else math.inf
        self.background = bool(background)
        self.last_saved: Path | None = None
        self._last_step = 0
        self._run_id: str | None = None  # whose checkpoints _prune may delete

    @property
    def writes_to(self) -> tuple[Path, ...]:
        """``dirpath``, once known (without it the checkpoints go to ``checkpoint_dir``)."""
        return () if self.dirpath is None else (self.dirpath,)

    def _directory(self, trainer: Trainer) -> Path:
        if self.dirpath is None:
            if trainer.config.checkpoint_dir is None:
                raise ConfigError(
                    "ModelCheckpoint needs a directory: pass dirpath or set "
                    "TrainerConfig(checkpoint_dir=...)"
                )
            self.dirpath = Path(trainer.config.checkpoint_dir)
        return self.dirpath

    def on_train_begin(self, trainer: Trainer) -> None:
        directory = self._directory(trainer)
        self._last_step = trainer.state.step
        self._run_id = None if trainer.lineage is None else trainer.lineage.id
        if trainer.strategy.is_main:  # a read-only or full folder: say so now, not at a save
            probe_writable(directory)
        if trainer.strategy.is_main and directory.is_dir():
            # A run killed between a save and its pruning left one too many; a resumed run
            # that saves nothing more would keep it.
            self._prune(directory)
        if self.monitor is not None:
            self.monitor.check_trainer(trainer)
            self.best = self.monitor.worst

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        # Several updates may come in one call (steps_per_call): save on crossing a multiple.
        step, every = trainer.state.step, self.every_n_steps
        if every and step // every > self._last_step // every:
            self._save_periodic(trainer)
        self._last_step = step

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        new_best = self._new_best(logs)
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
            self._save_periodic(trainer)
        if new_best:
            trainer.save_checkpoint(self._directory(trainer) / BEST, background=self.background)

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        # val_every_n_steps: a validation metric picks the best step at each validation.
        monitored = self.monitor is not None and self.monitor.name.startswith("val_")
        if monitored and self._new_best(logs):
            trainer.save_checkpoint(self._directory(trainer) / BEST, background=self.background)

    def _new_best(self, logs: dict[str, Any]) -> bool:
        """Whether ``logs`` hold a better value of the monitor than any so far (recorded)."""
        if self.monitor is None:
            return False
        current = self.monitor.read(logs)
        if current is None or not self.monitor.improved(current, self.best):
            return False
        self.best = current
        return True

    def _save_periodic(self, trainer: Trainer) -> None:
        directory = self._directory(trainer)
        name = checkpoint_name(trainer.epoch_number, trainer.state.step)

        self.last_saved = trainer.save_checkpoint(
            directory / name,
            background=self.background,
            then=lambda: self._prune(directory),  # once the new checkpoint is in place
        )

    def _prune(self, directory: Path) -> None:
        """Remove this run's periodic checkpoints beyond the newest ``keep_last``.

        One that cannot be removed (a file put into it by hand) is kept, with a warning:
        training goes on."""
        if self.keep_last is None or self._run_id is None:
            return
        periodic = [
            path for path in list_checkpoints(directory, run=self._run_id) if path.name != BEST
        ]
        for old in periodic[: -self.keep_last]:
            try:
                remove_checkpoint(old)
            except CheckpointError as error:
                warnings.warn(f"keeping it: {error}", CheckpointWarning, stacklevel=2)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = restored(state, "best", (float,), self.best)
