"""Several updates the Trainer makes in one call: ``train_steps``, and the training set kept on
the device (``set_device_data`` with ``train_steps_on_device``).

Eager torch has no compiled step to fuse, so each of these (and the backend's
``train_step``) runs the plain ``forward; backward; step`` on tensors that are already where
they belong; what they save is host work per update. ``train_steps`` converts (on a GPU:
copies) its ``k`` batches in one go. With ``TrainerConfig(data_on_device=True)`` the training
set is copied to the device once and each update gathers its batch there by index
(``index_select``): one copy of a ``(k, batch)`` index array per call replaces ``k`` gathers
on the host and ``k`` batch copies, the host work a GPU otherwise waits for (issue 14). Each
equals the same updates made one by one, dropout masks included; the kit's ``fused`` family
checks all three.

:class:`UpdateLoops` is a part the backend holds and calls: it is built from the three things
it needs (the backend's batch conversion, its update on converted tensors, and the dropout
key's numbers it shares with the backend) and keeps one piece of state of its own, the
training set on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from unitrain import ConfigError
from unitrain.backends.protocol import Batch, UpdateNumbers

__all__ = ["UpdateLoops"]

#: ``update(x, y, lr, key) -> loss``: one update on converted tensors, dropout keyed by
#: ``key = (step, micro_batch)``.
Update = Callable[[torch.Tensor, torch.Tensor, float, tuple[int, int]], torch.Tensor]


class UpdateLoops:
    """Several updates in one call: the ``MultiStep`` and ``DeviceData`` protocols of
    :mod:`unitrain.backends.protocol`, for :class:`~.backend.TorchBackend`.

    Args:
        convert: the backend's conversion of a batch to checked tensors on its device.
        update: one update on converted tensors (forward, backward, step).
        numbers: the dropout key's numbers, shared with the backend.
    """

    def __init__(
        self,
        convert: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]],
        update: Update,
        numbers: UpdateNumbers,
    ) -> None:
        self._convert, self._update, self._numbers = convert, update, numbers
        self._device_data: tuple[torch.Tensor, torch.Tensor] | None = None

    def train_steps(self, batches: Batch, lrs: Any, *, step: int | None = None) -> torch.Tensor:
        """``k`` updates, equal to ``k`` ``train_step`` calls.

        Args:
            batches: ``(xs, ys)`` stacked along a new leading axis of length ``k``.
            lrs: the ``k`` learning rates, one per update.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` losses as one device tensor (see :func:`_losses`).
        """
        xs, ys = batches
        k = len(xs)
        x, y = self._convert((_merged(xs), _merged(ys)))  # one conversion for all k batches
        x, y = x.unflatten(0, (k, -1)), y.unflatten(0, (k, -1))
        first = self._numbers.at(step)
        return _losses(
            [self._update_on(x[i], y[i], float(lr), first + i) for i, lr in enumerate(lrs)]
        )

    def set_device_data(self, inputs: Any, targets: Any) -> None:
        """Put a whole training set on the device once, for :meth:`train_steps_on_device`."""
        self._device_data = self._convert((inputs, targets))

    def train_steps_on_device(
        self, indices: Any, lrs: Any, *, step: int | None = None
    ) -> torch.Tensor:
        """``k`` updates on batches gathered on the device from :meth:`set_device_data`'s set.

        Args:
            indices: integer array ``(k, batch_size)``; row ``i`` lists update ``i``'s examples.
            lrs: the ``k`` learning rates.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` losses as one device tensor (see :func:`_losses`); equal to
            ``train_step`` on the same batches.
        """
        if self._device_data is None:
            raise ConfigError(
                "train_steps_on_device() needs set_device_data(inputs, targets) first"
            )
        rows = np.asarray(indices)
        if rows.ndim != 2 or rows.dtype.kind not in "iu":
            raise ConfigError(
                f"train_steps_on_device(): indices must be integers of shape (updates, "
                f"batch_size), got {rows.dtype} of shape {rows.shape}"
            )
        x, y = self._device_data
        on_device = torch.from_numpy(rows.astype(np.int64)).to(x.device, non_blocking=True)
        first, rows_and_lrs = self._numbers.at(step), zip(on_device, lrs, strict=True)
        return _losses(
            [
                self._update_on(x.index_select(0, r), y.index_select(0, r), float(lr), first + i)
                for i, (r, lr) in enumerate(rows_and_lrs)
            ]
        )

    def _update_on(self, x: torch.Tensor, y: torch.Tensor, lr: float, step: int) -> torch.Tensor:
        """Update ``step`` on tensors already converted and checked (once for the whole
        call)."""
        return self._update(x, y, lr, self._numbers.forward(step, 0))


def _losses(losses: list[torch.Tensor]) -> torch.Tensor:
    """The losses side by side; bfloat16 and float16 ones in float32, which holds them exactly
    and which numpy reads (``numpy.asarray`` refuses a bfloat16 tensor)."""
    stacked = torch.stack(losses)
    return stacked.float() if stacked.dtype in (torch.bfloat16, torch.float16) else stacked


def _merged(stacked: Any) -> Any:
    """``(k, batch, ...)`` as ``(k * batch, ...)``, a view for numpy arrays and tensors."""
    return stacked.reshape((-1, *stacked.shape[2:]))
