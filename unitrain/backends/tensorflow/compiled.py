"""The TensorFlow backend's compiled functions: the bodies traced into ``tf.function`` s, and the
cache of their concrete functions.

:class:`CompiledGraphs` is the base of :class:`~unitrain.backends.tensorflow.TensorFlowBackend`
(as a Keras 3 model inherits its backend's trainer): the backend creates the variables and
the attributes declared below, and these methods read them while tracing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf  # absolute: the framework, not this package

from unitrain.backends.protocol import BackendOptions
from unitrain.backends.tensorflow import model as tf_model
from unitrain.backends.tensorflow import optimizers
from unitrain.backends.tensorflow.core import spec
from unitrain.backends.tensorflow.distributed import mirrored_loss_and_grads
from unitrain.backends.tensorflow.layers import TFPortable
from unitrain.backends.tensorflow.precision import LossScale
from unitrain.structure import first_leaf, map_leaves

__all__ = ["CompiledGraphs"]


class CompiledGraphs:
    """Graph bodies (run only while tracing) and the function cache of one backend."""

    options: BackendOptions
    module: Any
    params: dict[str, tf.Variable]
    slots: dict[str, list[tf.Variable]]
    grad_buffers: list[tf.Variable]
    step_count: tf.Variable
    key_step: tf.Variable
    skipped_count: tf.Variable
    loss_scale: LossScale
    loss_fn: Callable[[Any, Any], tf.Tensor]
    #: The loss as data (structured batches compute it in ops).
    loss_object: Any
    classification: bool
    #: Whether the loss is a unitrain.losses loss (which reshapes targets itself).
    _loss_reads_targets: bool
    dtype: tf.DType
    device_name: str
    trace_counts: collections.Counter[str]
    _compute_dtype: tf.DType | None
    _dropout: bool
    _keras_losses: bool
    _functions: dict[tuple[Any, ...], Any]
    _polymorphic: dict[tuple[Any, ...], Any]
    #: The functions traced per batch size (see :meth:`_traced_or_sized`).
    _sized: set[str]
    #: The MirroredStrategy every gradient is computed under (:meth:`spread_over`), or None.
    _mirrored: Any = None

    def spread_over(self, strategy: Any) -> None:
        """Compute every gradient under ``strategy`` (a ``tf.distribute.MirroredStrategy``):
        each replica takes its slice of the batch, and their gradients are summed before the
        update (see :mod:`unitrain.backends.tensorflow.distributed`)."""
        self._mirrored = strategy
        self._functions.clear()  # traced without the replicas
        self._polymorphic.clear()

    def _compute_input(self, x: Any) -> Any:
        """``x`` in the compute dtype under mixed precision; token ids stay integers."""
        if self._compute_dtype is None:
            return x
        low = self._compute_dtype
        return map_leaves(lambda leaf: tf.cast(leaf, low) if leaf.dtype.is_floating else leaf, x)

    def _model_loss(
        self, x: tf.Tensor, y: tf.Tensor, training: bool, key: Any, global_size: Any = None
    ) -> Any:
        """Outputs and loss: the batch's loss, or with ``global_size`` (a replica of a
        MirroredStrategy) this slice's loss weighted by its share of the global batch."""
        x = self._compute_input(x)
        terms = None
        if isinstance(self.module, TFPortable):
            out = self.module(x, training=training, key=key)
            terms = self.module.__dict__.get("reported_losses")
            # The loss in float32 (a no-op without mixing).
            out = map_leaves(lambda leaf: tf.cast(leaf, self.dtype), out)
        else:
            out = self.module(x, training=training)
        if terms or isinstance(y, tuple):  # a structured batch, an objective, loss terms
            loss = tf_model.batch_loss_in_ops(self.loss_object, out, y, terms or ())
        else:
            # A unitrain.losses loss reads the targets as they come; a native callable gets
            # them in the outputs' shape, as it always has.
            target = y if self._loss_reads_targets else tf.reshape(y, tf.shape(out))
            loss = self.loss_fn(out, target)
        if global_size is not None:
            # Replicas' gradients are summed, so each slice's loss is weighted by its share of
            # the global batch, as every strategy weights a worker's slice.
            rows = tf.shape(first_leaf(out))[0]
            share = tf.cast(rows, loss.dtype) / tf.cast(global_size, loss.dtype)
            loss = loss * share
        if self._keras_losses and self.module.losses:
            penalty = tf.add_n(self.module.losses)  # Keras regularisation, as Keras counts it
            if global_size is not None:
                penalty = tf.nn.scale_regularization_loss(penalty)  # once over the replicas
            loss = loss + penalty
        return out, loss

    def _loss_and_grads(self, x: tf.Tensor, y: tf.Tensor, micro_batch: tf.Tensor) -> Any:
        if self._mirrored is not None:
            return mirrored_loss_and_grads(
                self._mirrored, self._slice_loss_and_grads, x, y, micro_batch
            )
        return self._slice_loss_and_grads(x, y, micro_batch)

    def _slice_loss_and_grads(
        self, x: tf.Tensor, y: tf.Tensor, micro_batch: tf.Tensor, global_size: Any = None
    ) -> Any:
        key = None
        if self._dropout:
            key = tf_model.dropout_key(
                self.options.seed, self.key_step.read_value(), micro_batch, self.options.random
            )
        params = list(self.params.values())
        with tf.GradientTape() as tape:
            _, loss = self._model_loss(x, y, True, key, global_size)
            # Exactly 1.0 for a finite loss, NaN otherwise: a non-finite loss makes every
            # gradient NaN, so the guard skips the update even where the gradients would be
            # finite (a float32 mse that overflows to inf).
            poisoned = loss * tf.stop_gradient(loss * 0 + 1)
            scaled = self.loss_scale.scaled(poisoned)
        grads = tape.gradient(scaled, params)
        # A parameter the loss does not reach gets a zero gradient, as an unused buffer would;
        # an embedding's sparse gradient (IndexedSlices from tf.gather) is made dense, as the
        # update rules and the gradient buffers expect.
        return loss, [
            tf.zeros_like(p) if g is None else tf.convert_to_tensor(g)
            for p, g in zip(params, grads, strict=True)
        ]

    def _guarded_update(self, grads: list[tf.Tensor], lr: tf.Tensor) -> None:
        grads = self.loss_scale.unscaled(grads)
        clip = self.options.grad_clip_norm
        if clip is None:
            finite = optimizers.all_finite(grads)
        else:
            norm = optimizers.global_norm(grads)
            finite = tf.math.is_finite(norm)
        self.loss_scale.advance(finite)

        def apply() -> None:
            clipped = grads
            if clip is not None:
                coefficient = optimizers.clip_coefficient(norm, clip, self.dtype)
                clipped = [g * coefficient for g in grads]
            step = self.step_count.read_value()
            optimizers.update_parameters(
                self.options.optimizer, list(self.params.values()), clipped, self.slots, step, lr
            )
            self.step_count.assign_add(1)

        def skip() -> None:
            self.skipped_count.assign_add(1)

        tf.cond(finite, apply, skip)
        self.key_step.assign_add(1)  # every update, applied or skipped, as the caller counts

    def _forward_graph(self, x: tf.Tensor, y: tf.Tensor, micro_batch: tf.Tensor) -> Any:
        return self._loss_and_grads(x, y, micro_batch)

    def _accumulate_graph(self, grads: list[tf.Tensor], scale: tf.Tensor) -> None:
        for buffer, g in zip(self.grad_buffers, grads, strict=True):
            buffer.assign_add(g * scale)

    def _step_graph(self, lr: tf.Tensor) -> None:
        self._guarded_update([b.read_value() for b in self.grad_buffers], lr)
        for buffer in self.grad_buffers:
            buffer.assign(tf.zeros_like(buffer))

    def _train_step_graph(
        self, x: tf.Tensor, y: tf.Tensor, micro_batch: tf.Tensor, lr: tf.Tensor
    ) -> tf.Tensor:
        loss, grads = self._loss_and_grads(x, y, micro_batch)
        self._guarded_update(grads, lr)
        return loss

    def _loop(self, batch_at: Callable[[tf.Tensor], Any], lrs: tf.Tensor) -> tf.Tensor:
        """``len(lrs)`` fused steps in a ``tf.while_loop``; one trace serves every ``k``."""
        k = tf.shape(lrs)[0]
        micro_batch = tf.constant(0, tf.int64)

        def body(i: tf.Tensor, losses: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray]:
            x, y = batch_at(i)
            loss, grads = self._loss_and_grads(x, y, micro_batch)
            self._guarded_update(grads, lrs[i])
            return i + 1, losses.write(i, loss)

        losses = tf.TensorArray(self.dtype, size=k)
        # parallel_iterations=1: each update must see the parameters of the previous one.
        _, losses = tf.while_loop(
            lambda i, _: i < k, body, (tf.constant(0), losses), parallel_iterations=1
        )
        return losses.stack()

    def _train_steps_graph(self, xs: tf.Tensor, ys: tf.Tensor, lrs: tf.Tensor) -> tf.Tensor:
        return self._loop(lambda i: (xs[i], ys[i]), lrs)

    def _gather_steps_graph(
        self, x: tf.Tensor, y: tf.Tensor, indices: tf.Tensor, lrs: tf.Tensor
    ) -> tf.Tensor:
        return self._loop(lambda i: (tf.gather(x, indices[i]), tf.gather(y, indices[i])), lrs)

    def _evaluate_graph(self, x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
        out, loss = self._model_loss(x, y, False, None)
        metrics = {"loss": loss}
        if self.classification:  # the first output against the first target
            out, y = first_leaf(out), first_leaf(y[1] if isinstance(y, tuple) else y)
            correct = tf.equal(tf.argmax(out, axis=-1, output_type=y.dtype), y)
            metrics["accuracy"] = tf.reduce_mean(tf.cast(correct, tf.float32))
        return metrics

    def _function(self, key: tuple[Any, ...], body: Callable[..., Any], signature: Any) -> Any:
        """The compiled ``body`` for ``key``: traced once, on first use, for ``signature``.

        The concrete function is kept and called directly: a polymorphic ``tf.function``
        binds and matches its arguments in Python on every call, which costs about as much
        as a whole small training step.
        """
        function = self._functions.get(key)
        if function is None:
            name = key[0]

            def traced(*args: Any) -> Any:
                self.trace_counts[name] += 1  # Python side effect: runs only while tracing
                with tf.device(self.device_name):
                    return body(*args)

            polymorphic = tf.function(traced, input_signature=signature, autograph=False)
            function = polymorphic.get_concrete_function()
            self._functions[key], self._polymorphic[key] = function, polymorphic
        return function

    def _batch_function(
        self,
        name: str,
        body: Callable[..., Any],
        x: tf.Tensor,
        y: tf.Tensor,
        *extra: tf.TensorSpec,
        stacked: bool = False,
    ) -> Any:
        """A function per (name, input feature shapes and dtypes), batch axes left unknown
        (unless the model needs the batch size: :meth:`_traced_or_sized`)."""
        unknown = (2 if stacked else 1) - (name in self._sized)  # a stack's k stays unknown
        if isinstance(y, tuple):  # a structured batch: its every leaf keys the function
            key: tuple[Any, ...] = (name, *tf_model.structure_key((x, y), unknown))
        else:
            key = (name, x.dtype, tuple(x.shape[unknown:]), y.dtype, tuple(y.shape[unknown:]))
        function = self._functions.get(key)
        if function is None:
            specs = [map_leaves(lambda t: spec(t, leading=unknown), part) for part in (x, y)]
            inputs = (*specs, *extra)
            function = self._traced_or_sized(key, body, inputs)
            if function is None:
                return self._batch_function(name, body, x, y, *extra, stacked=stacked)
        return function

    def _traced_or_sized(self, key: tuple[Any, ...], body: Callable[..., Any], inputs: Any) -> Any:
        """``_function(key, body, inputs)``; None where the trace needs the batch size as a
        number, and from then on the function ``key[0]`` is traced per batch size.

        The core's layers read shapes as numbers (``ops.shape``); on an unknown axis this
        backend's ops give a scalar tensor, which serves reshapes, mask shapes and arithmetic,
        but not Python control flow: BatchNorm checks its count of values per channel in train
        mode, a stateful RNN its batch size. Such a trace fails with
        ``OperatorNotAllowedInGraphError`` at that layer (before any work is done).
        """
        name = key[0]
        try:
            return self._function(key, body, inputs)
        except tf.errors.OperatorNotAllowedInGraphError:
            if name in self._sized:
                raise
        self.trace_counts[name] -= 1  # the trace that failed
        self._sized.add(name)
        return None
