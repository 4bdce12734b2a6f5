"""The seam between the Trainer and a framework, and the adapters built on it.

The seam, which knows no framework:

- :mod:`unitrain.backends.protocol`: the :class:`~unitrain.Backend` protocol an adapter
  implements, its options and capabilities;
- :mod:`unitrain.backends.registry`: finding a backend by name (built-ins and the
  ``unitrain.backends`` entry-point group);
- :mod:`unitrain.backends.strategy`: one worker or several (data-parallel) seen from the core;
- :mod:`unitrain.backends.precision`: compute dtypes and the loss scaler;
- :mod:`unitrain.backends.state`: the flat ``model.*`` / ``optimizer.*`` state layout.

The adapters, each importing its framework: ``unitrain.backends.numpy`` (the float64
reference), ``unitrain.backends.torch``, ``unitrain.backends.jax`` and
``unitrain.backends.tensorflow``. Importing this package imports none of them.
"""
