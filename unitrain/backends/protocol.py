"""The small interface between the framework-agnostic Trainer and one framework.

The Trainer talks to a backend through :class:`Backend` and nothing else, so a new framework
fits in a few hundred lines. Everything a backend returns from the hot path (losses, metric
values) may stay on its device, as long as ``numpy.asarray`` (or the backend's ``to_host``)
can read it; the Trainer adds them up with ``+`` and reads them on the host only at logging
points, so no call here forces a device-to-host sync per step. The callers pass each update's
numbers (``step``, ``micro_batch``; see :mod:`unitrain.backends.numbering`), so neither does
keying dropout.

An adapter imports the core only through public modules: this one (which also re-exports the
helpers adapters share: :func:`check_state` and :func:`split_state` for the canonical state
layout, :func:`as_pair` for a layer's pair fields, :class:`UpdateNumbers` for dropout keys),
``unitrain`` for the errors, and :mod:`unitrain.models`, :mod:`unitrain.optim`,
:mod:`unitrain.backends.precision` and :mod:`unitrain.backends.strategy`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from unitrain.backends.numbering import UpdateNumbers
from unitrain.backends.precision import LossScaler
from unitrain.backends.state import check_state, split_state
from unitrain.models._base import as_pair
from unitrain.ops.random import check_generator
from unitrain.optim import Optimizer

__all__ = [
    "AvailableDevices",
    "Backend",
    "BackendOptions",
    "Batch",
    "Capabilities",
    "DeviceData",
    "DeviceOutputs",
    "FusedStep",
    "MultiStep",
    "Predict",
    "PortableOps",
    "Prefetch",
    "ToHost",
    "UpdateNumbers",
    "as_pair",
    "check_state",
    "split_state",
]

#: A batch is a tuple ``(inputs, targets)`` of arrays whose first axis is the example axis.
Batch = tuple[Any, Any]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend declares it can do; callers read this instead of guessing.

    Only what its methods cannot show is declared here. An optional method (the fused
    ``train_step``, ``train_steps``, ``to_host``, ...) is offered by defining it, and callers
    test for it with ``isinstance(backend, FusedStep)`` and the other protocols below.

    Attributes:
        devices: device kinds the backend can run on (``"cpu"``, ``"gpu"``).
        dtypes: parameter dtypes it trains in (``"float32"``, ``"float64"``, ...).
        bit_exact_resume: whether resuming from a checkpoint reproduces an uninterrupted run
            bit for bit on the same device in deterministic mode.
        portable_models: whether it builds :mod:`unitrain.models` architectures, so that its
            checkpoints use canonical names and load in other backends.
        portable_layers: whether it builds every layer of :mod:`unitrain.models` (conv nets,
            BatchNorm state, Transformers), not only the MLP; the kit's ``layers`` and
            ``model_state`` families need it. Off by default, so a backend written before
            the layers existed is told what it lacks instead of failing.
        data_parallel: whether it trains on several workers through its framework's engine:
            it offers ``launched_strategy()`` (the :class:`unitrain.backends.strategy.Strategy` of
            the launcher that started the process, or None) and ``launch_command(workers)``
            (the launcher that starts ``workers`` local processes of a Python program).
        precisions: the ``TrainerConfig.precision`` values it trains in on each device kind
            (``{"cpu": ("32", "bf16-mixed")}``); a device not listed trains in ``"32"`` only.
    """

    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ("float32",)
    bit_exact_resume: bool = True
    portable_models: bool = True
    portable_layers: bool = False
    data_parallel: bool = False
    precisions: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: {"cpu": ("32",)}
    )

    def supports_precision(self, precision: str, device: str) -> bool:
        """Whether ``precision`` is declared for ``device`` (``"32"`` always is)."""
        return precision == "32" or precision in self.precisions.get(device, ())


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """Everything a backend is built from, besides the model.

    Attributes:
        loss: a :mod:`unitrain.losses` loss (``CrossEntropy(label_smoothing=0.1)``, a user's
            own), or its type name (``"cross_entropy"``, ``"mse"``, ...); every backend
            computes it with the loss's code in ops (or a native form the kit holds to it).
            A backend may also accept a native callable ``loss(outputs, targets)``.
        optimizer: the optimizer description; its update rule is written once in ops
            (:meth:`unitrain.optim.AbstractOptimizer.update`), a backend's faster native form
            held to it.
        grad_clip_norm: clip gradients to this global L2 norm before the update, or None.
        device: ``"cpu"``, ``"gpu"`` or ``"auto"`` (a GPU when one is visible).
        seed: seeds initial weights of portable models and the dropout masks, which every
            backend derives from ``(seed, step, micro_batch)`` (the numbers its caller passes;
            see :meth:`Backend.forward`) so a resumed run draws the same.
        deterministic: pick deterministic kernels.
        dtype: parameter dtype.
        matmul_precision: ``"highest"``, ``"high"`` or ``"medium"``: the framework's float32
            matmul setting (see :mod:`unitrain.backends.precision`).
        precision: ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        random: where dropout masks (and a layer's ``scope.random_key()`` draws) come from:
            ``"portable"`` (:mod:`unitrain.ops.random`, the same bits on every backend) or
            ``"native"`` (the framework's own generator, faster, its masks its own).
        loss_scaler: the rule of ``"16-mixed"``; its state is ``optimizer.loss_scale`` and
            ``optimizer.loss_scale_good_steps`` in the state dict.
    """

    loss: Any = "cross_entropy"
    optimizer: Optimizer = dataclasses.field(default_factory=lambda: _default_optimizer())
    grad_clip_norm: float | None = None
    device: str = "auto"
    seed: int = 0
    deterministic: bool = False
    dtype: str = "float32"
    matmul_precision: str = "highest"
    precision: str = "32"
    loss_scaler: LossScaler = dataclasses.field(default_factory=LossScaler)
    random: str = "portable"

    def __post_init__(self) -> None:
        check_generator(self.random)


