"""The TensorFlow adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, seeds, tensor specs), ``model`` (the portable MLP, losses, dropout
keys), ``layers`` (portable layers as ``tf.Module``), ``optimizers`` (the optimizer table),
``precision``, ``distributed`` (``tf.distribute``: :class:`LocalDevices` over this process's
devices, ``MultiWorkerMirroredStrategy`` across processes), ``prefetch``.
"""

from unitrain.backends.tensorflow.backend import TensorFlowBackend
from unitrain.backends.tensorflow.distributed import LocalDevices

__all__ = ["LocalDevices", "TensorFlowBackend"]
