"""The TensorFlow backend's cache of traced functions: each body traced once per input signature.

A body is traced into a ``tf.function`` with autograph off, and its concrete function is kept
and called directly: a polymorphic ``tf.function`` binds and matches its arguments in Python
on every call, which costs about as much as a whole small training step. Batch axes are left
unknown (``None``), so the smaller last batch of an epoch does not retrace, unless the model
reads the batch size as a number (see :meth:`TraceCache.traced_or_sized`). ``counts`` counts
the traces by name, which tests hold to one per function.

The cache knows nothing of models or optimizers: :class:`~.compiled.CompiledSteps` hands it
the bodies to trace.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf  # absolute: the framework, not this package

from unitrain.backends.tensorflow import model as tf_model
from unitrain.backends.tensorflow.core import matrix, spec
from unitrain.structure import map_leaves

__all__ = ["TraceCache"]


class TraceCache:
    """Concrete functions by key (a name, then the input shapes and dtypes), traced on one
    device.

    Attributes:
        counts: how many times each function was traced, by name.
        polymorphic: the ``tf.function`` behind each concrete function (TensorFlow's own
            trace counts).
    """

    def __init__(self, device_name: str) -> None:
        self.device_name = device_name
        self.counts: collections.Counter[str] = collections.Counter()
        self.polymorphic: dict[tuple[Any, ...], Any] = {}
        self._functions: dict[tuple[Any, ...], Any] = {}
        #: The names traced per batch size (see :meth:`traced_or_sized`).
        self._sized: set[str] = set()

    def clear(self) -> None:
        """Forget every traced function (the next call of each traces it again)."""
        self._functions.clear()
        self.polymorphic.clear()

    def function(self, key: tuple[Any, ...], body: Callable[..., Any], signature: Any) -> Any:
        """The compiled ``body`` for ``key``: traced once, on first use, for ``signature``."""
        function = self._functions.get(key)
        if function is None:
            name = key[0]

            def traced(*args: Any) -> Any:
                self.counts[name] += 1  # Python side effect: runs only while tracing
                with tf.device(self.device_name):
                    return body(*args)

            polymorphic = tf.function(traced, input_signature=signature, autograph=False)
            function = polymorphic.get_concrete_function()
            self._functions[key], self.polymorphic[key] = function, polymorphic
        return function

    def batch_function(
        self,
        name: str,
        body: Callable[..., Any],
        x: tf.Tensor,
        y: tf.Tensor,
        *extra: tf.TensorSpec,
        stacked: bool = False,
    ) -> Any:
        """A function per (name, input feature shapes and dtypes), batch axes left unknown
        (unless the model needs the batch size: :meth:`traced_or_sized`); ``extra`` are the
        specs of the arguments after ``x`` and ``y``."""
        unknown = (2 if stacked else 1) - (name in self._sized)  # a stack's k stays unknown
        if isinstance(y, tuple):  # a structured batch: its every leaf keys the function
            key: tuple[Any, ...] = (name, *tf_model.structure_key((x, y), unknown))
        else:
            key = (name, x.dtype, tuple(x.shape[unknown:]), y.dtype, tuple(y.shape[unknown:]))
        function = self._functions.get(key)
        if function is None:
            specs = [map_leaves(lambda t: spec(t, leading=unknown), part) for part in (x, y)]
            function = self.traced_or_sized(key, body, (*specs, *extra))
            if function is None:
                return self.batch_function(name, body, x, y, *extra, stacked=stacked)
        return function

    def rows_function(
        self,
        name: str,
        body: Callable[..., Any],
        data: tuple[tf.Tensor, tf.Tensor],
        indices: tf.Tensor,
        *extra: tf.TensorSpec,
    ) -> Any:
        """A function over a whole data set on the device and a ``(k, batch)`` matrix of row
        indices: ``k`` stays unknown, the batch size too unless the model needs it."""
        specs = (spec(data[0], full=True), spec(data[1], full=True))
        rows = tf.TensorSpec([None, indices.shape[1]], tf.int64)
        if name not in self._sized:  # see traced_or_sized
            rows = matrix(tf.int64)
        key = (name, *specs, rows)
        function = self._functions.get(key)
        if function is None:
            function = self.traced_or_sized(key, body, (*specs, rows, *extra))
            if function is None:
                return self.rows_function(name, body, data, indices, *extra)
        return function

    def traced_or_sized(self, key: tuple[Any, ...], body: Callable[..., Any], inputs: Any) -> Any:
        """``function(key, body, inputs)``; None where the trace needs the batch size as a
        number, and from then on the function ``key[0]`` is traced per batch size.

        The core's layers read shapes as numbers (``ops.shape``); on an unknown axis this
        backend's ops give a scalar tensor, which serves reshapes, mask shapes and arithmetic,
        but not Python control flow: BatchNorm checks its count of values per channel in train
        mode, a stateful RNN its batch size. Such a trace fails with
        ``OperatorNotAllowedInGraphError`` at that layer (before any work is done).
        """
        name = key[0]
        try:
            return self.function(key, body, inputs)
        except tf.errors.OperatorNotAllowedInGraphError:
            if name in self._sized:
                raise
        self.counts[name] -= 1  # the trace that failed
        self._sized.add(name)
        return None
