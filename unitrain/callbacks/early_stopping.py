"""Stop training when a monitored metric stops improving (Keras 3 semantics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from unitrain._errors import CheckpointError, ConfigError
from unitrain.callbacks._base import Callback, restored
from unitrain.callbacks._monitor import Monitor

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved for ``patience`` epochs.

    The rules are Keras 3's ``EarlyStopping``: each epoch (from ``start_from_epoch`` on) adds
    one to ``wait``; an improvement (see :class:`~unitrain.callbacks._monitor.Monitor`)
    records the best value and epoch and resets ``wait`` to 0 if it also beats ``baseline``;
    otherwise, once ``wait >= patience`` (and past epoch 0), training stops. With
    ``restore_best_weights`` the best epoch's parameters are put back at the end of training,
    also when training ran to its last epoch. Unlike Keras, all of this, the best weights
    included, is saved in checkpoints, so a resumed run stops at the same epoch.

    With ``TrainerConfig(val_every_n_steps=N)`` a ``val_*`` monitor is judged at each
    validation instead (``patience`` then counts validations, and training stops after the
    update that was validated); ``start_from_epoch`` still counts epochs.

    Args:
        monitor: metric name from the epoch logs, e.g. ``"val_loss"``.
        min_delta: smallest change that counts as an improvement (sign ignored).
        patience: epochs without improvement before stopping.
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        baseline: a value the metric must beat for ``wait`` to reset.
        restore_best_weights: restore the best epoch's parameters at the end.
        start_from_epoch: epochs to ignore at the start (warm-up).
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ) -> None:
        self.monitor = Monitor("EarlyStopping", monitor, mode, min_delta)
        for name, value in (("patience", patience), ("start_from_epoch", start_from_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"EarlyStopping: {name} must be an int >= 0, got {value!r}")
        self.patience, self.baseline = patience, baseline
        self.restore_best_weights, self.start_from_epoch = restore_best_weights, start_from_epoch
        self._reset()

    def _reset(self) -> None:
        self.wait = 0
        self.stopped_epoch: int | None = None
        self.best_epoch: int | None = None
        self.best = self.monitor.worst
        self.best_weights: dict[str, np.ndarray] | None = None

    def on_train_begin(self, trainer: Trainer) -> None:
        self.monitor.check_trainer(trainer)
        self._reset()
        self._trainer = trainer  # to check restored best weights against the model

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._judge(trainer, epoch, logs, first=epoch == 0, unit="epochs")

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        # With val_every_n_steps a validation metric is judged at each validation (as
        # Lightning's EarlyStopping does), so patience counts validations; training metrics
        # are still judged at epoch ends.
        if self.monitor.name.startswith("val_"):
            every = trainer.config.val_every_n_steps or 1
            first = logs["step"] <= every
            self._judge(trainer, logs["epoch"] - 1, logs, first=first, unit="validations")

    def _judge(
        self, trainer: Trainer, epoch: int, logs: dict[str, Any], first: bool, unit: str
    ) -> None:
        """One measurement: record an improvement, or count it and stop after ``patience``.

        ``first``: the run's first measurement, which never stops it (Keras's ``epoch > 0``);
        ``unit``: what ``wait`` counts, for the message.
        """
        current = self.monitor.read(logs)
        if current is None or epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = _model_weights(trainer)
        self.wait += 1
        if self.monitor.improved(current, self.best):
            self.best, self.best_epoch = current, epoch
            if self.restore_best_weights:
                self.best_weights = _model_weights(trainer)
            if self.baseline is None or self.monitor.improved(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and not first:
            self.stopped_epoch = epoch
            best = "none" if self.best_epoch is None else f"epoch {self.best_epoch + 1}"
            trainer.stop(
                f"early stopping: {self.monitor.name} did not improve for {self.wait} {unit} "
                f"(best {self.best:.6g} at {best})"
            )

    def on_train_end(self, trainer: Trainer) -> None:
        if self.restore_best_weights and self.best_weights is not None:
            state = trainer.backend.state_dict()
            state.update(self.best_weights)
            trainer.backend.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait": self.wait,
            "best": self.best,
            "best_epoch": self.best_epoch,
            "stopped_epoch": self.stopped_epoch,
            "best_weights": self.best_weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optional = (int, type(None))
        weights = restored(state, "best_weights", (dict, type(None)), None)
        if weights is not None and getattr(self, "_trainer", None) is not None:
            _check_weights(weights, _model_weights(self._trainer))
        self.wait, self.best = restored(state, "wait", (int,)), restored(state, "best", (float,))
        self.best_epoch = restored(state, "best_epoch", optional)
        self.stopped_epoch = restored(state, "stopped_epoch", optional)
        self.best_weights = weights


def _check_weights(saved: dict[str, Any], model: dict[str, np.ndarray]) -> None:
    """Refuse saved best weights that would not load into the model at the end of training."""
    if set(saved) != set(model):
        raise CheckpointError(
            f"best_weights has tensors {sorted(saved)}, but the model has {sorted(model)}"
        )
    for name, value in saved.items():
        want = model[name]
        if not isinstance(value, np.ndarray) or (value.shape, value.dtype) != (
            want.shape,
            want.dtype,
        ):
            raise CheckpointError(
                f"best_weights[{name!r}] must be a {want.dtype} array of shape {want.shape}"
            )
        if not np.isfinite(value).all():
            raise CheckpointError(f"best_weights[{name!r}] holds NaN or infinite values")


def _model_weights(trainer: Trainer) -> dict[str, np.ndarray]:
    return {k: v for k, v in trainer.backend.state_dict().items() if k.startswith("model.")}
