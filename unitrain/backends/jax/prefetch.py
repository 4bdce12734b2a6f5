"""Batches on the accelerator before the step that needs them: ``device_put`` one ahead.

``jax.device_put`` returns at once and copies in the background, so putting batch k+1 before
batch k's step is dispatched lets the copy overlap the step, where passing host arrays to the
jitted step copies them inside the call, in line with the step. On a CPU the batches are
returned as they are: jit's own argument path is the cheapest there (see
``JaxBackend._arrays``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax

from unitrain.backends.common import one_ahead
from unitrain.backends.jax.core import host_batch
from unitrain.structure import is_plain_pair

__all__ = ["prefetch"]


def prefetch(
    batches: Iterable[Any], device: Any, tokens: bool, classification: bool
) -> Iterable[Any]:
    """``batches`` put on ``device`` one batch ahead (on a CPU device: unchanged).

    Each batch is first given the dtypes the jitted step takes (:func:`.core.host_batch`:
    float32 inputs or int32 token ids, int32 labels), so a token model gets its ids as ids.
    """
    if device.platform == "cpu":
        return batches
    return _ahead(iter(batches), device, tokens, classification)


def _ahead(
    batches: Iterator[Any], device: Any, tokens: bool, classification: bool
) -> Iterator[Any]:
    def put(batch: Any) -> Any:
        if not is_plain_pair(batch):
            return batch  # a structured batch: converted leaf by leaf when it is used
        x, y = batch
        return jax.device_put(host_batch(x, y, tokens, classification), device)

    return one_ahead(batches, put)
