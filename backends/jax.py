"""The JAX backend: jitted pure functions over a params pytree, optax optimizers.

Models are :class:`unitrain.models.MLP` (canonical names, portable checkpoints) or a native
:class:`JaxModel` (with or without model state) / ``(apply, params)`` pair. Everything the
training loop changes — params, model state (BatchNorm statistics, ...), optimizer state, the
update counter and the skipped-update counter — lives on the device in
one pytree that every jitted update donates and returns, so no step copies the weights or
waits for the host; the skipped counter is read only when :attr:`JaxBackend.skipped_steps`
is (the Trainer's logging points).

- ``forward`` runs ``jax.vjp`` under jit and keeps the VJP (the residuals, not a recompute);
  ``backward(scale)`` pulls ``scale`` back through it, which is ``scale`` times the gradients,
  and adds them to the buffers; ``step(lr)`` is one jitted clip + update + non-finite guard.
- ``train_step(batch, lr)`` fuses the three into one jitted call (the Trainer's fast path).
- The learning rate, the dropout key's ``(seed, step, micro_batch)`` and the clip norm are
  traced arguments, so changing them never recompiles (see :attr:`JaxBackend.trace_counts`),
  and backends that share model, loss and optimizer share compiled code
  (:mod:`._jax_compiled`).

Backend-specific fast paths, not used by the Trainer: :meth:`JaxBackend.train_steps` runs k
updates in one ``lax.scan``, and :meth:`JaxBackend.set_device_data` +
:meth:`JaxBackend.train_steps_on_device` keep the training set on the device and gather each
batch by index inside the compiled loop. Both equal k :meth:`JaxBackend.train_step` calls
bit for bit on CPU (tested).

JAX runs in float32 here: this module never enables x64, which is process-wide and would
change other code's arrays. Every jitted function is traced under the ``matmul_precision``
asked for (``"highest"``, no TF32 on GPU, by default; baked into the compiled code, not a
global switch; see :mod:`._jax_precision`, which also holds mixed precision). Deterministic
mode, if JAX has not started its backends yet, adds ``--xla_gpu_deterministic_ops=true`` to
``XLA_FLAGS``.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from unitrain._errors import ConfigError
from unitrain.backend import BackendOptions, Batch, Capabilities
from unitrain.backends import _jax_losslog as losslog
from unitrain.backends._jax_compiled import (
    APPLIED,
    GOOD_STEPS,
    SCALE_EXPONENT,
    SKIPPED,
    DeviceState,
    functions,
    initial_counters,
    settings,
)
from unitrain.backends._jax_distributed import (
    JaxDistributed,
    LocalDevices,
    join_launched_workers,
    launch_command,
)
from unitrain.backends._jax_model import (
    JaxModel,
    as_native_model,
    flatten_params,
    loss_function,
    unflatten_params,
)
from unitrain.backends._jax_optim import export_slots, import_slots
from unitrain.backends._jax_prefetch import prefetch
from unitrain.models import AbstractLayer, InputCheck
from unitrain.precision import (
    GOOD_STEPS_KEY,
    SCALE_KEY,
    compute_dtype,
    require_precision,
    take_scaler_state,
)
from unitrain.state import check_state, split_state

__all__ = ["JaxBackend", "JaxModel", "LocalDevices"]

_FLOAT32 = np.dtype(np.float32)


class JaxBackend:
    """JAX implementation of the :class:`unitrain.backend.Backend` protocol, with a fused step.

    Attributes:
        trace_counts: how many times each jitted function was traced (one per new input
            shape or structure); a diagnostic that shows a changing LR never retraces. It is
            shared with every backend of the same configuration, which shares the compiled
            functions too.
    """

    name = "jax"
    capabilities = Capabilities(
        devices=("cpu", "gpu"),
        dtypes=("float32",),
        fused_step=True,
        portable_layers=True,
        data_parallel=True,
        precisions={
            "cpu": ("32", "bf16-mixed", "16-mixed"),
            "gpu": ("32", "bf16-mixed", "16-mixed"),
        },
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The devices JAX can use on this machine."""
        kinds = {"gpu" if d.platform in ("gpu", "cuda", "rocm") else "cpu" for d in jax.devices()}
        return tuple(sorted(kinds | {"cpu"}))

    def __init__(self, model: Any, options: BackendOptions | None = None) -> None:
        join_launched_workers()  # before JAX computes anything, or it cannot join
        self.options = options = options or BackendOptions()
        if options.dtype != "float32":
            raise ConfigError(
                f"the jax backend trains in float32 only (x64 stays off), got {options.dtype!r}"
            )
        if options.deterministic and options.device != "cpu":
            _request_deterministic_gpu_ops()
        self.jax_device = _resolve_device(options.device)
        require_precision(
            self.name, self.capabilities.precisions[self.device], options.precision, self.device
        )
        self._scaled = options.precision == "16-mixed"
        self._placement: Any = self.jax_device  # a replicated sharding over LocalDevices
        self._batch_sharding: Any = None
        self.portable = _is_portable(model)
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
        _, self.classification = loss_function(options.loss)
        self._fn = functions(
            program,
            options.loss,
            options.optimizer,
            precision=options.matmul_precision,
            clipping=options.grad_clip_norm is not None,
            branch=self.jax_device.platform == "cpu",
            compute_dtype=None if options.precision == "32" else compute_dtype(options.precision),
            scaler=options.loss_scaler if self._scaled else None,
        )
        self._settings = self._put(settings(options.seed, options.grad_clip_norm))
        self.trace_counts = self._fn.trace_counts
        self._names = _names(params)
        self._state_names = _names(model_state)
        params = jax.tree.map(lambda a: self._put(np.asarray(a, np.float32)), params)
        model_state = jax.tree.map(lambda a: self._put(_state_array(a)), model_state)
        self._template = _template(params)
        self._state_template = _template(model_state)
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
        self._micro_batch = 0
        self._data: tuple[Any, Any] | None = None
        self._lr_previous = self._lr_cached = float("nan")  # see _lr
        self._lr_device: Any = None
        self._reduce_gradients: Any = None  # summed over workers when data-parallel

    @property
    def device(self) -> str:
        """``"gpu"`` on a CUDA/ROCm device, else ``"cpu"``."""
        return "cpu" if self.jax_device.platform == "cpu" else "gpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a gradient was not finite (reads a device counter)."""
        return int(np.asarray(self._state.counters)[SKIPPED])

    def _put(self, value: Any) -> Any:
        return jax.device_put(value, self._placement)

    def _fresh_losses(self) -> Any:
        return self._put(np.zeros(losslog.SIZE, np.float32))

    def prefetch(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        """On an accelerator, each batch ``device_put`` while the previous one trains (see
        :mod:`._jax_prefetch`); on the CPU, ``batches`` unchanged."""
        return prefetch(batches, self.jax_device, self.classification)

    def _arrays(self, batch: Batch) -> tuple[Any, Any]:
        """The batch as float32 inputs and int32 class labels (x64 is off).

        Host arrays go to the jitted functions as they are: jit copies them to the device of
        the (committed) state in its C++ fast path, quicker than a ``device_put`` here, and
        turns int64 labels into int32 there too (x64 is off), cheaper than ``astype``.
        """
        x, y = batch
        if self._input_check is not None:
            self._input_check(x)
        if self._tokens and not isinstance(x, jax.Array):
            x = np.asarray(x, np.int32)  # ids are in range: checked above
        if (
            type(x) is np.ndarray
            and type(y) is np.ndarray
            and (x.dtype is _FLOAT32 or self._tokens)  # dtypes are singletons; == would coerce
            and (y.dtype.kind == "i" if self.classification else y.dtype is _FLOAT32)
        ):
            if self._batch_sharding is not None:
                return self._shard_batch(x, y)
            return x, y
        if not isinstance(x, jax.Array):
            x = np.asarray(x, np.float32)
        if not isinstance(y, jax.Array):
            y = np.asarray(y)
            if self.classification or np.issubdtype(y.dtype, np.integer):
                y = y.astype(np.int32, copy=False)
            elif np.issubdtype(y.dtype, np.floating):
                y = y.astype(np.float32, copy=False)
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
        self._state, self._settings = self._put((self._state, self._settings))
        self._lr_previous = self._lr_cached = float("nan")

    def _lr(self, lr: float) -> Any:
        """``lr`` as a jit argument: a cached device scalar while it stays the same.

        A host scalar costs a transfer in every call (~3 µs on CPU) and ``device_put`` costs
        more (~19 µs), so the device copy is made on the second update in a row at one LR:
        constant and step schedules then pass a resident scalar, and a schedule that changes
        every update pays no more than the plain transfer.
        """
        if lr == self._lr_cached:
            return self._lr_device
        if lr == self._lr_previous:
            self._lr_cached, self._lr_device = lr, self._put(np.float32(lr))
            return self._lr_device
        self._lr_previous = lr
        return np.float32(lr)

    # -- the protocol -------------------------------------------------------------------------

    def forward(self, batch: Batch) -> Any:
        """Train-mode forward; keeps the VJP for backward and returns the loss (no host sync)."""
        x, y = self._arrays(batch)
        micro = np.int32(self._micro_batch)
        state = self._state
        loss, self._vjp, model_state = self._fn.forward(
            state.params, state.model_state, x, y, self._settings, state.counters, micro
        )
        self._state = state._replace(model_state=model_state)
        self._micro_batch += 1
        return loss

    def backward(self, scale: float = 1.0) -> None:
        """Add ``scale`` times the gradients of the last forward's loss to the buffers."""
        if self._vjp is None:
            raise ConfigError(
                "backward() needs a forward() first (each forward backs one backward)"
            )
        cotangent = np.float32(scale)  # d(scale * loss)/d(loss), pulled back through the VJP
        counters = self._state.counters  # the loss scale, under "16-mixed"
        if self._grads is None:
            self._grads = self._fn.backward(self._vjp, cotangent, counters)
        else:
            self._grads = self._fn.accumulate(self._vjp, self._grads, cotangent, counters)
        self._vjp = None

    def step(self, lr: float) -> None:
        """Clip, update at ``lr`` unless a gradient is not finite, zero the buffers."""
        grads = self._grads
        if grads is None:
            grads = jax.tree.map(jnp.zeros_like, self._state.params)
        self._grads = self._vjp = None
        if self._reduce_gradients is not None:
            grads = self._reduce_gradients(grads)
        self._state = self._fn.step(self._state, grads, self._lr(lr), self._settings)
        self._micro_batch = 0

    def distribute(self, reduce_gradients: Any) -> None:
        """Pass the gradients through ``reduce_gradients`` (a sum over workers) before a step."""
        self._reduce_gradients = reduce_gradients

    def launched_strategy(self) -> Any:
        """jax.distributed over the launched workers, or None when not launched."""
        return JaxDistributed.from_environment()

    @staticmethod
    def launch_command(workers: int) -> list[str]:
        """The launcher that starts ``workers`` local workers (coordinator on 127.0.0.1)."""
        return launch_command(workers)

    def train_step(self, batch: Batch, lr: float) -> Any:
        """Equal to ``forward(batch); backward(); step(lr)`` in one jitted, donated call.

        Returns:
            The loss as a :class:`~._jax_losslog.LossRef` (the update wrote it into a device
            buffer; ``float()`` or ``numpy.asarray()`` reads it, :meth:`to_host` reads many).
        """
        if self._grads is not None or self._vjp is not None:
            loss = self.forward(batch)  # gradients are pending: keep the three-call semantics
            self.backward()
            self.step(lr)
            return loss
        x, y = self._arrays(batch)
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
        refs = [v for v in values if type(v) is losslog.LossRef]
        if len(refs) == len(values):
            return self._losses.read(refs)
        read = iter(self._losses.read(refs))
        others = [v for v in values if type(v) is not losslog.LossRef]
        if self.jax_device.platform == "cpu":
            converted = iter([np.asarray(value) for value in others])
        else:
            converted = iter(jax.device_get(others))
        return [next(read if type(v) is losslog.LossRef else converted) for v in values]

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Eval-mode batch means (``loss``, ``accuracy`` for classification): no dropout, the
        model state read and left unchanged."""
        x, y = self._arrays(batch)
        return self._fn.evaluate(self._state.params, self._state.model_state, x, y)

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode, on the host."""
        x, _ = self._arrays((inputs, np.zeros(len(inputs), np.int32)))
        return np.asarray(self._fn.predict(self._state.params, self._state.model_state, x))

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = jnp

    def outputs(self, batch: Batch) -> tuple[jax.Array, jax.Array]:
        """Eval-mode outputs and the targets as device arrays, for metrics."""
        x, y = self._arrays(batch)
        return self._fn.predict(self._state.params, self._state.model_state, x), self._put(y)

    # -- fast paths beyond the protocol -------------------------------------------------------

    def train_steps(self, batches: Batch, lrs: Any) -> jax.Array:
        """Run ``k`` updates in one compiled ``lax.scan``; equal to ``k`` :meth:`train_step` calls.

        Args:
            batches: ``(xs, ys)`` stacked along a new leading axis of length ``k``.
            lrs: the ``k`` learning rates, one per update.

        Returns:
            The ``k`` training losses (a device array).
        """
        self._check_no_pending("train_steps")
        xs, ys = self._arrays(batches)
        self._state, losses = self._fn.train_steps(self._state, xs, ys, _lrs(lrs), self._settings)
        return losses

    def set_device_data(self, x: Any, y: Any) -> None:
        """Copy a whole training set to the device once, for :meth:`train_steps_on_device`."""
        self._data = self._put(self._arrays((x, y)))

    def train_steps_on_device(self, indices: Any, lrs: Any) -> jax.Array:
        """``k`` updates on batches gathered on the device from the :meth:`set_device_data` arrays.

        Args:
            indices: integer array ``(k, batch_size)``: row ``i`` lists update ``i``'s examples.
            lrs: the ``k`` learning rates.

        Returns:
            The ``k`` training losses (a device array).
        """
        if self._data is None:
            raise ConfigError("train_steps_on_device() needs set_device_data(x, y) first")
        self._check_no_pending("train_steps_on_device")
        indices = np.asarray(indices, np.int32)
        self._state, losses = self._fn.train_steps_on_device(
            self._state, self._data, indices, _lrs(lrs), self._settings
        )
        return losses

    def _check_no_pending(self, what: str) -> None:
        if self._grads is not None or self._vjp is not None:
            raise ConfigError(f"{what}() runs whole updates; call step() for the pending gradients")

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, model state and optimizer state as host numpy copies, canonical names."""
        host = jax.device_get(self._state)
        params = flatten_params(host.params)
        model_state = flatten_params(host.model_state)
        slots = {
            k: flatten_params(v)
            for k, v in export_slots(self.options.optimizer, host.opt_state).items()
        }
        state = {f"model.{k}": np.array(params[k], np.float32) for k in self._names}
        state.update({f"model.{k}": np.array(model_state[k]) for k in self._state_names})
        state["optimizer.step"] = np.asarray(int(host.counters[APPLIED]), np.int64)
        if self._scaled:
            state[f"optimizer.{SCALE_KEY}"] = np.ldexp(
                np.float32(1), host.counters[SCALE_EXPONENT]
            ).astype(np.float32)
            state[f"optimizer.{GOOD_STEPS_KEY}"] = np.asarray(host.counters[GOOD_STEPS], np.int64)
        for name in self._names:
            for suffix, values in slots.items():
                state[f"optimizer.{name}.{suffix}"] = np.array(values[name], np.float32)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters and optimizer state; names and shapes must match exactly."""
        check_state(self.state_dict(), state)
        model, opt = split_state(state)
        step = int(opt.pop("step"))
        scaler = take_scaler_state(opt) if self._scaled else None
        if not 0 <= step < 2**31:
            raise ConfigError(f"optimizer.step must be in [0, 2**31) here, got {step}")
        device_array = lambda a: self._put(np.array(a, np.float32))  # noqa: E731
        params = unflatten_params(self._template, {k: device_array(model[k]) for k in self._names})
        dtypes = {k: v.dtype for k, v in flatten_params(self._state_template).items()}
        model_state = unflatten_params(
            self._state_template, {k: self._put(np.array(model[k], dtypes[k])) for k in dtypes}
        )
        slots = {
            suffix: unflatten_params(
                self._template,
                {name: device_array(opt[f"{name}.{suffix}"]) for name in self._names},
            )
            for suffix in self.options.optimizer.state_suffixes
        }
        opt_state = self._put(import_slots(self._fn.init_opt_state(params), slots, step))
        counters = np.asarray(self._state.counters).copy()  # the skips and the log go on
        counters[APPLIED] = step
        if scaler is not None:
            counters[SCALE_EXPONENT] = int(np.frexp(scaler[0])[1]) - 1
            counters[GOOD_STEPS] = int(scaler[1])
        self._state = DeviceState(
            params, model_state, opt_state, self._put(counters), self._state.losses
        )
        self._micro_batch = 0

    def rng_state(self) -> dict[str, Any]:
        """Nothing: JAX has no global generator and dropout keys come from the step."""
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


def _is_flat_dict(params: Any) -> bool:
    return isinstance(params, Mapping) and not any(
        isinstance(v, (Mapping, list, tuple)) for v in params.values()
    )


def _is_portable(model: Any) -> bool:
    """Whether ``model`` is a :mod:`unitrain.models` description (weights drawn in numpy)."""
    return all(callable(getattr(model, name, None)) for name in ("init_params", "init_state"))


def _names(tree: Any) -> list[str]:
    """State-dict names in the model's own order (layer by layer for a portable model), not in
    the sorted order of a JAX dict pytree."""
    return list(tree) if _is_flat_dict(tree) else list(flatten_params(tree))


def _template(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _state_array(value: Any) -> np.ndarray:
    """A model-state leaf on the host: floats in float32 (x64 is off), integers in int32."""
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    if array.dtype.kind in "iub":
        return array.astype(np.int32 if array.dtype.kind != "b" else np.bool_)
    raise ConfigError(f"model state must hold numbers, got an array of {array.dtype}")


def _lrs(lrs: Any) -> np.ndarray:
    lrs = np.asarray(lrs, np.float32)
    if lrs.ndim != 1:
        raise ConfigError(f"lrs must be a 1-D array of learning rates, got shape {lrs.shape}")
    return lrs


def _resolve_device(device: str) -> Any:
    if device not in ("cpu", "gpu", "auto"):
        raise ConfigError(f"unknown device {device!r}; choose 'cpu', 'gpu' or 'auto'")
    if device != "cpu":
        try:
            return jax.local_devices(backend="gpu")[0]
        except RuntimeError:
            if device == "gpu":
                raise ConfigError(
                    "device='gpu' but jax sees no GPU (install jax[cuda12] for CUDA); "
                    "use 'cpu' or 'auto'"
                ) from None
    return jax.local_devices(backend="cpu")[0]  # a worker's own, under jax.distributed


def _request_deterministic_gpu_ops() -> None:
    """Ask XLA for deterministic GPU kernels; only possible before JAX starts its backends."""
    try:  # no public API tells whether the backends have started
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # pragma: no cover - a future jax moved it; precision still applies
        return
    flag = "--xla_gpu_deterministic_ops=true"
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags and not backends_are_initialized():
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
