"""The TensorFlow adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, seeds, tensor specs), ``model`` (losses, dropout keys, native models'
variable names), ``layers`` (any portable model as one ``tf.Module``), ``optimizers`` (the optimizer
table), ``precision``, ``distributed`` (``tf.distribute``: :class:`LocalDevices` over this process's
devices, ``MultiWorkerMirroredStrategy`` across processes), ``prefetch``.
"""

from unitrain.backends.tensorflow.backend import TensorFlowBackend
from unitrain.backends.tensorflow.distributed import LocalDevices

__all__ = ["LocalDevices", "TensorFlowBackend"]
