"""The TensorFlow adapter.

Modules (the same names in every adapter folder): ``backend`` (the Backend class), ``core``
(devices, determinism, seeds, tensor specs), ``model`` (the portable MLP, losses, dropout
keys), ``layers`` (portable layers as ``tf.Module``), ``optimizers`` (the optimizer table),
``precision``, ``distributed`` (``tf.distribute``), ``prefetch``.
"""

from unitrain.backends.tensorflow.backend import TensorFlowBackend

__all__ = ["TensorFlowBackend"]
