"""PyTorch Lightning ``Trainer.fit`` with the idiomatic ``DataLoader(TensorDataset)``.

For fairness the progress bar, the logger, checkpointing and the model summary are turned
off (they print or write files that no other method does); everything else keeps Lightning's
defaults (``num_workers=0`` loader, automatic optimisation, no validation loop). The
LightningModule wraps the same ``nn.Sequential`` as the native torch loop and returns the
loss from ``training_step`` without ``self.log``.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.methods import Gate
from benchmarks.models import torch_model
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, SEED, Workload, torch_inputs

__all__ = ["train"]


class _Module(pl.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.epoch_loss = torch.zeros(())

    def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
        inputs, targets = batch
        loss = F.cross_entropy(self.net(inputs).flatten(0, -2), targets.flatten())
        self.epoch_loss += loss.detach()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)


class _GateCallback(pl.Callback):
    def __init__(self, gate: Gate, steps: int) -> None:
        self.gate, self.steps = gate, steps

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        assert isinstance(module, _Module)
        loss = float(module.epoch_loss) / self.steps
        module.epoch_loss = torch.zeros(())
        self.gate.epoch_end(loss)


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with ``lightning.pytorch.Trainer.fit``."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no "GPU available" lines
    x, y = torch_inputs(workload)
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    loader = DataLoader(
        dataset,
        batch_size=workload.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
    )
    trainer = pl.Trainer(
        max_epochs=gate.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_GateCallback(gate, workload.steps_per_epoch)],
    )
    trainer.fit(_Module(torch_model(workload)), loader)
