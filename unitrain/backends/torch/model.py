"""The losses of the PyTorch adapter, and the deprecated name of the portable MLP's module."""

from __future__ import annotations

import warnings
from typing import Any

import torch.nn.functional as F

from unitrain import ConfigError
from unitrain.backends.torch.layers import PortableModule
from unitrain.models import MLP

__all__ = ["TorchMLP", "loss_function"]


class TorchMLP(PortableModule):
    """Deprecated: :class:`~unitrain.backends.torch.layers.PortableModule` runs an MLP (and
    any other portable model); ``TorchMLP(spec)`` is ``PortableModule(spec)``.

    The MLP had a module of its own before every layer's forward was written once in
    :mod:`unitrain.ops`; its parameter names (``layers.{i}.weight``) are unchanged.
    """

    def __init__(self, spec: MLP, seed: int = 0) -> None:
        warnings.warn(
            "unitrain.backends.torch.TorchMLP is deprecated: use "
            "unitrain.backends.torch.layers.PortableModule(spec, seed), which runs any "
            "portable model",
            DeprecationWarning,
            stacklevel=2,
        )
        if not isinstance(spec, MLP):
            raise ConfigError(f"TorchMLP takes a unitrain.models.MLP, got {type(spec).__name__}")
        super().__init__(spec, seed)


def loss_function(loss: Any) -> tuple[Any, bool]:
    """The torch function of ``loss`` and whether it classifies (integer targets)."""
    if loss == "cross_entropy":
        return F.cross_entropy, True
    if loss == "mse":
        return F.mse_loss, False
    if callable(loss):
        return loss, False
    raise ConfigError(f"unknown loss {loss!r}; choose 'cross_entropy', 'mse' or a callable")
