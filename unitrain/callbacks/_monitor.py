"""Shared logic of callbacks that watch one metric: its direction and the improvement test."""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Any

from unitrain._errors import ConfigError
from unitrain.callbacks._base import CallbackList

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["Monitor"]

_LOWER_IS_BETTER = ("loss", "error", "mse", "mae")
_HIGHER_IS_BETTER = ("accuracy", "acc", "auc", "precision", "recall", "f1")
#: The metrics every run logs, suggested when a name looks like a typo of one of them.
_COMMON = ("loss", "val_loss", "accuracy", "val_accuracy")


class Monitor:
    """Which metric to watch, whether lower or higher is better, and by how much.

    ``mode="auto"`` picks ``min`` for names ending in loss/error/mse/mae and ``max`` for
    accuracy-like names, and otherwise refuses to guess (Keras 3 likewise refuses rather than
    guessing from a name it does not know).

    The improvement test is Keras's: in ``min`` mode ``current < best - |min_delta|``, in
    ``max`` mode ``current > best + |min_delta|``; the sign of ``min_delta`` is ignored.
    """

    def __init__(self, owner: str, monitor: str, mode: str, min_delta: float) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(f"{owner}: monitor must be a metric name, got monitor={monitor!r}")
        if mode not in ("min", "max", "auto"):
            raise ConfigError(f"{owner}: mode must be 'min', 'max' or 'auto', got mode={mode!r}")
        if not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta):
            raise ConfigError(f"{owner}: min_delta must be a finite number, got {min_delta!r}")
        if mode == "auto":
            base = monitor.removeprefix("val_").removeprefix("test_")
            if base.endswith(_LOWER_IS_BETTER):
                mode = "min"
            elif base.endswith(_HIGHER_IS_BETTER):
                mode = "max"
            else:
                close = difflib.get_close_matches(monitor, _COMMON, n=1)
                raise ConfigError(
                    f"{owner}: cannot tell whether {monitor!r} should go down or up; "
                    "pass mode='min' or mode='max'"
                    + (f" (or did you mean {close[0]!r}?)" if close else "")
                )
        self.owner, self.name, self.mode, self.min_delta = owner, monitor, mode, abs(min_delta)

    @property
    def worst(self) -> float:
        """The value every real measurement improves on."""
        return math.inf if self.mode == "min" else -math.inf

    def improved(self, current: float, reference: float) -> bool:
        """Whether ``current`` beats ``reference`` by more than ``min_delta``."""
        if self.mode == "min":
            return current < reference - self.min_delta
        return current > reference + self.min_delta

    def check_trainer(self, trainer: Trainer) -> None:
        """Fail fast, at ``on_train_begin``, when the metric can never appear in the logs.

        A validation metric without validation data is refused, and so is a name that is not
        among :func:`logged_metrics` when those are known, with the closest one suggested.
        """
        if self.name.startswith("val_") and not getattr(trainer, "has_validation", True):
            raise ConfigError(
                f"{self.owner}: monitor={self.name!r} needs validation data; pass val_data to "
                f"fit() or monitor {self.name.removeprefix('val_')!r}"
            )
        names = logged_metrics(trainer)
        if names is not None and self.name not in names:
            close = difflib.get_close_matches(self.name, names, n=1)
            raise ConfigError(
                f"{self.owner}: metric {self.name!r} is not logged; available: "
                f"{sorted(names)}" + (f". Did you mean {close[0]!r}?" if close else "")
            )

    def read(self, logs: dict[str, Any]) -> float | None:
        """The monitored value from epoch ``logs``; None on an epoch without validation."""
        if self.name in logs:
            return float(logs[self.name])
        validated = any(k.startswith("val_") for k in logs)
        if self.name.startswith("val_") and not validated:
            return None
        raise ConfigError(
            f"{self.owner}: metric {self.name!r} is not logged; available: {sorted(logs)}"
        )


def logged_metrics(trainer: Any) -> frozenset[str] | None:
    """The keys every epoch's logs hold in the trainer's current fit, or None when unknown.

    The training keys are fixed; the validation keys are those ``backend.evaluate`` returns on
    the first validation batch (one extra evaluation in eval mode, which changes no state).
    Unknown (None) when a callback from outside unitrain defines ``on_epoch_end`` or
    ``on_validation_end``, since it may add metrics of its own; monitors then check the name
    at the first epoch end instead.
    """
    callbacks = getattr(getattr(trainer, "callbacks", None), "callbacks", None)
    if callbacks is None or not hasattr(trainer, "val_source"):
        return None
    for callback in callbacks:
        foreign = not type(callback).__module__.startswith("unitrain.")
        hooks = ("on_epoch_end", "on_validation_end")
        if foreign and any(CallbackList._overrides(callback, hook) for hook in hooks):
            return None
    names = {"epoch", "step", "lr", "loss", "skipped_steps", "seconds"}
    if trainer.val_source is not None:
        batch = next(trainer.val_source.batches(0), None)
        if batch is not None:
            names.update(f"val_{key}" for key in trainer.backend.evaluate(batch))
    return frozenset(names)
