"""Experiment trackers: one small interface, so any tracker plugs into the Trainer.

A tracker is a :class:`TrackerLogger` subclass that writes three things, as Lightning's
loggers do: :meth:`~TrackerLogger.log_hyperparams` (the run's description, flattened to
``"optimizer.lr"``-style keys, once per run), :meth:`~TrackerLogger.log_metrics` (metrics at
an update number) and :meth:`~TrackerLogger.finalize` (the run ended). The base class calls
them from the Trainer's hooks, with the same names TensorBoard gets:

- every logging point (``log_every_n_steps``): ``train/loss`` and ``train/lr`` at the step;
- every epoch's end: ``epoch/<metric>`` for each of the epoch's metrics (``epoch/loss``,
  ``epoch/val_loss``, ``epoch/lr``, ...) at the step the epoch ended on;
- every validation by steps (``val_every_n_steps``): ``step/val_<metric>`` at its step.

A resumed run continues the tracker's run instead of opening a new one: what identifies it
(:meth:`~TrackerLogger.run_state`) is saved in each checkpoint with the callback's state and
handed back to :meth:`~TrackerLogger.resume_run`. Metrics of the updates between that
checkpoint and the interruption are logged again by the resumed run, at the same steps.

With several workers only rank 0 keeps a tracker (see :mod:`unitrain.backends.strategy`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from unitrain._errors import ConfigError
from unitrain.callbacks._base import Callback

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["TrackerLogger", "run_description"]

#: Logged values that are bookkeeping, not metrics.
_NOT_METRICS = ("epoch", "step", "seconds")


class TrackerLogger(Callback):
    """Base class of experiment trackers: override the three writing methods (and, to
    continue a run on resume, :meth:`run_state` and :meth:`resume_run`)."""

    main_process_only = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is TrackerLogger:
            raise ConfigError(
                "TrackerLogger is the base class of experiment trackers: use MLflowLogger, or "
                "subclass it and write log_hyperparams, log_metrics and finalize"
            )
        return super().__new__(cls)

    def log_hyperparams(self, params: Mapping[str, str]) -> None:
        """Record the run's description: flat keys, string values."""
        raise NotImplementedError

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` at update ``step``."""
        raise NotImplementedError

    def finalize(self, status: str) -> None:
        """The run ended with ``status``: ``"success"``, or ``"stopped"`` (early stopping
        or a preemption signal ended it before its planned length)."""

    def run_state(self) -> dict[str, Any]:
        """What identifies the tracker's run, as JSON data, for a resumed run."""
        return {}

    def resume_run(self, state: Mapping[str, Any]) -> None:
        """Continue the run ``state`` (from :meth:`run_state`) names."""

    # -- the Trainer's hooks -----------------------------------------------------------------

    def on_train_begin(self, trainer: Trainer) -> None:
        self._trainer_params = run_description(trainer)
        self._params_logged = False

    def load_state_dict(self, state: dict[str, Any]) -> None:
        run = state.get("run")
        if isinstance(run, dict) and run:
            self.resume_run(run)

    def state_dict(self) -> dict[str, Any]:
        return {"run": self.run_state()}

    def _begin(self) -> None:
        """Log the description on the first write, after a resume has had its say."""
        if not self._params_logged:
            self._params_logged = True
            self.log_hyperparams(self._trainer_params)

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        if "loss" in logs:  # a logging point: the loss was read back anyway
            self._begin()
            self.log_metrics({"train/loss": logs["loss"], "train/lr": logs["lr"]}, logs["step"])

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._begin()
        metrics = {
            f"epoch/{key}": float(value)
            for key, value in logs.items()
            if key not in _NOT_METRICS and isinstance(value, (int, float))
        }
        metrics["epoch/epoch"] = float(logs["epoch"])
        self.log_metrics(metrics, logs["step"])

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        self._begin()
        metrics = {f"step/{k}": float(v) for k, v in logs.items() if k.startswith("val_")}
        self.log_metrics(metrics, logs["step"])

    def on_train_end(self, trainer: Trainer) -> None:
        self._begin()
        self.finalize("stopped" if trainer.state.stop_training else "success")


def run_description(trainer: Any) -> dict[str, str]:
    """The run's settings as flat ``"part.field"`` keys with string values: the backend,
    the loss, the configuration, and the model, optimizer and schedule where they are data.

    >>> from unitrain import Trainer, TrainerConfig, models, optim
    >>> trainer = Trainer(models.MLP((4, 2)), backend="numpy", optimizer=optim.SGD(),
    ...                   config=TrainerConfig(epochs=3))
    >>> params = run_description(trainer)
    >>> params["backend"], params["config.epochs"], params["optimizer.type"]
    ('numpy', '3', 'sgd')
    """
    parts: dict[str, Any] = {
        "backend": trainer.backend.name,
        "loss": trainer.loss if isinstance(trainer.loss, str) else _described(trainer.loss),
        "config": dataclasses.asdict(trainer.config),
        "model": _described(trainer.model),
        "optimizer": _described(trainer.optimizer),
        "schedule": _described(trainer.schedule),
    }
    flat: dict[str, str] = {}
    _flatten("", parts, flat)
    return flat


def _described(part: Any) -> Any:
    """``part.to_dict()`` where it is data, else its type's name."""
    to_dict = getattr(part, "to_dict", None)
    if callable(to_dict):
        try:
            return to_dict()
        except Exception:  # a native model or callable: named, not described
            pass
    return type(part).__name__


def _flatten(prefix: str, value: Any, into: dict[str, str]) -> None:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, into)
    elif value is not None:
        into[prefix] = value if isinstance(value, str) else json.dumps(value, default=str)
