"""The numpy reference adapter: the core's forward differentiated by its own ops, in float64 or
float32.

Modules: ``backend`` (the Backend class: it runs :func:`unitrain.models.apply` under ``ops``
and sweeps the graph for the gradients), ``ops`` (the :mod:`unitrain.ops` contract with a
hand-written derivative for every op, from the private ``_ops_*`` modules and the graph of
``_tape``), ``precision`` (mixed-precision rounding).
"""

from unitrain.backends.numpy.backend import NumpyBackend

__all__ = ["NumpyBackend"]
