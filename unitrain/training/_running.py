"""The epoch's running training loss, added up without a host sync per step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RunningLoss"]


class RunningLoss:
    """Collects each update's loss (a device value) and adds them up on the host when read.

    A step only appends to a list: no framework op, no transfer. Reading (at logging points,
    epoch ends and checkpoints) fetches the pending values in one batched transfer, through
    the backend's optional ``to_host(values) -> list of arrays``, and adds them to a float64
    total one by one, in step order. Because the sum is strictly sequential, where the reads
    fall does not change it: a run resumed from the total saved in a checkpoint ends with the
    same loss, to the bit, as a run never stopped.

    Args:
        to_host: the backend's batched read-back, or None to convert values one at a time.
    """

    #: Pending values are folded in at least this often, bounding the device memory held.
    FOLD_EVERY = 1024

    def __init__(self, to_host: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self._to_host = to_host or (lambda values: [np.asarray(v) for v in values])
        self.reset()

    def reset(self, total: float = 0.0, count: int = 0) -> None:
        """Start over from ``total`` over ``count`` examples (zero, or a checkpoint's)."""
        self._total, self.count = float(total), int(count)
        self._values: list[Any] = []
        self._sizes: list[float] = []

    def add(
        self, loss: Any, batch_size: int, steps: int = 1, counts_as: float | None = None
    ) -> None:
        """Record a batch-mean loss (or a vector of ``steps`` of them) over ``batch_size``.

        ``counts_as``: how many examples the loss stands for in the sum, where that is not
        ``batch_size``: a worker's slice of a batch with sample weights stands for its share
        of the weights, so the workers' sums add up to one process's.
        """
        self._values.append(loss)
        self._sizes.append(batch_size if counts_as is None else counts_as)
        self.count += batch_size * steps
        if len(self._values) >= self.FOLD_EVERY:
            self.total()

    def total(self) -> float:
        """The summed loss of the examples so far (example-weighted); a sync point."""
        if self._values:
            total = self._total
            for values, size in zip(self._to_host(self._values), self._sizes):
                if isinstance(values, (float, np.floating)):  # one update's loss, the usual case
                    total += float(values) * size  # exact: float32 -> float64 loses nothing
                    continue
                for value in np.ravel(np.asarray(values, dtype=np.float64)):
                    total += float(value) * size
            self._total, self._values, self._sizes = total, [], []
        return self._total

    def mean(self) -> float:
        """The example-weighted mean loss so far (NaN before any example)."""
        return self.total() / self.count if self.count else float("nan")
