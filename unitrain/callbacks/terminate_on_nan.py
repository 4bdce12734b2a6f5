"""Stop (or raise) as soon as a logged loss is NaN or infinite."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from unitrain._errors import NonFiniteError
from unitrain.callbacks._base import Callback

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["TerminateOnNaN"]


class TerminateOnNaN(Callback):
    """Ends training when the running loss read at a logging point or epoch end is not finite.

    The Trainer already skips non-finite updates (see ``TrainerConfig.nonfinite``); this
    callback adds Keras's behaviour of ending the run on a non-finite *logged* loss, which
    also catches a loss that overflowed while its gradients stayed finite.

    Args:
        raise_error: raise :class:`~unitrain.NonFiniteError` instead of stopping quietly.
    """

    def __init__(self, raise_error: bool = False) -> None:
        self.raise_error = raise_error
        self.stopped_at: int | None = None

    def _check(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        loss = logs.get("loss")
        if loss is None or math.isfinite(loss):
            return
        self.stopped_at = trainer.state.step
        if self.raise_error:
            raise NonFiniteError(f"TerminateOnNaN: loss is {loss} at step {trainer.state.step}")
        trainer.stop(f"TerminateOnNaN: loss is {loss} at step {trainer.state.step}")

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        self._check(trainer, logs)

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self._check(trainer, logs)
