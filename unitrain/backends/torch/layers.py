"""Any portable model as one ``nn.Module``: canonical tensors, the core's forward on torch ops.

Every layer's computation is written once, in :mod:`unitrain.ops`
(``AbstractLayer.forward``), so the adapter needs no module per layer type: a
:class:`PortableModule` holds a model's parameters (``nn.Parameter``) and state (buffers) under
their canonical dotted names and runs :func:`unitrain.models.apply` on this backend's ops.
A layer the adapter has never heard of, a user's own included, trains like a built-in one.

The tensors hang off containers (plain modules) along their dotted path, so
``named_parameters()``, ``named_buffers()`` and ``state_dict()`` give exactly the canonical
names, in the canonical layouts (linear ``(in, out)``, conv ``(kh, kw, in, out)``): a
checkpoint needs no renaming or transposing, and DDP, autocast and optimizers see an ordinary
module. Sharded training (:meth:`PortableModule.sharding_units`) makes the container of each
of the model's sharding units an FSDP module of its own, and the pass runs that unit's forward
through it, so its parameters are gathered only while it runs.

``PortableModule`` is the name of this concept in every adapter's ``layers`` module, so a
reader of one adapter finds it in the others (TensorFlow's is a ``tf.Module``, JAX's the pure
apply function).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from unitrain import ConfigError, ops
from unitrain.backends.torch import ops as torch_ops
from unitrain.models import AbstractLayer, Pass, apply
from unitrain.structure import first_leaf

__all__ = ["PortableModule"]

#: (canonical name, the container module that holds the tensor, its name there).
_Slot = tuple[str, nn.Module, str]


class PortableModule(nn.Module):
    """A portable model (:mod:`unitrain.models`) as an ``nn.Module``, initialised from it.

    Args:
        spec: the model; its ``forward`` computes the output (in :mod:`unitrain.ops`).
        seed: the seed of ``spec.init_params``; the same on every backend.
        dtype: the parameters' and state's dtype (float32 values rounded to bfloat16).
        device: where the tensors live.
        ops: the ops module the forward runs on: this backend's (a backend class that
            replaces its ``ops`` passes its own).

    Attributes:
        spec: the model description each forward runs (read per call, so it may be replaced
            by one with the same parameters).
        generator: the generator dropout draws its masks from under ``random="native"``,
            for the caller to seed before each train-mode forward (the backend seeds it from
            ``(seed, step, micro_batch)``); None when no layer drops values.
        stream_key: the next train-mode forward's portable key (a host int32 array from
            ``ops.random.stream_key(seed, step, micro_batch)``), which the caller sets before
            each forward; while it is set, dropout draws from it instead of ``generator``.

    Examples:
        >>> import torch
        >>> from unitrain.models import MLP
        >>> module = PortableModule(MLP((4, 8, 3)), seed=0)
        >>> [name for name, _ in module.named_parameters()]
        ['layers.0.weight', 'layers.0.bias', 'layers.1.weight', 'layers.1.bias']
        >>> module(torch.zeros(2, 4)).shape
        torch.Size([2, 3])
    """

    #: The ops module the forward runs on, unless the constructor was given another.
    _ops: ModuleType = torch_ops

    def __init__(
        self,
        spec: AbstractLayer,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
        ops: ModuleType = torch_ops,
    ) -> None:
        super().__init__()
        self.spec = spec
        if ops is not torch_ops:  # a module object does not pickle: only where it must
            self._ops = ops
        device = torch.device(device)
        numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
        params = spec.init_params(seed, numpy_dtype)
        state = spec.init_state(numpy_dtype)
        params_at: list[_Slot] = []
        state_at: list[_Slot] = []
        # Layer by layer, parameters before state: the order (and tree) the per-layer modules
        # of earlier versions had, so state_dict() lists the names as it always did.
        for prefix, layer in spec.named_layers():
            for local in layer.own_param_shapes():
                name = f"{prefix}.{local}" if prefix else local
                value = torch.from_numpy(params[name]).to(device, dtype)
                params_at.append(_attach(self, name, nn.Parameter(value), parameter=True))
            for local in layer.own_state_shapes():
                name = f"{prefix}.{local}" if prefix else local
                value = torch.from_numpy(state[name]).to(device, dtype)
                state_at.append(_attach(self, name, value, parameter=False))
        self._params_at = tuple(params_at)
        self._state_at = tuple(state_at)
        self._state_in = {name: (owner, local) for name, owner, local in state_at}
        self.generator: torch.Generator | None = torch.Generator(device) if spec.drops_out else None
        self.stream_key: np.ndarray | None = None
        #: The sharding units' containers and parameters, by path, the unit of each of their
        #: parameters, and the parameters of none (see sharding_units: none until it is asked).
        self._units: dict[str, tuple[nn.Module, tuple[_Slot, ...]]] = {}
        self._unit_of: dict[str, str] = {}
        self._own_params_at = self._params_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``spec``'s output for ``x``; in train mode, the moved state becomes the buffers.

        The name-to-tensor maps are read from the containers each call (under a microsecond
        for a small model): ``.to()`` replaces buffers and ``torch.func.functional_call``
        swaps parameters in, and the pass must see what they put there.
        """
        units = None
        if self._units:
            params: dict[str, Any] = _UnitParameters(
                {name: owner._parameters[local] for name, owner, local in self._own_params_at},
                self._unit_of,
            )
            units = {path: functools.partial(self._run_unit, path, params) for path in self._units}
        else:
            params = {name: owner._parameters[local] for name, owner, local in self._params_at}
        state: dict[str, Any] = {
            name: owner._buffers[local] for name, owner, local in self._state_at
        }
        training = self.training
        generator = self.generator
        device = first_leaf(x).device  # several inputs: the first one's (all are there)
        draw = None
        stream = self.stream_key if training else None
        if stream is None and training and generator is not None:

            def draw(shape: Any, dtype: str) -> torch.Tensor:
                # float32 whatever the model's dtype, as the masks always were drawn, so
                # seeded runs keep their masks.
                return torch.rand(shape, generator=generator, device=device)

        kept = _host_keep_mask if stream is not None and device.type == "cpu" else None
        run = Pass(params, state, training=training, draw=draw, key=stream, kept=kept, units=units)
        # ops.enter/leave, not ops.using(): a generator-based context manager costs a few
        # microseconds per forward that a small model's step notices. Arrays the
        # layers make from nothing (masks, constants) go to the input's device.
        token = ops.enter(self._ops)
        made_on = torch_ops.set_default_device(device)
        try:
            out, _ = apply(self.spec, x, run)
        finally:
            torch_ops.set_default_device(made_on)
            ops.leave(token)
        for name, value in run.new_state.items():  # detached by Scope.set_state
            self._keep_state(name, value)
        # The loss terms the layers reported in this pass (``scope.add_loss``), which the
        # backend adds to the loss; set in __dict__, skipping nn.Module's slower __setattr__.
        self.__dict__["reported_losses"] = run.losses
        return out

    def sharding_units(self) -> list[nn.Module]:
        """The containers of the model's sharding units (``spec.sharding_units()``), in the
        order they run; from now on each forward runs a unit's layer through its container.

        The caller makes each container, then this module, an FSDP module
        (``fully_shard``): the container's pre-forward hook gathers the unit's parameters
        into it, the layer's forward reads them there, and the post-forward hook frees them
        (FSDP gathers them again for the backward through hooks on the unit's output). A
        unit's parameters are in the pass only while it runs; a read from outside (a tied
        weight) is refused with a ConfigError that says so.
        """
        for path in self.spec.sharding_units():
            slots = tuple(slot for slot in self._params_at if _below(slot[0], path))
            if slots:
                self._units[path] = (self.get_submodule(path), slots)
                self._unit_of.update((name, path) for name, _, _ in slots)
        self._own_params_at = tuple(s for s in self._params_at if s[0] not in self._unit_of)
        return [container for container, _ in self._units.values()]

    def _run_unit(
        self, path: str, params: dict[str, Any], compute: Callable[..., Any], *inputs: Any
    ) -> Any:
        """Run ``compute`` (unit ``path``'s forward) through the unit's container, with the
        parameters its hooks gathered in ``params`` while it runs."""
        container, slots = self._units[path]

        def gathered(*xs: Any) -> Any:
            for name, owner, local in slots:
                params[name] = owner._parameters[local]
            try:
                return compute(*xs)
            finally:
                for name, _, _ in slots:
                    del params[name]

        return container(gathered, *inputs)

    def _keep_state(self, name: str, value: torch.Tensor) -> None:
        """Make ``value`` the buffer ``name``, in the buffer's dtype.

        The buffer is replaced, not written into: a state the pass read may be saved for the
        backward pass (a stateful LSTM's carried hidden state), and writing into it would
        fail that backward. A view is copied, so that the buffer does not keep its base (a
        whole sequence of outputs) alive.
        """
        owner, local = self._state_in[name]
        old = getattr(owner, local)
        if old is not None and (value.dtype != old.dtype or value._base is not None):
            value = value.to(old.dtype, copy=True)
        setattr(owner, local, value)  # nn.Module.__setattr__ replaces the buffer

    def extra_repr(self) -> str:
        return self.spec.describe()


