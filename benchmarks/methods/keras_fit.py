"""Keras 3 ``model.fit`` on the backend named by ``KERAS_BACKEND`` (set per process).

Keras' defaults are kept: ``steps_per_execution=1``, ``jit_compile="auto"`` (XLA on JAX, off
for torch and for TensorFlow on CPU), numpy arrays handed to ``fit`` with ``shuffle=True``.
Only the progress output is turned off (``verbose=0``), and no metric besides the loss is
compiled. Keras' SGD keeps the learning rate inside the momentum buffer, which at a constant
learning rate is the same update as the torch form the other methods use.
"""

from __future__ import annotations

from typing import Any

import keras

from benchmarks.methods import Gate
from benchmarks.models import keras_model
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, Workload, make_data

__all__ = ["train"]


class _GateCallback(keras.callbacks.Callback):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        loss = (logs or {}).get("loss")
        self.gate.epoch_end(None if loss is None else float(loss))  # float() syncs


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with ``model.fit`` on host numpy arrays."""
    if keras.backend.backend() != backend:
        raise RuntimeError(f"KERAS_BACKEND is {keras.backend.backend()!r}, expected {backend!r}")
    x, y = make_data(workload)
    model = keras_model(workload)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        x,
        y,
        batch_size=workload.batch_size,
        epochs=gate.epochs,
        shuffle=True,
        verbose=0,
        callbacks=[_GateCallback(gate)],
    )
