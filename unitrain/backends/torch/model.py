"""The portable MLP and the losses of the PyTorch adapter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from unitrain import ConfigError
from unitrain.models import MLP

__all__ = ["TorchMLP", "loss_function"]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
}


class _Dense(nn.Module):
    """One layer of the MLP, ``x @ weight + bias``, with the canonical ``(in, out)`` weight."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_in, fan_out))
        self.bias = nn.Parameter(torch.empty(fan_out))


class TorchMLP(nn.Module):
    """:class:`unitrain.models.MLP` in PyTorch, with canonical ``(in, out)`` weight layout.

    Dropout masks come from a private generator seeded per forward from
    ``(seed, step, micro_batch)``, so a resumed run draws the masks of an uninterrupted one.
    """

    def __init__(self, spec: MLP) -> None:
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList()
        for fan_in, fan_out in zip(spec.sizes, spec.sizes[1:]):
            self.layers.append(_Dense(fan_in, fan_out))
        self.activation = _ACTIVATIONS[spec.activation]
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        keep = 1.0 - self.spec.dropout
        for i, layer in enumerate(cast("list[_Dense]", self.layers)):
            x = torch.addmm(layer.bias, x, layer.weight)
            if i < last:
                x = self.activation(x)
                if self.training and self.spec.dropout:
                    mask = torch.rand(x.shape, generator=self.generator, device=x.device)
                    x = x * (mask < keep).to(x.dtype) / keep
        return x


def loss_function(loss: Any) -> tuple[Any, bool]:
    if loss == "cross_entropy":
        return F.cross_entropy, True
    if loss == "mse":
        return F.mse_loss, False
    if callable(loss):
        return loss, False
    raise ConfigError(f"unknown loss {loss!r}; choose 'cross_entropy', 'mse' or a callable")
