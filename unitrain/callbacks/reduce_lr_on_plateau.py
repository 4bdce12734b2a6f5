"""Lower the learning rate when a metric stops improving (Keras semantics)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from unitrain._errors import ConfigError
from unitrain.callbacks._base import Callback, restored
from unitrain.callbacks._monitor import Monitor

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(Callback):
    """Multiply the learning rate by ``factor`` after ``patience`` epochs without improvement.

    The schedule keeps running; this callback scales it through ``trainer.lr_factor``, so a
    warmup or cosine still shapes the LR and the reduction is saved in checkpoints. The
    reduced LR never goes below ``min_lr``. Rules follow Keras's ``ReduceLROnPlateau``
    (``cooldown`` epochs after a reduction count neither as waiting nor for reduction).
    With ``TrainerConfig(val_every_n_steps=N)`` a ``val_*`` monitor is judged at each
    validation instead, and ``patience`` and ``cooldown`` count validations.

    Args:
        monitor: metric name, e.g. ``"val_loss"``.
        factor: multiplier in (0, 1).
        patience: epochs without improvement before reducing.
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        min_delta: improvement threshold (Keras's default 1e-4).
        cooldown: epochs to wait after a reduction.
        min_lr: lower bound of the effective learning rate.
        verbose: print one line at each reduction (the epoch, the monitored value, the old
            and new learning rate), as Keras's ``verbose=1`` does; rank 0 prints it. On by
            default, since an LR that drops silently reads in the logs as a training bug.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
        verbose: bool = True,
    ) -> None:
        if not isinstance(factor, (int, float)) or not 0.0 < factor < 1.0:
            raise ConfigError(f"ReduceLROnPlateau: factor must be in (0, 1), got factor={factor!r}")
        for name, value in (("patience", patience), ("cooldown", cooldown)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"ReduceLROnPlateau: {name} must be an int >= 0, got {value!r}")
        if not isinstance(min_lr, (int, float)) or not min_lr >= 0:
            raise ConfigError(f"ReduceLROnPlateau: min_lr must be >= 0, got min_lr={min_lr!r}")
        self.monitor = Monitor("ReduceLROnPlateau", monitor, mode, min_delta)
        self.factor, self.patience, self.cooldown, self.min_lr = factor, patience, cooldown, min_lr
        self.verbose = verbose
        self._reset()

    def _reset(self) -> None:
        self.best, self.wait, self.cooldown_counter = self.monitor.worst, 0, 0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.monitor.check_trainer(trainer)
        self._reset()

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._judge(trainer, f"epoch {epoch + 1}", logs)

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        # val_every_n_steps: a validation metric is judged at each validation (patience and
        # cooldown count validations); training metrics still at epoch ends.
        if self.monitor.name.startswith("val_"):
            self._judge(trainer, f"step {logs['step']}", logs)

    def _judge(self, trainer: Trainer, where: str, logs: dict[str, Any]) -> None:
        current = self.monitor.read(logs)
        if current is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.monitor.improved(current, self.best):
            self.best, self.wait = current, 0
        elif self.cooldown_counter == 0:
            self.wait += 1
            lr = trainer.lr
            if self.wait >= self.patience and lr > self.min_lr:
                # As in Keras, a plateau already at min_lr neither resets wait nor cools down.
                trainer.lr_factor *= max(lr * self.factor, self.min_lr) / lr
                if self.verbose and trainer.strategy.is_main:
                    self._say(where, current, lr, trainer.lr)
                self.cooldown_counter, self.wait = self.cooldown, 0

    def _say(self, where: str, current: float, old_lr: float, new_lr: float) -> None:
        """Print the reduction on one line, flushed so that a log file shows it at once."""
        unit = "validations" if where.startswith("step") else "epochs"
        print(
            f"ReduceLROnPlateau: {where}: lr {old_lr:.4g} -> {new_lr:.4g} "
            f"({self.monitor.name}={current:.6g}, no improvement on {self.best:.6g} for "
            f"{self.wait} {unit})",
            file=sys.stdout,
            flush=True,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "cooldown_counter": self.cooldown_counter}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = restored(state, "best", (float,))
        self.wait = restored(state, "wait", (int,))
        self.cooldown_counter = restored(state, "cooldown_counter", (int,))
