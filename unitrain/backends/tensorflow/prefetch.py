"""Batches on the GPU before the step that needs them: one batch copied ahead.

TensorFlow's executor runs eager copies asynchronously on a GPU, so converting batch k+1
onto the device before batch k's step is dispatched lets the copy overlap the step (what
``tf.data.experimental.prefetch_to_device`` does for a ``tf.data`` pipeline; the Trainer's
batches are numpy arrays, so this does it for them). On a CPU the batches are returned as
they are: the step converts them itself at no extra cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import tensorflow as tf

from unitrain.backends.common import one_ahead
from unitrain.structure import is_plain_pair

__all__ = ["prefetch"]


def prefetch(
    batches: Iterable[Any], device_name: str, dtype: tf.DType, classification: bool
) -> Iterable[Any]:
    """``batches`` as tensors on ``device_name``, one batch ahead (on the CPU: unchanged)."""
    if "GPU" not in device_name:
        return batches
    return _ahead(iter(batches), device_name, dtype, classification)


def _ahead(
    batches: Iterator[Any], device_name: str, dtype: tf.DType, classification: bool
) -> Iterator[Any]:
    def put(batch: Any) -> Any:
        if not is_plain_pair(batch):
            return batch  # a structured batch: converted leaf by leaf when it is used
        x, y = batch
        with tf.device(device_name):
            x = tf.identity(tf.cast(tf.convert_to_tensor(x), dtype))
            y = tf.convert_to_tensor(y)
            if classification:
                y = tf.cast(y, tf.int64)
            return x, tf.identity(y)

    return one_ahead(batches, put)
