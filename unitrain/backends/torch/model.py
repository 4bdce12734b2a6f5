"""The losses of the PyTorch adapter (structured batches' among them), and the deprecated name
of the portable MLP's module."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from unitrain import ConfigError, losses, ops
from unitrain.backends.torch import ops as torch_ops
from unitrain.backends.torch.layers import PortableModule
from unitrain.models import MLP
from unitrain.structure import map_leaves, split_batch

__all__ = ["TorchMLP", "batch_loss_in_ops", "loss_function", "structured_tensors"]


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


LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(loss: losses.CrossEntropy) -> LossFunction:
    """torch's fused ``cross_entropy``, whose definition :class:`~unitrain.losses.CrossEntropy`
    follows (the kit holds it to the loss's code in ops)."""
    weights = None if loss.class_weights is None else torch.tensor(loss.class_weights)
    ignore = -100 if loss.ignore_index is None else loss.ignore_index

    def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if weights is not None:  # the loss's own error for weights of the wrong length
            loss.check_classes(out.shape[-1])
        if out.ndim > 2:  # every position of (N, L, V) logits
            out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        weight = None if weights is None else weights.to(out.device, out.dtype)
        return F.cross_entropy(
            out, y, weight, ignore_index=ignore, label_smoothing=loss.label_smoothing
        )

    return cross_entropy


def _mse(loss: losses.MSE) -> LossFunction:
    """torch's ``mse_loss``; targets may come as ``(n,)`` for one output."""
    return lambda out, y: F.mse_loss(out, y.to(out.dtype).reshape(out.shape))


#: The losses torch computes natively, faster than their code in ops (one fused kernel).
NATIVE_LOSSES: dict[type, Callable[[Any], LossFunction]] = {
    losses.CrossEntropy: _cross_entropy,
    losses.MSE: _mse,
}


def written_in_ops(loss: losses.AbstractLoss) -> LossFunction:
    """``loss``'s own code in ops, run by torch's ops."""

    def generic(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        token = ops.enter(torch_ops)
        try:
            result: torch.Tensor = loss(out, y)
        finally:
            ops.leave(token)
        return result

    return generic


def loss_function(loss: Any, native: bool = True) -> tuple[LossFunction, bool]:
    """The torch function of ``loss`` (a :mod:`unitrain.losses` loss, its type name, or a
    native callable) and whether it takes class labels.

    A loss with a native form in :data:`NATIVE_LOSSES` runs that form unless ``native`` is
    False; any other runs its code in ops.
    """
    loss = losses.resolve_loss(loss)
    if not isinstance(loss, losses.AbstractLoss):
        return loss, False  # a native callable
    native_form = NATIVE_LOSSES.get(type(loss)) if native else None
    fn = native_form(loss) if native_form is not None else written_in_ops(loss)
    return fn, loss.takes_labels


def structured_tensors(
    batch: Any, device: torch.device, dtype: torch.dtype
) -> tuple[Any, losses.BatchView]:
    """A structured batch (tuples or dicts of arrays, sample weights) as tensors on
    ``device``: integer leaves as int64 (token ids, labels, masks), the others in ``dtype``.
    Returns the inputs and the whole batch, which :func:`batch_loss_in_ops` reads."""

    def tensor(leaf: Any) -> torch.Tensor:
        value = torch.as_tensor(leaf)
        if value.is_floating_point():
            return value.to(device, dtype)
        return value.to(device, torch.int64 if value.dtype != torch.bool else torch.bool)

    inputs, targets, weight = split_batch(batch)
    x = map_leaves(tensor, inputs)
    view = losses.BatchView(
        x, map_leaves(tensor, targets), None if weight is None else tensor(weight)
    )
    return x, view


def batch_loss_in_ops(
    loss: Any, out: Any, batch: losses.BatchView, terms: Any, dtype: torch.dtype
) -> torch.Tensor:
    """:func:`unitrain.losses.batch_loss` under torch's ops, the outputs in ``dtype``
    (float32 under mixed precision)."""
    out = map_leaves(lambda t: t.to(dtype) if t.is_floating_point() else t, out)
    token = ops.enter(torch_ops)
    try:
        value: torch.Tensor = losses.batch_loss(
            loss, out, batch.inputs, batch.targets, batch.sample_weight, terms
        )
    finally:
        ops.leave(token)
    return value
