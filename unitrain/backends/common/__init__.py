"""What the built-in adapters share because their logic is the same, written once.

- :func:`~unitrain.backends.common.staging.one_ahead`: batches staged on the device one
  ahead of the step that uses them (each adapter says how to stage one);
- :class:`~unitrain.backends.common.workers.SummingWorkers`: the strategy of a launched
  worker on an engine whose gradient reduction sums (``jax.distributed``, TensorFlow's
  MultiWorkerMirroredStrategy); each adapter says how to sum; and
  :class:`~unitrain.backends.common.workers.WorkerPart`, what such an adapter's
  ``distribute`` (:func:`~unitrain.backends.common.workers.keep_worker_part`) sets: how its
  gradients are summed, which worker keys its dropout;
- :class:`~unitrain.backends.common.loss_scale.AbstractLossScale`: the ``"16-mixed"`` loss
  scaler's state (when it runs, how it advances, its checkpoint entries); each adapter's
  ``LossScale`` says where the two numbers live;
- :func:`~unitrain.backends.common.renamed.renamed_getattr`: the old names of a concept an
  adapter renamed to the name every adapter uses, kept importable with a warning.

Third-party adapters may use them too: like :mod:`unitrain.backends.protocol`, this package
is part of the adapter-facing surface.
"""

from unitrain.backends.common.loss_scale import AbstractLossScale
from unitrain.backends.common.renamed import renamed_getattr
from unitrain.backends.common.staging import one_ahead
from unitrain.backends.common.workers import SummingWorkers, WorkerPart, keep_worker_part

__all__ = [
    "AbstractLossScale",
    "SummingWorkers",
    "WorkerPart",
    "keep_worker_part",
    "one_ahead",
    "renamed_getattr",
]
