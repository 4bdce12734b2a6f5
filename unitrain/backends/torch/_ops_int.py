"""The op contract where integer arrays are the operands: gathers by index, and the bitwise
functions :mod:`unitrain.ops.random` is written in. torch's ``<<`` treats its left operand as
unsigned (so int32 wraps) and ``>>`` copies the sign bit, as the contract says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from unitrain.ops import Array


def _tensors(x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A Python int beside a tensor becomes a tensor of its dtype, on its device."""
    if not isinstance(x, torch.Tensor):
        x = torch.scalar_tensor(x, dtype=y.dtype, device=y.device)
    if not isinstance(y, torch.Tensor):
        y = torch.scalar_tensor(y, dtype=x.dtype, device=x.device)
    return x, y


def _binary(function: Callable[..., torch.Tensor]) -> Callable[[Array, Array], Array]:
    def op(x: Array, y: Array) -> Array:
        return function(*_tensors(x, y))

    return op


bitwise_and = _binary(torch.bitwise_and)
bitwise_or = _binary(torch.bitwise_or)
bitwise_xor = _binary(torch.bitwise_xor)
bitwise_left_shift = _binary(torch.bitwise_left_shift)
bitwise_right_shift = _binary(torch.bitwise_right_shift)


# -- gathers by index -------------------------------------------------------------------------


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    """``index_select``, whose gradient adds up repeated indices (deterministically on CUDA
    under ``torch.use_deterministic_algorithms``); indices of any rank are flattened and the
    result reshaped."""
    if indices.ndim == 1:
        return torch.index_select(x, axis, indices)
    axis %= x.ndim
    picked = torch.index_select(x, axis, indices.reshape(-1))
    return picked.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1 :])


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    # take_along_dim broadcasts like numpy; gather would silently take a corner instead.
    return torch.take_along_dim(x, indices.to(torch.int64), dim=axis)
