"""The TensorFlow backend's compiled steps: the traced functions of an update and the variables
they update.

:class:`CompiledSteps` is a part the backend holds: built from the model, its trainable
variables and the backend's options, it owns the optimizer slots, the gradient buffers, the
device-side counters and the loss scaler, and offers one call per compiled function
(``forward``, ``accumulate``, ``step``, ``train_step``, ``train_steps``, ``gather_steps``,
``evaluate``). It takes tensors already converted by the backend and keeps no host
bookkeeping: the dropout key's numbers and the protocol's order of calls stay with
:class:`~unitrain.backends.tensorflow.TensorFlowBackend`. The bodies run only while tracing;
:class:`~.tracing.TraceCache` traces each once per input signature.

A backend that computes its gradients differently (the kit's data-parallel traps in the test
suite) subclasses this class and names the subclass in ``TensorFlowBackend.compiled_steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf  # absolute: the framework, not this package

from unitrain.backends.protocol import BackendOptions
from unitrain.backends.tensorflow import model as tf_model
from unitrain.backends.tensorflow import optimizers
from unitrain.backends.tensorflow.core import scalar, spec, vector, zeros_variable
from unitrain.backends.tensorflow.distributed import mirrored_loss_and_grads
from unitrain.backends.tensorflow.layers import PortableModule
from unitrain.backends.tensorflow.precision import LossScale
from unitrain.backends.tensorflow.tracing import TraceCache
from unitrain.losses import AbstractLoss, resolve_loss
from unitrain.structure import first_leaf, map_leaves

__all__ = ["CompiledSteps"]


class CompiledSteps:
    """The compiled functions of one backend's updates, and the variables they update.

    Args:
        module: the model (a :class:`~.layers.PortableModule`, a Keras model or a ``tf.Module``).
        params: its trainable variables under their state-dict names, in gradient order.
        options: the backend's options (optimizer, loss, seed, clipping, precision).
        dtype: the parameters' dtype.
        compute_dtype: the compute dtype of mixed precision, or None.
        device_name: the TensorFlow device every function is traced on.

    Attributes:
        slots: the optimizer's state, one variable per parameter for each slot.
        grad_buffers: the gradients ``accumulate`` adds into and ``step`` applies.
        step_count: updates applied (the optimizer's step).
        key_step: the dropout key's step: advanced by every update, skipped or not, as the
            caller's ``step``; the backend sets it where the caller's differs.
        skipped_count: updates skipped because a gradient was not finite.
        loss_scale: the ``"16-mixed"`` loss scaler (inactive otherwise).
        classification: whether the loss takes class labels (integer targets).
        mirrored: the MirroredStrategy every gradient is computed under, or None.
    """

    def __init__(
        self,
        module: Any,
        params: dict[str, tf.Variable],
        options: BackendOptions,
        dtype: tf.DType,
        compute_dtype: tf.DType | None,
        device_name: str,
    ) -> None:
        self.module, self.params, self.options = module, params, options
        self.dtype, self.compute_dtype = dtype, compute_dtype
        self.slots = {
            slot: [zeros_variable(p) for p in params.values()]
            for slot in options.optimizer.state_slots
        }
        self.grad_buffers = [zeros_variable(p) for p in params.values()]
        self.step_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.key_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="key_step")
        self.skipped_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        self.loss_scale = LossScale(options)
        self.loss_fn, self.classification = tf_model.loss_function(options.loss)
        self.loss_object = resolve_loss(options.loss)
        # A unitrain.losses loss reads the targets as they come (it reshapes them itself).
        self._loss_reads_targets = isinstance(self.loss_object, AbstractLoss)
        # Every train pass of a portable model gets a dropout key, so a layer of the user's
        # that drops values has its stream too (two stateless ops; unused where nothing draws).
        self._dropout = isinstance(module, PortableModule)
        self._keras_losses = hasattr(module, "losses") and not isinstance(module, PortableModule)
        self.mirrored: Any = None
        self.traces = TraceCache(device_name)

    # -- the calls the backend makes ---------------------------------------------------------

    def spread_over(self, strategy: Any) -> None:
        """Compute every gradient under ``strategy`` (a ``tf.distribute.MirroredStrategy``):
        each replica takes its slice of the batch, and their gradients are summed before the
        update (see :mod:`unitrain.backends.tensorflow.distributed`)."""
        self.mirrored = strategy
        self.traces.clear()  # traced without the replicas

    def forward(self, x: Any, y: Any, micro_batch: tf.Tensor) -> tuple[tf.Tensor, list[Any]]:
        """The train-mode loss and the (scaled) gradients, kept as device tensors."""
        function = self.traces.batch_function(
            "forward", self._loss_and_grads, x, y, scalar(tf.int64)
        )
        return function(x, y, micro_batch)

    def accumulate(self, grads: list[tf.Tensor], scale: tf.Tensor) -> None:
        """Add ``scale`` times ``grads`` into the gradient buffers."""
        signature = ([spec(p, full=True) for p in self.params.values()], scalar(self.dtype))
        self.traces.function(("accumulate",), self._accumulate_graph, signature)(grads, scale)

    def step(self, lr: tf.Tensor) -> None:
        """The guarded update from the gradient buffers at ``lr``, then the buffers zeroed."""
        self.traces.function(("step",), self._step_graph, (scalar(self.dtype),))(lr)

    def train_step(self, x: Any, y: Any, micro_batch: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        """Loss, gradients and the guarded update in one function; returns the loss."""
        function = self.traces.batch_function(
            "train_step", self._train_step_graph, x, y, scalar(tf.int64), scalar(self.dtype)
        )
        return function(x, y, micro_batch, lr)

    def train_steps(self, xs: Any, ys: Any, lrs: tf.Tensor) -> tf.Tensor:
        """``len(lrs)`` fused updates over batches stacked on a leading axis; their losses."""
        function = self.traces.batch_function(
            "train_steps", self._train_steps_graph, xs, ys, vector(self.dtype), stacked=True
        )
        return function(xs, ys, lrs)

    def gather_steps(self, x: Any, y: Any, indices: tf.Tensor, lrs: tf.Tensor) -> tf.Tensor:
        """``len(lrs)`` fused updates on the rows ``indices[i]`` of a data set on the device."""
        function = self.traces.rows_function(
            "train_steps_on_device", self._gather_steps_graph, (x, y), indices, vector(self.dtype)
        )
        return function(x, y, indices, lrs)

    def evaluate(self, x: Any, y: Any) -> dict[str, tf.Tensor]:
        """Eval-mode loss (and accuracy for a classification loss) as device scalars."""
        return self.traces.batch_function("evaluate", self._evaluate_graph, x, y)(x, y)

    def outputs(self, x: Any) -> Any:
        """Eval-mode outputs in the parameter dtype (run eagerly)."""
        out = self.module(self._compute_input(x), training=False)
        return out if self.compute_dtype is None else map_leaves(self._in_dtype, out)

    def optimizer_variables(self) -> dict[str, tf.Variable]:
        """Optimizer slots under canonical names (``<param>.<slot>``), param-major order."""
        named: dict[str, tf.Variable] = {}
        for index, name in enumerate(self.params):
            for slot, variables in self.slots.items():
                named[f"{name}.{slot}"] = variables[index]
        return named

    # -- the bodies (run only while tracing) -------------------------------------------------

    def _in_dtype(self, out: tf.Tensor) -> tf.Tensor:
        return tf.cast(out, self.dtype)

    def _compute_input(self, x: Any) -> Any:
        """``x`` in the compute dtype under mixed precision; token ids stay integers."""
        if self.compute_dtype is None:
            return x
        low = self.compute_dtype
        return map_leaves(lambda leaf: tf.cast(leaf, low) if leaf.dtype.is_floating else leaf, x)

    def _model_loss(
        self, x: tf.Tensor, y: tf.Tensor, training: bool, key: Any, global_size: Any = None
    ) -> Any:
        """Outputs and loss: the batch's loss, or with ``global_size`` (a replica of a
        MirroredStrategy) this slice's loss weighted by its share of the global batch."""
        x = self._compute_input(x)
        terms = None
        if isinstance(self.module, PortableModule):
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
        if self.mirrored is not None:
            return mirrored_loss_and_grads(
                self.mirrored, self.slice_loss_and_grads, x, y, micro_batch
            )
        return self.slice_loss_and_grads(x, y, micro_batch)

    def slice_loss_and_grads(
        self, x: tf.Tensor, y: tf.Tensor, micro_batch: tf.Tensor, global_size: Any = None
    ) -> Any:
        """The loss of ``(x, y)`` and its scaled gradients (traced); with ``global_size``, a
        replica's slice weighted by its share of the global batch (see :meth:`_model_loss`)."""
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
