"""The PyTorch adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, tensor conversions), ``model`` (the portable MLP, losses),
``layers`` (portable layers as ``nn.Module``), ``optimizers`` (the optimizer table and the
kernel each runs on), ``precision``, ``distributed`` (DDP), ``prefetch``.
"""

from unitrain.backends.torch.backend import TorchBackend
from unitrain.backends.torch.model import TorchMLP

__all__ = ["TorchBackend", "TorchMLP"]
