"""A tqdm progress bar per epoch with ETA and the live loss; silent when not on a terminal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from unitrain.callbacks._base import Callback

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """Shows ``Epoch i/n`` with a bar, ETA and the loss read at each logging point.

    Args:
        enabled: None (default) shows the bar only when stderr is a terminal, so logs of
            batch jobs stay clean; True or False forces it.
        leave: keep each finished epoch's bar on screen; False clears it (for when another
            callback prints the epoch's line, as ``unitrain train`` does).
    """

    #: With several workers, only rank 0 keeps this callback (see unitrain.backends.strategy).
    main_process_only = True

    def __init__(self, enabled: bool | None = None, leave: bool = True) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.leave = leave
        self._bar: Any = None

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm  # here, not at import: it costs ~17 ms and is only for terminals

        total = trainer.batches_per_epoch or None
        self._bar = tqdm(
            total=total,
            initial=trainer.state.batch,
            desc=f"Epoch {epoch + 1}/{trainer.config.epochs}",
            unit="batch",
            leave=self.leave,
            file=sys.stderr,
        )

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        if self._bar is None:
            return
        self._bar.update(batch - self._bar.n)
        if "loss" in logs:
            self._bar.set_postfix(loss=f"{logs['loss']:.4f}", lr=f"{logs['lr']:.3g}", refresh=False)

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        if self._bar is None:
            return
        shown = {k: f"{v:.4f}" for k, v in logs.items() if "loss" in k or "accuracy" in k}
        self._bar.set_postfix(shown, refresh=False)
        self._bar.close()
        self._bar = None