def _default_optimizer() -> Optimizer:
    from unitrain.optim import SGD

    return SGD()


@runtime_checkable
class Backend(Protocol):
    """One framework's implementation of forward, backward, step and state.

    A backend class is constructed as ``cls(model, options)`` where ``model`` is a portable
    :mod:`unitrain.models` model or a model native to the framework, and ``options`` is a
    :class:`BackendOptions`. A class may also offer a static ``available_devices()`` naming
    the devices usable on this machine (:class:`AvailableDevices`; ``unitrain backends``
    shows it).
    """

    name: str
    capabilities: Capabilities

    @property
    def device(self) -> str:
        """The device the backend runs on: ``"cpu"`` or ``"gpu"``."""
        ...

    @property
    def skipped_steps(self) -> int:
        """How many ``step`` calls were skipped because a loss or gradient was NaN or
        infinite."""
        ...

    def forward(
        self, batch: Batch, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        """Run the model in train mode on ``batch``, keep what backward needs, return the loss.

        Dropout masks are keyed by ``(options.seed, step, dropout_index(micro_batch,
        world_size, rank))``: ``step`` is how many updates the caller made before this
        forward's update, skipped ones included (the Trainer's ``state.step``);
        ``micro_batch`` how many forwards the backend already ran for this update (0 for the
        first); ``(world_size, rank)`` what ``distribute`` set, else ``(1, 0)``. None (a direct
        caller) means the backend's own count (:class:`UpdateNumbers`).
        """
        ...

    def backward(self, scale: float = 1.0) -> None:
        """Add ``scale`` times the gradients of the last forward's loss into the buffers."""
        ...

    def step(self, lr: float) -> None:
        """Clip, apply one optimizer update at ``lr``, zero the gradient buffers.

        If any gradient is NaN or infinite, parameters and optimizer state stay untouched, the
        buffers are zeroed and ``skipped_steps`` grows by one.
        """
        ...

    def evaluate(self, batch: Batch) -> Mapping[str, Any]:
        """Return batch-mean ``loss`` (and ``accuracy`` when classifying), in eval mode: the
        model state (e.g. BatchNorm running statistics) is read and left unchanged."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return parameters and model state (``model.<name>``) and optimizer state
        (``optimizer.<name>``) as host arrays.

        Model state is every non-trainable tensor of the model (BatchNorm running statistics,
        counters): torch buffers, TensorFlow non-trainable variables, a JAX state pytree. It
        is saved, restored and compared like the parameters, and has no optimizer slots.
        """
        ...

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters, model state and optimizer state with ``state`` (as made by
        state_dict); every key, shape and dtype must fit."""
        ...

    def rng_state(self) -> dict[str, Any]:
        """Return the framework's global random state as JSON-serialisable data."""
        ...

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore what rng_state returned."""
        ...

    def versions(self) -> dict[str, str]:
        """Return the versions of the framework packages in use, for checkpoints and reports.

        ``unitrain backends`` calls it on an instance made without ``__init__`` (no model, no
        device), and shows the package metadata's version where it needs the constructor's
        state (torch's and TensorFlow's name CUDA only when they use it)."""
        ...

    # Optional methods are the runtime-checkable protocols below (FusedStep, ToHost, ...):
    # a backend has one by defining its methods, and callers test it with isinstance.


@runtime_checkable
class FusedStep(Protocol):
    """The optional fast path: one call for forward, backward and step."""

    def train_step(self, batch: Batch, lr: float, *, step: int | None = None) -> Any:
        """Equal to ``forward(batch, step=step, micro_batch=0); backward(); step(lr)``;
        returns the loss."""
        ...


@runtime_checkable
class MultiStep(Protocol):
    """Optional: several updates in one compiled call (``TrainerConfig.steps_per_call``)."""

    def train_steps(self, batches: Batch, lrs: Any, *, step: int | None = None) -> Any:
        """Equal to ``k`` ``train_step`` calls; returns the ``k`` losses as one array.

        ``batches`` are ``k`` equal-sized batches stacked on a new leading axis; ``lrs`` the
        ``k`` learning rates, a float array; update ``i`` is numbered ``step + i``.
        """
        ...


@runtime_checkable
class Predict(Protocol):
    """Optional: the model's outputs (``Trainer.predict`` and metrics need it)."""

    def predict(self, inputs: Any) -> np.ndarray:
        """Outputs for a batch of ``inputs`` in eval mode, as a host numpy array."""
        ...


@runtime_checkable
class DeviceOutputs(Protocol):
    """Optional: outputs left on the device, so metrics run there (:mod:`unitrain.metrics`)."""

    #: numpy-style functions on the framework's arrays: ``sum``, ``max``, ``exp``, ``log``,
    #: ``reshape``, ``take_along_axis`` (numpy, ``jax.numpy``, ``tf.experimental.numpy``).
    array_ops: Any

    def outputs(self, batch: Batch) -> tuple[Any, Any]:
        """Eval-mode outputs for ``batch`` and its targets, as arrays on the device."""
        ...


@runtime_checkable
class DeviceData(Protocol):
    """Optional: the training set kept on the device (``TrainerConfig.data_on_device``)."""

    def set_device_data(self, inputs: Any, targets: Any) -> None:
        """Copy the whole training set to the device once."""
        ...

    def train_steps_on_device(self, indices: Any, lrs: Any, *, step: int | None = None) -> Any:
        """Like ``train_steps`` on the batches gathered by ``indices`` (``k x batch``)."""
        ...


@runtime_checkable
class ToHost(Protocol):
    """Optional: many device values read back to the host in one transfer."""

    def to_host(self, values: list[Any]) -> list[Any]:
        """``values`` (the losses collected between logging points) on the host, in order, as
        numpy arrays or numpy scalars.

        Without it the Trainer converts each value with ``numpy.asarray``.
        """
        ...


@runtime_checkable
class AvailableDevices(Protocol):
    """Optional, on the backend class: the devices usable on this machine."""

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The device kinds (``"cpu"``, ``"gpu"``) this machine offers the backend now."""
        ...


@runtime_checkable
class PortableOps(Protocol):
    """Optional, on the backend class: ``ops``, its module of the :mod:`unitrain.ops` contract.

    The module defines every function of ``unitrain.ops.CONTRACT`` with the same parameters,
    plus ``to_numpy(x)`` and ``vjp(fn, arrays, wrt)`` for the kit (see
    :func:`unitrain.conformance._op_cases.run_case`); ``unitrain.ops.using(name)`` finds it
    here, and the kit's ``ops`` family holds it to the float64 reference.
    """

    ops: ModuleType


@runtime_checkable
class Prefetch(Protocol):
    """Optional: batches put on the device ahead of the step that uses them.

    The Trainer passes each epoch's host batches through ``prefetch`` on its default path
    (one update per batch). An implementation must not wait for the device (no host sync),
    must yield the same batches in the same order, and may return ``batches`` unchanged
    where copying ahead gains nothing (on a CPU).
    """

    def prefetch(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """Yield ``batches`` as device-ready batches, the next one copying while one trains."""
        ...
