"""Record the learning rate actually used, per update or per epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unitrain._errors import CheckpointError, ConfigError
from unitrain.callbacks._base import Callback, restored

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["LRMonitor"]


class LRMonitor(Callback):
    """Keeps ``(step, lr)`` pairs: the LR applied by each update, or the last of each epoch.

    Args:
        logging_interval: ``"step"`` records every update, ``"epoch"`` one value per epoch.

    Attributes:
        values: the recorded ``(step, lr)`` pairs; ``step`` counts updates applied, so the
            pair ``(s, lr)`` means update number ``s`` (1-based) used ``lr``.
    """

    def __init__(self, logging_interval: str = "epoch") -> None:
        if logging_interval not in ("step", "epoch"):
            raise ConfigError(
                "LRMonitor: logging_interval must be 'step' or 'epoch', "
                f"got logging_interval={logging_interval!r}"
            )
        self.logging_interval = logging_interval
        self.values: list[tuple[int, float]] = []

    def on_train_begin(self, trainer: Trainer) -> None:
        self.values = []

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        if self.logging_interval == "step":
            self.values.append((logs["step"], logs["lr"]))

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        if self.logging_interval == "epoch":
            self.values.append((logs["step"], logs["lr"]))

    def state_dict(self) -> dict[str, Any]:
        return {"values": [list(v) for v in self.values]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = restored(state, "values", (list,), [])
        pairs = [restored({"pair": v}, "pair", (list,)) for v in values]
        if any(len(p) != 2 for p in pairs):
            raise CheckpointError("'values' must be a list of [step, lr] pairs")
        self.values = [
            (restored({"step": s}, "step", (int,)), restored({"lr": lr}, "lr", (float,)))
            for s, lr in pairs
        ]
