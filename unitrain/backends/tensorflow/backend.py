"""The TensorFlow backend: a portable model (:mod:`unitrain.models`), Keras or a ``tf.Module``.

Every hot-path computation is a ``tf.function`` with autograph off, traced once per input signature:
the batch axis is left unknown (``None``), so the smaller last batch of an epoch does not retrace
(unless the model reads the batch size as a number: see
:meth:`~.tracing.TraceCache.traced_or_sized`), and the learning rate, the loss scale and the
micro-batch index are tensor arguments, so changing them every step does not retrace either
(``trace_counts`` counts the traces). The functions and the variables they update are a part
the backend holds, :class:`~.compiled.CompiledSteps`; the backend converts batches, keeps the
dropout key's numbers and the order of the protocol's calls. The optimizer updates are the rules of
:mod:`unitrain.optim`, written once in ops and run by
:mod:`unitrain.backends.tensorflow.optimizers`, because Keras' optimizers differ from them.

Three calls, three functions: ``forward`` runs the model under a ``tf.GradientTape`` and
returns the loss while keeping the gradients as device tensors; ``backward(scale)`` adds
``scale`` times them into gradient-buffer variables; ``step(lr)`` clips, checks the gradients
for NaN/inf in-graph (the global norm when clipping, else one sum per tensor; a non-finite
value leaves parameters and optimizer state untouched and adds one to a device-side skip
counter), updates, and zeros the buffers. ``train_step`` fuses the three into one function
without the buffers.

Several updates per call (``TrainerConfig.steps_per_call``; the ``MultiStep`` and
``DeviceData`` protocols): :meth:`TensorFlowBackend.train_steps` runs k updates in one call
over batches stacked on a new leading axis; with ``data_on_device``, ``set_device_data`` and
``train_steps_on_device`` keep the whole training set on the device and gather each batch by
index inside the call. Both equal k single ``train_step`` calls.

Native models are called as ``model(x, training=...)``, their state-dict names are the
variables' paths (:func:`.model.named_variables`), and their dropout uses their own random
state (a Keras seed generator is a model variable, saved and restored with the model).
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # must precede the first TF import

import numpy as np
import tensorflow as tf  # absolute: the framework, not this module
import tensorflow.experimental.numpy as tnp

from unitrain import ConfigError
from unitrain.backends.common import WorkerPart, keep_worker_part
from unitrain.backends.precision import PRECISIONS, require_precision
from unitrain.backends.protocol import (
    BackendOptions,
    Batch,
    Capabilities,
    UpdateNumbers,
    check_state,
    split_state,
)
from unitrain.backends.tensorflow import model as tf_model
from unitrain.backends.tensorflow import ops as tensorflow_ops
from unitrain.backends.tensorflow import optimizers
from unitrain.backends.tensorflow.compiled import CompiledSteps
from unitrain.backends.tensorflow.core import (
    make_deterministic,
    resolve_device,
    seed_global_rngs,
)
from unitrain.backends.tensorflow.distributed import (
    LocalDevices,
    TensorFlowDistributed,
    join_launched_workers,
    launch_command,
    local_devices_environment,
)
from unitrain.backends.tensorflow.layers import PortableModule
from unitrain.backends.tensorflow.precision import COMPUTE_DTYPES, set_matmul_precision
from unitrain.backends.tensorflow.prefetch import prefetch
from unitrain.models import AbstractLayer, InputCheck
from unitrain.structure import is_plain_pair, map_leaves, num_examples

__all__ = ["TensorFlowBackend"]

_DTYPES = {"float32": tf.float32, "float64": tf.float64}


class TensorFlowBackend:
    """TensorFlow implementation of the :class:`unitrain.backends.protocol.Backend` protocol.

    Attributes:
        module: the model (a :class:`~unitrain.backends.tensorflow.layers.PortableModule` for a
            portable model).
        variables: every model variable under its state-dict name.
        params: the trainable subset of ``variables``, in gradient order.
        compiled: the compiled functions of an update and the optimizer's variables
            (:class:`~.compiled.CompiledSteps`).
    """

    name = "tensorflow"
    #: The part that traces and runs the updates; a subclass may name its own.
    compiled_steps: type[CompiledSteps] = CompiledSteps
    #: This backend's module of the unitrain.ops contract (the PortableOps protocol).
    ops = tensorflow_ops
    capabilities = Capabilities(
        devices=("cpu", "gpu"),
        dtypes=tuple(_DTYPES),
        bit_exact_resume=True,
        portable_layers=True,
        data_parallel=True,
        precisions={"cpu": PRECISIONS, "gpu": PRECISIONS},  # every one, on both
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The devices TensorFlow can use on this machine."""
        return ("cpu", "gpu") if tf.config.list_physical_devices("GPU") else ("cpu",)

    def __init__(self, model: Any, options: BackendOptions | None = None) -> None:
        join_launched_workers()  # MultiWorkerMirroredStrategy must come before any tensor
        self.options = options = options or BackendOptions()
        self.device_name = resolve_device(options.device)
        if options.dtype not in _DTYPES:
            raise ConfigError(
                f"the tensorflow backend trains in {tuple(_DTYPES)}, got dtype={options.dtype!r}"
            )
        self.dtype = _DTYPES[options.dtype]
        require_precision(
            self.name, self.capabilities.precisions[self.device], options.precision, self.device
        )
        if options.precision != "32" and not isinstance(model, AbstractLayer):
            raise ConfigError(
                f"precision={options.precision!r} on the tensorflow backend casts portable "
                "models only; give a Keras model its own dtype policy "
                "(keras.mixed_precision.set_dtype_policy('mixed_bfloat16')) and precision='32'"
            )
        self._compute_dtype = COMPUTE_DTYPES.get(options.precision)
        if options.deterministic:
            make_deterministic()
        set_matmul_precision(options.matmul_precision)
        seed_global_rngs(options.seed)
        with tf.device(self.device_name):
            if isinstance(model, AbstractLayer):
                numpy_dtype = self.dtype.as_numpy_dtype
                params, state = model.init_params(options.seed, numpy_dtype), model.init_state()
                self.module: Any = PortableModule(
                    model, params, state, self.dtype, self._compute_dtype, options.random
                )
                self.variables: dict[str, tf.Variable] = (
                    self.module.named_variables() | self.module.named_state()
                )
            else:
                self.module = model
                self.variables = tf_model.named_variables(model)
            self.params = {k: v for k, v in self.variables.items() if v.trainable}
            wrong = {k: v.dtype.name for k, v in self.params.items() if v.dtype != self.dtype}
            if wrong:
                raise ConfigError(
                    f"trainable variables must be {options.dtype} (BackendOptions.dtype), "
                    f"got {wrong}"
                )
            self.options = options = optimizers.bind(options, model, self.params)
            self.compiled = self.compiled_steps(
                self.module, self.params, options, self.dtype, self._compute_dtype, self.device_name
            )
        self.classification = self.compiled.classification
        self._reads_batch = bool(getattr(self.compiled.loss_object, "reads_batch", False))
        self._input_check = InputCheck(model) if isinstance(model, AbstractLayer) else None
        self._tokens = self._input_check is not None and self._input_check.tokens
        self._pending: list[tf.Tensor] | None = None
        self._accumulated = False
        self._numbers = UpdateNumbers()  # the host's copy of the dropout key's numbers
        self._part = WorkerPart()  # one worker until distribute() says otherwise
        self._device_data: tuple[tf.Tensor, tf.Tensor] | None = None

    @property
    def device(self) -> str:
        """``"gpu"`` when running on a GPU, else ``"cpu"``."""
        return "gpu" if "GPU" in self.device_name else "cpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a gradient was not finite (reads a device counter)."""
        return int(self.compiled.skipped_count.numpy())

    @property
    def trace_counts(self) -> collections.Counter[str]:
        """How many times each compiled function was traced, by name."""
        return self.compiled.traces.counts

    @property
    def grad_buffers(self) -> list[tf.Variable]:
        """The gradient buffers ``backward`` adds into (the compiled steps' variables)."""
        return self.compiled.grad_buffers

    def spread_over(self, strategy: Any) -> None:
        """Compute every gradient under ``strategy``, a ``tf.distribute.MirroredStrategy``
        over local devices (see :meth:`.compiled.CompiledSteps.spread_over`)."""
        self.compiled.spread_over(strategy)

    def prefetch(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        """On a GPU, each batch copied while the previous one trains (see
        :mod:`.prefetch`); on the CPU, ``batches`` unchanged."""
        inputs = tf.int64 if self._tokens else self.dtype  # token ids stay ids
        return prefetch(batches, self.device_name, inputs, self.classification)

    def _tensors(self, batch: Batch) -> tuple[Any, Any]:
        """``(x, y)`` as tensors; a structured batch (or any under an objective) as ``(x,
        whole batch)`` (see :func:`.model.structured_tensors`)."""
        if self._reads_batch or not is_plain_pair(batch):
            if self._input_check is not None:
                self._input_check(batch[0])
            return tf_model.structured_tensors(batch, self.dtype)
        x, y = batch
        if self._input_check is not None:
            self._input_check(x)
        x = tf.convert_to_tensor(x)
        if x.dtype != self.dtype and not self._tokens:
            x = tf.cast(x, self.dtype)
        y = tf.convert_to_tensor(y)
        if self.classification and y.dtype != tf.int64:
            y = tf.cast(y, tf.int64)
        elif not self.classification and y.dtype.is_floating and y.dtype != self.dtype:
            y = tf.cast(y, self.dtype)
        return x, y

    def _follow(self, step: int | None) -> None:
        """Set the dropout key's step variable to the caller's ``step`` where it differs from
        the count both keep (after a resume, or a direct caller's jump): one write, rare."""
        if self._numbers.jumped(step):
            self.compiled.key_step.assign(step)

    def forward(
        self, batch: Batch, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        """Train-mode forward under a gradient tape; returns the loss (a device scalar).

        The gradients are computed in the same compiled call and kept, as device tensors,
        for :meth:`backward`: the protocol always follows a forward with a backward, and one
        traced function is faster than replaying the tape eagerly. The dropout key's step is
        the ``key_step`` variable, its micro-batch a host number passed in.
        """
        x, y = self._tensors(batch)
        self._follow(step)
        _, micro_batch = self._numbers.forward(step, micro_batch)
        micro = self._part.dropout_index(micro_batch)
        loss, self._pending = self.compiled.forward(x, y, tf.constant(micro, tf.int64))
        return loss

    def backward(self, scale: float = 1.0) -> None:
        """Add ``scale`` times the gradients of the last forward to the gradient buffers."""
        if self._pending is None:
            raise ConfigError("backward() needs a forward() first (once per forward)")
        self.compiled.accumulate(self._pending, tf.constant(scale, self.dtype))
        self._pending, self._accumulated = None, True

    def step(self, lr: float) -> None:
        """Clip, skip on a non-finite norm, update at ``lr``, zero the buffers (one call)."""
        if self._part.reduce_gradients is not None:
            summed = self._part.summed([b.read_value() for b in self.grad_buffers])
            for buffer, value in zip(self.grad_buffers, summed, strict=True):
                buffer.assign(value)
        self.compiled.step(tf.constant(lr, self.dtype))
        self._pending, self._accumulated = None, False
        self._numbers.updated()

    #: Sum the gradients over the workers before a step; key dropout as this worker.
    distribute = keep_worker_part
    #: MultiWorkerMirroredStrategy over the workers TF_CONFIG names, or None.
    launched_strategy = staticmethod(TensorFlowDistributed.from_environment)

    #: The launcher that starts N local workers (TF_CONFIG on local ports).
    launch_command = staticmethod(launch_command)

    @staticmethod
    def sharded_strategy(workers: int | None) -> Any:
        """Refused: TensorFlow has no engine that shards a model over its workers."""
        from unitrain.backends.sharded import ShardingUnsupported

        raise ShardingUnsupported(
            "the tensorflow backend cannot shard parameters, gradients and optimizer state "
            "over workers: tf.distribute's Mirrored and MultiWorkerMirrored strategies keep a "
            "whole copy of every variable on each worker, and tf.experimental.dtensor is still "
            "experimental; train data-parallel (strategy=None under `unitrain train --workers "
            "N`), or shard on the torch or jax backend"
        )

    # One process over several local devices (unitrain.backends.strategy.LocalDeviceParallel).
    local_devices_environment = staticmethod(local_devices_environment)
    local_devices_strategy = staticmethod(LocalDevices)

    def train_step(self, batch: Batch, lr: float, *, step: int | None = None) -> Any:
        """``forward(batch, step=step, micro_batch=0); backward(); step(lr)`` in one compiled
        call; returns the loss."""
        if self._accumulated:
            raise ConfigError("train_step() with gradients pending from backward(); call step()")
        x, y = self._tensors(batch)
        self._follow(step)
        micro = self._part.dropout_index(self._numbers.micro_batch)
        loss = self.compiled.train_step(
            x, y, tf.constant(micro, tf.int64), tf.constant(lr, self.dtype)
        )
        self._numbers.fused(step)
        self._pending = None
        return loss

    def train_steps(self, batches: Batch, lrs: Any, *, step: int | None = None) -> Any:
        """Run ``k`` updates in one compiled call; equal to ``k`` calls of :meth:`train_step`.

        Args:
            batches: ``(inputs, targets)`` stacked along a new leading axis of length ``k``
                (all ``k`` batches the same size).
            lrs: the ``k`` learning rates, one per update.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` losses as one device tensor.
        """
        xs, ys = self._tensors(batches)
        lrs = tf.convert_to_tensor(np.asarray(lrs), self.dtype)
        self._follow(step)
        losses = self.compiled.train_steps(xs, ys, lrs)
        self._numbers.fused(step, len(lrs))
        self._pending = None
        return losses

    def set_device_data(self, inputs: Any, targets: Any) -> None:
        """Copy a whole training set to the device for :meth:`train_steps_on_device`."""
        with tf.device(self.device_name):
            x, y = self._tensors((inputs, targets))
            self._device_data = (tf.identity(x), tf.identity(y))

    def train_steps_on_device(self, indices: Any, lrs: Any, *, step: int | None = None) -> Any:
        """Run ``k`` updates on batches gathered by index from :meth:`set_device_data`'s set.

        Args:
            indices: int array ``(k, batch_size)``; row ``i`` holds the examples of update ``i``
                (a smaller last batch of an epoch goes in a call of its own).
            lrs: the ``k`` learning rates.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` losses as one device tensor; equal to ``train_step`` on the same batches.
        """
        if self._device_data is None:
            raise ConfigError("train_steps_on_device() needs set_device_data() first")
        x, y = self._device_data
        indices = tf.convert_to_tensor(np.asarray(indices, np.int64))
        lrs = tf.convert_to_tensor(np.asarray(lrs), self.dtype)
        self._follow(step)
        losses = self.compiled.gather_steps(x, y, indices, lrs)
        self._numbers.fused(step, len(lrs))
        self._pending = None
        return losses

    def to_host(self, values: list[Any]) -> list[np.ndarray]:
        """Many device values (losses) read back to the host in one transfer."""
        if all(v.shape == values[0].shape for v in values):
            return list(tf.stack(values).numpy())
        return [v.numpy() for v in values]

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Eval-mode metrics (no dropout, no gradients, no state change) as device scalars."""
        x, y = self._tensors(batch)
        return self.compiled.evaluate(x, y)

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode (run eagerly), on the host."""
        x, _ = self._tensors((inputs, np.zeros(num_examples((inputs,)), np.int64)))
        return map_leaves(np.asarray, self.compiled.outputs(x))

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = tnp

    def outputs(self, batch: Batch) -> tuple[tf.Tensor, tf.Tensor]:
        """Eval-mode outputs and the targets as device tensors (run eagerly), for metrics."""
        x, y = self._tensors(batch)
        return self.compiled.outputs(x), y[1] if isinstance(y, tuple) else y

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and optimizer state as host numpy copies, canonical names."""
        state = {f"model.{k}": np.array(v.numpy()) for k, v in self.variables.items()}
        for key, variable in self.compiled.optimizer_variables().items():
            state[f"optimizer.{key}"] = np.array(variable.numpy())
        state["optimizer.step"] = np.asarray(self.compiled.step_count.numpy(), np.int64)
        state.update({f"optimizer.{k}": v for k, v in self.compiled.loss_scale.state().items()})
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Assign parameters and optimizer state; names and shapes must match exactly."""
        check_state(self.state_dict(), state)
        model, opt = split_state(state)
        with tf.device(self.device_name):
            for name, variable in self.variables.items():
                variable.assign(np.asarray(model[name], variable.dtype.as_numpy_dtype))
            for name, variable in self.compiled.optimizer_variables().items():
                variable.assign(np.asarray(opt[name], variable.dtype.as_numpy_dtype))
            self.compiled.step_count.assign(int(opt["step"]))
            self.compiled.key_step.assign(int(opt["step"]))
            self.compiled.loss_scale.load(opt)
        self._numbers.loaded(int(opt["step"]))
        self._pending, self._accumulated = None, False

    def rng_state(self) -> dict[str, Any]:
        """TensorFlow's global ``tf.random.Generator`` state (unitrain draws nothing from it)."""
        generator = tf.random.get_global_generator()
        return {"global_generator": generator.state.numpy().tolist()}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""
        if "global_generator" in state:
            generator = tf.random.get_global_generator()
            generator.reset(tf.constant(state["global_generator"], tf.int64))

    def versions(self) -> dict[str, str]:
        """TensorFlow's version (and Keras' for a Keras model, CUDA's on a GPU)."""
        versions = {"tensorflow": tf.__version__}
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(self.module, keras.layers.Layer):
            versions["keras"] = keras.__version__
        if self.device == "gpu":
            cuda = tf.sysconfig.get_build_info().get("cuda_version")
            if cuda:
                versions["cuda"] = str(cuda)
        return versions
