"""The PyTorch adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, tensor conversions), ``model`` (losses), ``layers`` (any portable
model as one ``nn.Module``, :class:`~.layers.PortableModule`), ``optimizers`` (the optimizer
table), ``precision``, ``distributed`` (DDP), ``prefetch``; and ``kernels``, torch's own: which
fused or multi-tensor kernel is correct here, the non-finite checks and the device guard.
"""

from unitrain.backends.torch.backend import TorchBackend
from unitrain.backends.torch.model import TorchMLP

__all__ = ["TorchBackend", "TorchMLP"]
