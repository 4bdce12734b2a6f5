"""The JAX backend: jitted pure functions over a params pytree, optax optimizers.

Models are portable :mod:`unitrain.models` layers, built-in or a user's own (canonical names,
portable checkpoints; run by :class:`.layers.PortableModule`), or a native :class:`JaxModel`
(with or without model state) / ``(apply, params)`` pair. Everything the
training loop changes — params, model state (BatchNorm statistics, ...), optimizer state, the
update counter and the skipped-update counter — lives on the device in one pytree that every
jitted update donates and returns, so no step copies the weights or waits for the host; the
skipped counter is read only when :attr:`JaxBackend.skipped_steps` is (at logging points).

- ``forward`` runs ``jax.vjp`` under jit and keeps the VJP (the residuals, not a recompute);
  ``backward(scale)`` pulls ``scale`` back through it, which is ``scale`` times the gradients,
  and adds them to the buffers; ``step(lr)`` is one jitted clip + update + non-finite guard.
- ``train_step(batch, lr)`` fuses the three into one jitted call (the Trainer's fast path).
- The learning rate, the dropout key's ``(seed, step, micro_batch)`` and the clip norm are
  traced arguments, so changing them never recompiles (see :attr:`JaxBackend.trace_counts`),
  and backends that share model, loss and optimizer share compiled code (:mod:`.compiled`).

Several updates per call (``TrainerConfig.steps_per_call``; the ``MultiStep`` and
``DeviceData`` protocols): :meth:`JaxBackend.train_steps` runs k updates in one ``lax.scan``;
with ``data_on_device``, :meth:`JaxBackend.set_device_data` and ``train_steps_on_device``
keep the training set on the device and gather each batch by index inside the compiled loop.
Both equal k :meth:`JaxBackend.train_step` calls bit for bit on CPU (tested).

JAX runs in float32 here: this module never enables x64, which is process-wide and would
change other code's arrays. Every jitted function is traced under the ``matmul_precision``
asked for (``"highest"``, no TF32 on GPU, by default; baked into the compiled code, not a
global switch; see :mod:`.precision`, which also holds mixed precision). Deterministic
mode, if JAX has not started its backends yet, adds ``--xla_gpu_deterministic_ops=true`` to
``XLA_FLAGS``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from unitrain import ConfigError, losses, optim
from unitrain.backends.common import WorkerPart, keep_worker_part
from unitrain.backends.jax import losslog
from unitrain.backends.jax import ops as jax_ops
from unitrain.backends.jax.compiled import (
    KEY_STEP,
    SKIPPED,
    DeviceState,
    functions,
    initial_counters,
    settings,
)
from unitrain.backends.jax.core import (
    ResidentScalar,
    host_batch,
    host_lrs,
    request_deterministic_gpu_ops,
    resolve_device,
    state_array,
    structured_batch,
)
from unitrain.backends.jax.distributed import (
    JaxDistributed,
    LocalDevices,
    join_launched_workers,
    launch_command,
    local_devices_environment,
)
from unitrain.backends.jax.model import (
    JaxModel,
    as_native_model,
    is_portable,
    loss_function,
    state_names,
)
from unitrain.backends.jax.prefetch import prefetch
from unitrain.backends.jax.sharding import host_state, local_rows
from unitrain.backends.jax.state import StateLayout
from unitrain.backends.precision import (
    PRECISIONS,
    compute_dtype,
    require_precision,
)
from unitrain.backends.protocol import (
    BackendOptions,
    Batch,
    Capabilities,
    UpdateNumbers,
    check_state,
)
from unitrain.losses import resolve_loss
from unitrain.models import AbstractLayer, InputCheck
from unitrain.structure import is_plain_pair, map_leaves, num_examples

__all__ = ["JaxBackend", "JaxModel", "LocalDevices"]


class JaxBackend:
    """The :class:`~unitrain.backends.protocol.Backend` protocol on JAX, with a fused step.

    Attributes:
        trace_counts: how many times each jitted function was traced (one per new input
            shape or structure); a diagnostic that shows a changing LR never retraces. It is
            shared with every backend of the same configuration, which shares the compiled
            functions too.
    """

    name = "jax"
    #: This backend's module of the unitrain.ops contract (the PortableOps protocol).
    ops = jax_ops
    capabilities = Capabilities(
        devices=("cpu", "gpu"),
        dtypes=("float32",),
        portable_layers=True,
        data_parallel=True,
        precisions={"cpu": PRECISIONS, "gpu": PRECISIONS},  # every one, on both
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The devices JAX can use on this machine."""
        kinds = {"gpu" if d.platform in ("gpu", "cuda", "rocm") else "cpu" for d in jax.devices()}
        return tuple(sorted(kinds | {"cpu"}))

    def __init__(self, model: Any, options: BackendOptions | None = None) -> None:
        join_launched_workers()  # before JAX computes anything, or it cannot join
        self.options = options = optim.bind_options(options or BackendOptions(), model)
        if options.dtype != "float32":
            raise ConfigError(
                f"the jax backend trains in float32 only (x64 stays off), got {options.dtype!r}"
            )
        if options.deterministic and options.device != "cpu":
            request_deterministic_gpu_ops()
        self.jax_device = resolve_device(options.device)
        require_precision(
            self.name, self.capabilities.precisions[self.device], options.precision, self.device
        )
        self._scaled = options.precision == "16-mixed"
        self._placement: Any = self.jax_device  # a replicated sharding over LocalDevices
        self._state_placement: Any = None  # LocalSharded's, in shard_state
        self._batch_sharding: Any = None
        self.portable = is_portable(model)
        self._input_check = InputCheck(model) if isinstance(model, AbstractLayer) else None
        self._tokens = self._input_check is not None and self._input_check.tokens
        if self.portable:
            program, params, model_state = (
                model,
                model.init_params(options.seed, np.float32),
                model.init_state(np.float32),
            )
        else:
            program, params, model_state = as_native_model(model)
        loss = resolve_loss(options.loss)  # "mse" and MSE() share their compiled code
        _, self.classification = loss_function(loss)
        #: Whether the loss reads the whole batch (an objective): every batch is then a
        #: structured one (see :func:`.core.structured_batch`).
        self._reads_batch = bool(getattr(loss, "reads_batch", False))
        self._fn = functions(
            program,
            loss,
            options.optimizer,
            precision=options.matmul_precision,
            clipping=options.grad_clip_norm is not None,
            branch=self.jax_device.platform == "cpu",
            compute_dtype=None if options.precision == "32" else compute_dtype(options.precision),
            scaler=options.loss_scaler if self._scaled else None,
            random=options.random,
        )
        self._settings = self._put(settings(options.seed, options.grad_clip_norm))
        self.trace_counts = self._fn.trace_counts
        names = state_names(params), state_names(model_state)  # before tree.map sorts dicts
        params = jax.tree.map(lambda a: self._put(np.asarray(a, np.float32)), params)
        model_state = jax.tree.map(lambda a: self._put(state_array(a)), model_state)
        self._layout = StateLayout(*names, params, model_state, scaled=self._scaled)
        self._state = DeviceState(
            params,
            model_state,
            self._put(self._fn.init_opt_state(params)),
            self._put(initial_counters(options.loss_scaler if self._scaled else None)),
            self._fresh_losses(),
        )
        self._losses = losslog.LossLog(lambda: self._state.losses, self._fresh_losses)
        self._grads: Any = None  # None means zero: the fused path never allocates buffers
        self._vjp: Any = None
        self._loss: Any = None  # the last forward's loss: backward makes NaN gradients of NaN
        self._numbers = UpdateNumbers()  # the host's copy of the dropout key's numbers
        self._data: tuple[Any, Any] | None = None
        self._lr = ResidentScalar(self._put)
        self._part = WorkerPart()  # one worker until distribute() says otherwise

    @property
    def device(self) -> str:
        """``"gpu"`` on a CUDA/ROCm device, else ``"cpu"``."""
        return "cpu" if self.jax_device.platform == "cpu" else "gpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a loss or gradient was not finite (reads a device counter)."""
        return int(np.asarray(self._state.counters)[SKIPPED])

    def _put(self, value: Any) -> Any:
        return jax.device_put(value, self._placement)

    def _fresh_losses(self) -> Any:
        return self._put(np.zeros(losslog.SIZE, np.float32))

    def prefetch(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        """On an accelerator, each batch ``device_put`` while the previous one trains (see
        :mod:`.prefetch`); on the CPU, ``batches`` unchanged."""
        return prefetch(batches, self.jax_device, self._tokens, self.classification)

    def _arrays(self, batch: Batch) -> tuple[Any, Any]:
        """The batch as jit arguments (see :func:`.core.host_batch`), split over the local
        devices when data-parallel."""
        if self._reads_batch or not is_plain_pair(batch):
            if self._input_check is not None:
                self._input_check(batch[0])
            x, y = structured_batch(batch)
        else:
            x, y = batch
            if self._input_check is not None:
                self._input_check(x)
            x, y = host_batch(x, y, self._tokens, self.classification)
        return (x, y) if self._batch_sharding is None else self._shard_batch(x, y)

    def _shard_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        """A batch split over the local devices (replicated when it does not divide evenly)."""
        if len(x) % self._batch_sharding.mesh.size:
            return self._put(x), self._put(y)
        return jax.device_put(x, self._batch_sharding), jax.device_put(y, self._batch_sharding)

    def spread_over(self, devices: Any) -> None:
        """Keep the state replicated on ``devices`` and split every batch over them (jit then
        sums each device's share of the gradients)."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(devices), ("batch",))
        self._placement = NamedSharding(mesh, PartitionSpec())
        self._batch_sharding = NamedSharding(mesh, PartitionSpec("batch"))
        moving = (self._state, self._settings)
        if not self._placement.is_fully_addressable:  # over processes: from the host copy
            moving = jax.device_get(moving)
        self._state, self._settings = self._put(moving)
        self._lr = ResidentScalar(self._put)

    def shard_state(self, placement: Any) -> None:
        """Place every array of the parameters, model state and optimizer state as
        ``placement(leaf, mesh)`` says over the mesh of :meth:`spread_over` (see
        :mod:`.sharding`); kept after a load too."""
        mesh = self._placement.mesh

        def place(state: DeviceState) -> DeviceState:  # the counters and loss log stay whole
            parts = state.params, state.model_state, state.opt_state
            parts = jax.device_put(parts, jax.tree.map(lambda a: placement(a, mesh), parts))
            return state._replace(params=parts[0], model_state=parts[1], opt_state=parts[2])

        self._state_placement = place
        self._state = place(self._state)

    @staticmethod
    def sharded_strategy(workers: int | None) -> Any:
        """The state sharded over the launched processes, or this process's local devices
        (see :mod:`.sharding`)."""
        from unitrain.backends.jax.sharding import sharded_strategy

        return sharded_strategy(workers)

    # -- the protocol -------------------------------------------------------------------------

    def _follow(self, step: int | None) -> None:
        """Set the device's dropout key step to the caller's ``step`` where it differs from
        the count both keep (after a resume, or a direct caller's jump): one write, rare."""
        if self._numbers.jumped(step):
            counters = self._state.counters.at[KEY_STEP].set(np.int32(self._numbers.step))
            self._state = self._state._replace(counters=counters)

    def forward(
        self, batch: Batch, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        """Train-mode forward; keeps the VJP for backward and returns the loss (no host sync).

        The dropout key's step is the device counter ``[KEY_STEP]`` (see :meth:`_follow`),
        the micro-batch a host number passed in."""
        x, y = self._arrays(batch)
        self._follow(step)
        _, micro_batch = self._numbers.forward(step, micro_batch)
        micro = np.int32(self._part.dropout_index(micro_batch))
        state = self._state
        loss, self._vjp, model_state = self._fn.forward(
            state.params, state.model_state, x, y, self._settings, state.counters, micro
        )
        self._state = state._replace(model_state=model_state)
        self._loss = loss
        return loss

    def backward(self, scale: float = 1.0) -> None:
        """Add ``scale`` times the gradients of the last forward's loss to the buffers."""
        if self._vjp is None:
            raise ConfigError(
                "backward() needs a forward() first (each forward backs one backward)"
            )
        cotangent = np.float32(scale)  # d(scale * loss)/d(loss), pulled back through the VJP
        counters = self._state.counters  # the loss scale, under "16-mixed"
        vjp, loss = self._vjp, self._loss
        if self._grads is None:
            self._grads = self._fn.backward(vjp, loss, cotangent, counters)
        else:
            self._grads = self._fn.accumulate(vjp, loss, self._grads, cotangent, counters)
        self._vjp = self._loss = None

    def step(self, lr: float) -> None:
        """Clip, update at ``lr`` unless a loss or gradient is not finite, zero the buffers."""
        grads = self._grads
        if grads is None:
            grads = jax.tree.map(jnp.zeros_like, self._state.params)
        self._grads = self._vjp = None
        grads = self._part.summed(grads)
        self._state = self._fn.step(self._state, grads, self._lr(lr), self._settings)
        self._numbers.updated()

    #: Sum the gradients over the workers before a step; key dropout as this worker.
    distribute = keep_worker_part
    #: jax.distributed over the launched workers, or None when not launched.
    launched_strategy = staticmethod(JaxDistributed.from_environment)

    #: The launcher that starts N local workers (coordinator on 127.0.0.1).
    launch_command = staticmethod(launch_command)

    # One process over several local devices (unitrain.backends.strategy.LocalDeviceParallel).
    local_devices_environment = staticmethod(local_devices_environment)
    local_devices_strategy = staticmethod(LocalDevices)

    def train_step(self, batch: Batch, lr: float, *, step: int | None = None) -> Any:
        """Equal to ``forward(batch, step=step, micro_batch=0); backward(); step(lr)`` in one
        jitted, donated call.

        Returns:
            The loss as a :class:`~.losslog.LossRef` (the update wrote it into a device
            buffer; ``float()`` or ``numpy.asarray()`` reads it, :meth:`to_host` reads many).
        """
        if self._grads is not None or self._vjp is not None:
            # Gradients are pending: keep the three-call semantics.
            loss = self.forward(batch, step=step, micro_batch=self._numbers.micro_batch)
            self.backward()
            self.step(lr)
            return loss
        x, y = self._arrays(batch)
        self._follow(step)
        self._numbers.fused(step)
        log = self._losses
        if log.cursor == losslog.SIZE:
            self._state = self._state._replace(losses=log.turn_page())
        self._state = self._fn.train_step(self._state, x, y, self._lr(lr), self._settings)
        return log.next_ref()

    def to_host(self, values: list[Any]) -> list[np.ndarray]:
        """Many losses (those of the updates since the last read) on the host, in order.

        Losses of :meth:`train_step` come from its device log, one transfer per page; other
        device values convert one by one on the CPU (~0.5 µs each, where
        ``jax.device_get``'s batched path costs ~4 µs), and with one batched ``device_get``
        on an accelerator.
        """
        return self._losses.read_values(values, on_cpu=self.jax_device.platform == "cpu")

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Eval-mode batch means (``loss``, ``accuracy`` for classification): no dropout, the
        model state read and left unchanged."""
        x, y = self._arrays(batch)
        return self._fn.evaluate(self._state.params, self._state.model_state, x, y)

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode, on the host."""
        x, _ = self._arrays((inputs, np.zeros(num_examples((inputs,)), np.int32)))
        outputs = self._fn.predict(self._state.params, self._state.model_state, x)
        return map_leaves(np.asarray, host_state(outputs))  # gathered when over processes

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = jnp

    def outputs(self, batch: Batch) -> tuple[jax.Array, jax.Array]:
        """Eval-mode outputs and the targets as device arrays, for metrics."""
        x, y = self._arrays(batch)
        targets = y.targets if type(y) is losses.BatchView else y
        return self._fn.predict(self._state.params, self._state.model_state, x), self._put(targets)

    # -- fast paths beyond the protocol -------------------------------------------------------

    def train_steps(self, batches: Batch, lrs: Any, *, step: int | None = None) -> jax.Array:
        """Run ``k`` updates in one compiled ``lax.scan``; equal to ``k`` :meth:`train_step` calls.

        Args:
            batches: ``(xs, ys)`` stacked along a new leading axis of length ``k``.
            lrs: the ``k`` learning rates, one per update.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` training losses (a device array).
        """
        self._check_no_pending("train_steps")
        xs, ys = self._arrays(batches)
        self._follow(step)
        self._numbers.fused(step, len(lrs))
        self._state, losses = self._fn.train_steps(
            self._state, xs, ys, host_lrs(lrs), self._settings
        )
        return losses

    def set_device_data(self, x: Any, y: Any) -> None:
        """Copy a whole training set to the device once, for :meth:`train_steps_on_device`."""
        self._data = self._put(self._arrays((x, y)))

    def train_steps_on_device(
        self, indices: Any, lrs: Any, *, step: int | None = None
    ) -> jax.Array:
        """``k`` updates on batches gathered on the device from the :meth:`set_device_data` arrays.

        Args:
            indices: integer array ``(k, batch_size)``: row ``i`` lists update ``i``'s examples.
            lrs: the ``k`` learning rates.
            step: the first update's number (dropout keys); None counts on from the last.

        Returns:
            The ``k`` training losses (a device array).
        """
        if self._data is None:
            raise ConfigError("train_steps_on_device() needs set_device_data(x, y) first")
        self._check_no_pending("train_steps_on_device")
        indices = np.asarray(indices, np.int32)
        self._follow(step)
        self._numbers.fused(step, len(indices))
        self._state, losses = self._fn.train_steps_on_device(
            self._state, self._data, indices, host_lrs(lrs), self._settings
        )
        return losses

    def _check_no_pending(self, what: str) -> None:
        if self._grads is not None or self._vjp is not None:
            raise ConfigError(f"{what}() runs whole updates; call step() for the pending gradients")

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, model state and optimizer state as host numpy copies, canonical names."""
        return self._layout.state_dict(host_state(self._state), self.options.optimizer)

    def local_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` with each array split over processes as this process's rows of
        it (a :class:`~unitrain.checkpoint.RowShard`), read without gathering."""
        return self._layout.state_dict(self._state, self.options.optimizer, read=local_rows)

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters and optimizer state; names and shapes must match exactly."""
        check_state(self.state_dict(), state)
        self._state = self._layout.device_state(
            state, self._state, self.options.optimizer, self._fn.init_opt_state, self._put
        )
        if self._state_placement is not None:  # sharded again, as before the load
            self._state = self._state_placement(self._state)
        self._numbers.loaded(int(state["optimizer.step"]))

    def rng_state(self) -> dict[str, Any]:
        """Nothing: JAX has no global generator and dropout keys come from the numbers."""
        return {}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""

    def versions(self) -> dict[str, str]:
        """Versions of jax, jaxlib and optax."""
        return {
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "optax": optax.__version__,
        }
