"""The PyTorch backend's precision policy: matmul precision, autocast and the loss scaler.

- ``matmul_precision`` maps to ``torch.set_float32_matmul_precision`` (and cuDNN's TF32
  switch for convolutions). Both are process-wide in torch, so the last backend built sets
  them, as ``deterministic`` does with ``torch.use_deterministic_algorithms``.
- Mixed precision is ``torch.autocast``: parameters stay float32 (the master weights) and
  autocast casts matmul operands to bfloat16/float16 per op; the gradients land in float32.
- ``"16-mixed"`` runs :func:`unitrain.backends.precision.next_loss_scale` with ``torch.where`` on
  host tensors: the update already reads the non-finite flag on the host (see
  ``TorchBackend._gradients_finite``), so the scaler adds no sync of its own. torch's own
  ``GradScaler`` is not used: its rule has no upper bound and lives in a different state.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from unitrain.backends.precision import (
    GOOD_STEPS_KEY,
    SCALE_KEY,
    next_loss_scale,
    take_scaler_state,
)
from unitrain.backends.protocol import BackendOptions

__all__ = ["MixedPrecision", "cpu_float16_autocast", "set_matmul_precision"]

_COMPUTE_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def set_matmul_precision(precision: str) -> None:
    """Apply ``matmul_precision`` to torch's float32 matmuls and cuDNN convolutions."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision != "highest"


def cpu_float16_autocast() -> bool:
    """Whether this torch autocasts linear layers to float16 on the CPU (2.x builds do)."""
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = torch.addmm(torch.zeros(2), torch.ones(2, 2), torch.ones(2, 2))
    except (RuntimeError, ValueError):  # older builds reject the dtype or warn as an error
        return False
    return out.dtype == torch.float16


class MixedPrecision:
    """Autocast and the loss scaler of one backend, as its ``options`` ask.

    Attributes:
        compute_dtype: the autocast dtype, or None under ``"32"``.
        scaled: whether the loss scaler runs (``"16-mixed"``).
    """

    def __init__(self, options: BackendOptions, device: torch.device) -> None:
        self.rule = options.loss_scaler
        self.compute_dtype = _COMPUTE_DTYPES.get(options.precision)
        self.scaled = options.precision == "16-mixed"
        self._device_type = device.type
        scale, good = self.rule.initial_state()
        self.scale = torch.tensor(scale)  # host tensors: read with the finite flag
        self.good_steps = torch.tensor(good)

    def autocast(self) -> Any:
        """The context the forward runs in: autocast to the compute dtype, or nothing."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=self.compute_dtype)

    def loss_multiplier(self, scale: float) -> float:
        """What to multiply the loss by before backward: ``scale`` times the loss scale."""
        return scale * float(self.scale) if self.scaled else scale

    def unscale(self, grads: list[torch.Tensor]) -> None:
        """Divide ``grads`` by the loss scale in place (exact: the scale is a power of two)."""
        if self.scaled and grads:
            torch._foreach_mul_(grads, 1.0 / float(self.scale))

    def update(self, finite: bool) -> None:
        """Advance the scaler after an update whose gradients were ``finite`` or not."""
        if self.scaled:
            self.scale, self.good_steps = next_loss_scale(
                self.rule, self.scale, self.good_steps, torch.tensor(finite), torch.where
            )

    def state(self) -> dict[str, np.ndarray]:
        """The scaler's state-dict entries (none unless scaled)."""
        if not self.scaled:
            return {}
        return {
            SCALE_KEY: np.array(self.scale.item(), np.float32),
            GOOD_STEPS_KEY: np.array(self.good_steps.item(), np.int64),
        }

    def load(self, optimizer_state: dict[str, np.ndarray]) -> None:
        """Take the scaler's entries out of ``optimizer_state`` and restore them."""
        if self.scaled:
            scale, good = take_scaler_state(optimizer_state)
            self.scale, self.good_steps = torch.tensor(scale), torch.tensor(good)