class _Container(nn.Module):
    """A node of the canonical name tree. Its forward runs the computation handed to it, so
    that when it is a sharding unit FSDP's hooks (gather before, free after) wrap the unit's
    forward."""

    def forward(self, compute: Callable[..., Any], *inputs: Any) -> Any:
        return compute(*inputs)


class _UnitParameters(dict[str, Any]):
    """A pass's parameters under sharding: a unit's are here only while the unit runs."""

    def __init__(self, params: dict[str, Any], unit_of: dict[str, str]) -> None:
        super().__init__(params)
        self.unit_of = unit_of

    def __missing__(self, name: str) -> Any:
        unit = self.unit_of.get(name)
        if unit is None:
            raise KeyError(name)
        raise ConfigError(
            f"parameter {name!r} was read outside its sharding unit {unit!r}: sharded "
            "training gathers a unit's parameters only while the unit runs. A layer may read "
            "only its own parameters and its children's; a weight read elsewhere (a head tied "
            "to the token embedding) must belong to a layer that is not a unit of its own "
            "(see unitrain.models.AbstractLayer.sharding_units)"
        )


def _below(name: str, path: str) -> bool:
    return name.startswith(path + ".")


def _host_keep_mask(site_key: torch.Tensor, keep: float, x: torch.Tensor) -> torch.Tensor:
    """A portable dropout mask for a CPU tensor, drawn by the numpy reference's ops: the same
    bits as torch's ops would draw, without eager torch's per-op cost over Threefry's ~135
    integer ops (1.4-1.6x the native generator's step time on the Transformer with dropout
    0.1 on a shared 2-core CPU; numpy drew a 262144-entry mask in 8 ms, torch in 24 ms to 1 s)."""
    with ops.using("numpy"):
        kept = ops.random.bernoulli(np.asarray(site_key), keep, tuple(x.shape))
    return torch.from_numpy(np.asarray(kept))


def _attach(module: nn.Module, dotted: str, value: torch.Tensor, *, parameter: bool) -> _Slot:
    """Register ``value`` under a dotted name (``attention.query.weight``) through plain
    sub-modules; return where it lives."""
    *path, local = dotted.split(".")
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = _Container()
            module.add_module(part, child)
        module = child
    if parameter:
        module.register_parameter(local, value)  # type: ignore[arg-type]
    else:
        module.register_buffer(local, value)
    return dotted, module, local
