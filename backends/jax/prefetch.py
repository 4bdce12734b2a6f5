"""Batches on the accelerator before the step that needs them: ``device_put`` one ahead.

``jax.device_put`` returns at once and copies in the background, so putting batch k+1 before
batch k's step is dispatched lets the copy overlap the step, where passing host arrays to the
jitted step copies them inside the call, in line with the step. Labels go as int32 (x64 is
off, and the step would convert them anyway). On a CPU the batches are returned as they are:
jit's own argument path is the cheapest there (see ``JaxBackend._arrays``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

__all__ = ["prefetch"]


def prefetch(batches: Iterable[Any], device: Any, classification: bool) -> Iterable[Any]:
    """``batches`` put on ``device`` one batch ahead (on a CPU device: unchanged)."""
    if device.platform == "cpu":
        return batches
    return _ahead(iter(batches), device, classification)


def _ahead(batches: Iterator[Any], device: Any, classification: bool) -> Iterator[Any]:
    def put(batch: Any) -> Any:
        x, y = batch
        if isinstance(x, np.ndarray) and x.dtype != np.float32:
            x = x.astype(np.float32)
        if isinstance(y, np.ndarray):  # x64 is off: int32 labels, float32 targets
            if classification or y.dtype.kind in "iu":
                y = y.astype(np.int32, copy=False)
            elif y.dtype.kind == "f":
                y = y.astype(np.float32, copy=False)
        return jax.device_put((x, y), device)

    pending = next(batches, None)
    staged = None if pending is None else put(pending)
    while staged is not None:
        current = staged
        upcoming = next(batches, None)
        staged = None if upcoming is None else put(upcoming)
        yield current
