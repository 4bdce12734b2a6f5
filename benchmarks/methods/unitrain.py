"""unitrain's ``Trainer.fit`` on a backend, as a user would call it.

Variants:

- ``default``: ``TrainerConfig`` defaults (so ``deterministic=True``, ``log_every_n_steps=50``)
  and ``fit((x, y))`` on host arrays, which wraps them in an :class:`unitrain.ArrayLoader`
  (host batches, shuffled per epoch) — the same feeding as the ``host`` native loops;
- ``multistep``: ``TrainerConfig(steps_per_call=STEPS_PER_CALL, data_on_device=True)``.

MLPs are :class:`unitrain.models.MLP`, LeNet and the Transformer are portable
:mod:`unitrain.models` descriptions (``benchmarks/paper_models.py``); the CNN is the
backend's native model (a torch ``nn.Module``, a Keras model on TensorFlow, a
:class:`unitrain.backends.jax.JaxModel`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.methods import Gate
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, SEED, Workload, make_data

__all__ = ["STEPS_PER_CALL", "train"]

#: Updates per compiled call in the ``multistep`` variant.
STEPS_PER_CALL = 32


class _GateCallback:
    """Defines only ``on_epoch_end``, so the Trainer skips every per-batch hook."""

    state_key = "benchmark_gate"

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        self.gate.epoch_end(float(logs["loss"]))


def native_model(workload: Workload, backend: str) -> Any:
    """The CNN as the backend's own model type."""
    from benchmarks import models

    if backend == "torch":
        return models.torch_model(workload)
    if backend == "tensorflow":
        return models.keras_model(workload)
    from unitrain.backends.jax import JaxModel

    apply, params = models.jax_model(workload)
    return JaxModel(lambda p, x, *, train, rng: apply(p, x), params)


def build_trainer(
    workload: Workload,
    backend: str,
    variant: str,
    epochs: int,
    callbacks: list[Any],
    **config: Any,
) -> Any:
    """The Trainer of this benchmark; ``config`` adds :class:`unitrain.TrainerConfig` fields
    (the GPU benchmark's device and precision)."""
    from benchmarks import paper_models
    from unitrain import Trainer, TrainerConfig, models, optim, schedules

    if workload.kind == "mlp":
        model: Any = models.MLP(workload.sizes)
    elif workload.kind in paper_models.KINDS:
        model = paper_models.portable_model(workload)
    else:
        model = native_model(workload, backend)
    options: dict[str, Any] = {}
    if variant == "multistep":
        options = {"steps_per_call": STEPS_PER_CALL, "data_on_device": True}
    elif variant != "default":
        raise ValueError(f"unknown unitrain variant {variant!r}")
    return Trainer(
        model,
        backend=backend,
        optimizer=optim.SGD(momentum=MOMENTUM),
        schedule=schedules.Constant(LEARNING_RATE),
        callbacks=callbacks,
        config=TrainerConfig(
            epochs=epochs, batch_size=workload.batch_size, seed=SEED, **options, **config
        ),
    )


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with ``Trainer.fit`` for ``gate.epochs`` epochs."""
    x, y = make_data(workload)
    if backend == "torch" and workload.kind == "cnn":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    trainer = build_trainer(workload, backend, variant, gate.epochs, [_GateCallback(gate)])
    trainer.fit((x, y))
