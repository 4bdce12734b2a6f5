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
  The backend holds it apart from autocast, as :class:`LossScale`, the name of the loss
  scaler in every adapter that keeps it in an object
  (:class:`~unitrain.backends.common.loss_scale.AbstractLossScale`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from unitrain.backends.common.loss_scale import AbstractLossScale
from unitrain.backends.protocol import BackendOptions

__all__ = ["LossScale", "MixedPrecision", "cpu_float16_autocast", "set_matmul_precision"]

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
    """Autocast of one backend, as its ``options`` ask.

    Attributes:
        compute_dtype: the autocast dtype, or None under ``"32"``.
    """

    def __init__(self, options: BackendOptions, device: torch.device) -> None:
        self.compute_dtype = _COMPUTE_DTYPES.get(options.precision)
        self._device_type = device.type

    def autocast(self) -> Any:
        """The context the forward runs in: autocast to the compute dtype, or nothing."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=self.compute_dtype)


class LossScale(AbstractLossScale):
    """The ``"16-mixed"`` loss scaler of one backend, as host tensors (inactive otherwise).

    Args:
        options: the backend's options (``precision`` and ``loss_scaler``).
    """

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options, torch.where)
        scale, good = self.rule.initial_state()
        self.scale = torch.tensor(scale)  # host tensors: read with the finite flag
        self.good_steps = torch.tensor(good)

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scale, self.good_steps

    def _write(self, scale: Any, good_steps: Any) -> None:
        self.scale, self.good_steps = torch.as_tensor(scale), torch.as_tensor(good_steps)

    def multiplier(self, scale: float) -> float:
        """What to multiply the loss by before backward: ``scale`` times the loss scale."""
        return scale * float(self.scale) if self.active else scale

    def unscale(self, grads: list[torch.Tensor]) -> None:
        """Divide ``grads`` by the loss scale in place (exact: the scale is a power of two)."""
        if self.active and grads:
            torch._foreach_mul_(grads, 1.0 / float(self.scale))
