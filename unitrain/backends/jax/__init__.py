"""The JAX adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, host conversions), ``model`` (native models, losses),
``layers`` (any portable model as one pure function), ``optimizers`` (the optimizer table),
``precision``, ``distributed`` (``jax.sharding`` and ``jax.distributed``), ``prefetch``;
and two of JAX's own: ``compiled`` (the jitted update functions) and ``losslog`` (losses kept
on the device until read).
"""

from unitrain.backends.jax.backend import JaxBackend
from unitrain.backends.jax.distributed import LocalDevices
from unitrain.backends.jax.model import JaxModel

__all__ = ["JaxBackend", "JaxModel", "LocalDevices"]
