"""The numpy reference adapter: every layer and optimizer by hand, in float64 or float32.

Modules (the same names in every adapter folder): ``backend`` (the Backend class),
``model`` (a portable model as a tree of nodes), ``layers`` (each layer's forward and
backward), ``precision`` (mixed-precision rounding).
"""

from unitrain.backends.numpy.backend import NumpyBackend

__all__ = ["NumpyBackend"]
