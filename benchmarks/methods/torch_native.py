"""The hand-written PyTorch loop an expert would write: eager, ``zero_grad(set_to_none=True)``.

Two variants:

- ``host``: batches cut from host numpy arrays with a fresh permutation per epoch, exactly
  as :class:`unitrain.ArrayLoader` does, and handed to torch with ``torch.from_numpy`` (no
  copy);
- ``device``: the training set made tensors once; each epoch's permutation goes in as one
  index tensor and each batch is gathered with ``index_select``.

The epoch's mean loss is summed on the device with one in-place add per step and read once
per epoch, as unitrain reads it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.methods import Gate
from benchmarks.models import torch_model
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, SEED, Workload, torch_inputs

__all__ = ["train"]


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with a plain eager loop fed host batches (or gathered from tensors)."""
    x, y = torch_inputs(workload)
    data = (torch.from_numpy(x), torch.from_numpy(y)) if variant == "device" else None
    model = torch_model(workload).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    size, steps = workload.batch_size, workload.steps_per_epoch
    for epoch in range(gate.epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(len(x))
        running = torch.zeros(())
        rows = torch.from_numpy(order[: steps * size].reshape(steps, size))
        for i in range(steps):
            if data is not None:
                inputs, targets = data[0].index_select(0, rows[i]), data[1].index_select(0, rows[i])
            else:
                chosen = order[i * size : (i + 1) * size]
                inputs, targets = torch.from_numpy(x[chosen]), torch.from_numpy(y[chosen])
            optimizer.zero_grad(set_to_none=True)
            # Sequence logits (N, L, V) are averaged over every token, as unitrain does.
            loss = F.cross_entropy(model(inputs).flatten(0, -2), targets.flatten())
            loss.backward()
            optimizer.step()
            running += loss.detach()
        gate.epoch_end(float(running) / steps)
