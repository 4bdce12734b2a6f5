"""The optimizer base class, the type-name registry, JSON round-tripping and the shared steps.

An optimizer is data: a final frozen dataclass that names its hyperparameters, the state it
keeps per parameter (:attr:`AbstractOptimizer.state_slots`) and its update rule once, in
:mod:`unitrain.ops` (:meth:`AbstractOptimizer.update`). Every backend runs that rule as it is
unless it keeps a faster native form (torch's fused kernels, optax's transforms), and the
numpy backend running it in float64 is the reference every backend is held to
(:meth:`AbstractOptimizer.reference_update`).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import numbers
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain._fields import TypeRegistry
from unitrain.ops import Array
from unitrain.optim._groups import Group, parameter_groups

__all__ = [
    "CLIP_EPSILON",
    "AbstractOptimizer",
    "apply_update",
    "bias_correction",
    "check_bool",
    "check_fraction",
    "check_non_negative",
    "clip_by_global_norm",
    "global_norm",
    "implementation",
    "init_state",
    "optimizer_from_dict",
    "optimizer_types",
    "set_fields",
    "written_in_ops",
]

#: Added to the global norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does.
CLIP_EPSILON = 1e-6

_REGISTRY: TypeRegistry[AbstractOptimizer] = TypeRegistry("optimizer")
_Implementation = TypeVar("_Implementation")


class AbstractOptimizer(abc.ABC):
    """An optimizer's hyperparameters, its per-parameter state slots and its update rule.

    Subclasses are final frozen dataclasses that name themselves in the class statement,
    ``class SGD(AbstractOptimizer, type_name="sgd")``, which registers them for
    :func:`optimizer_from_dict`. They implement :attr:`state_slots` and :meth:`update`, the
    rule written once in :mod:`unitrain.ops`; the learning rate is never a field (it comes from
    the schedule, one float per update).
    """

    type_name: ClassVar[str]
    #: Options per group of parameters (:class:`~unitrain.optim.Group`); a subclass takes them
    #: with a field ``groups: tuple[Group, ...] = ()`` checked by :func:`checked_groups`.
    groups: tuple[Group, ...] = ()

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            _REGISTRY.register(cls, type_name)

    @property
    @abc.abstractmethod
    def state_slots(self) -> tuple[str, ...]:
        """Names of the per-parameter state entries (``<param>.<slot>`` in a state dict)."""

    @property
    def state_suffixes(self) -> tuple[str, ...]:
        """The same as :attr:`state_slots` (the name adapters used before slots had one)."""
        return self.state_slots

    def update(
        self, param: Array, grad: Array, slots: Mapping[str, Array], lr: Any, step: Any
    ) -> tuple[Array, dict[str, Array]]:
        """One update of one parameter, written in :mod:`unitrain.ops`: the rule every backend
        runs where it keeps no faster form of its own.

        Arithmetic happens in the arrays' own dtype, with hyperparameters as Python floats;
        factors that depend on the step come from :func:`bias_correction`, which takes the
        step as a host int or as the backend's integer scalar (a traced counter under
        ``jax.jit`` or ``tf.function``). The base class has no rule: an optimizer that only
        defines :meth:`reference_update` runs on the numpy backend alone.

        Args:
            param: the parameter before the update.
            grad: its gradient (already clipped).
            slots: the parameter's state, one array per name in :attr:`state_slots`.
            lr: the learning rate of this update: a float or a scalar of the backend's.
            step: updates applied including this one (1 for the first): an int or an integer
                scalar of the backend's.

        Returns:
            ``(new_param, new_slots)``; the inputs are not modified.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no update written in unitrain.ops; define "
            "update(param, grad, slots, lr, step) with unitrain.ops functions to run it on "
            "every backend"
        )

    def reference_update(
        self,
        param: np.ndarray,
        grad: np.ndarray,
        slots: Mapping[str, np.ndarray],
        lr: float,
        step: int,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`update` run by the numpy backend's ops: with float64 arrays and a host
        ``step``, the float64 oracle every backend is held to.

        An optimizer may override this alone (a numpy rule); it then runs on the numpy
        backend only, and the other backends refuse it by name.
        """
        with ops.using("numpy"):
            return self.update(param, grad, slots, lr, step)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"type": type_name, **hyperparameters}`` with JSON types only.

        ``groups`` appears only when there are some, so a description stored before groups
        existed reads back equal.
        """
        out: dict[str, Any] = {"type": self.type_name}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            if field.init and field.name != "groups":
                out[field.name] = getattr(self, field.name)
        if self.groups:
            out["groups"] = [group.to_dict() for group in self.groups]
        return out

    def to_json(self) -> str:
        """Return :meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), allow_nan=False)


def optimizer_types() -> dict[str, type[AbstractOptimizer]]:
    """Return the registered optimizer classes by type name (a copy).

    Examples:
        >>> optimizer_types()["sgd"].__name__
        'SGD'
    """
    return _REGISTRY.types()


def optimizer_from_dict(data: Mapping[str, Any]) -> AbstractOptimizer:
    """Rebuild an optimizer from :meth:`AbstractOptimizer.to_dict` output.

    Args:
        data: ``{"type": name, **hyperparameters}``, as checkpoints and recipes store it.

    Returns:
        An optimizer equal to the one that produced ``data``.

    Raises:
        ConfigError: the type is unknown, a field is missing or unknown, or a value is bad.

    Examples:
        >>> from unitrain.optim import SGD
        >>> optimizer_from_dict(SGD(momentum=0.5).to_dict())
        SGD(momentum=0.5, nesterov=False, weight_decay=0.0, groups=())
    """
    cls, fields = _REGISTRY.lookup(data, "optimizer_from_dict")
    return cls(**fields)


def implementation(
    table: Mapping[type[AbstractOptimizer], _Implementation],
    optimizer: AbstractOptimizer,
    backend: str,
    generic: _Implementation | None = None,
) -> _Implementation:
    """The implementation of ``optimizer`` that an adapter runs: its fast native form from
    ``table`` where the adapter keeps one, else ``generic``, the adapter's runner of the
    optimizer's own :meth:`~AbstractOptimizer.update` in ops.

    A table entry is an optimisation the kit holds to the rule in ops; it is never another
    optimizer's update.

    Args:
        table: the adapter's native forms by exact optimizer type.
        optimizer: the optimizer to run.
        backend: the adapter's name, for the message.
        generic: what runs an update written in ops on this adapter; None for an adapter
            that runs only the optimizers of its table (a native framework's classes).

    Raises:
        ConfigError: ``table`` has no entry for the optimizer's type and there is no
            ``generic``, or the optimizer has no update in ops (only a numpy
            ``reference_update``).

    Examples:
        >>> from unitrain.optim import SGD, Adam
        >>> implementation({SGD: "fused sgd"}, SGD(), "demo", "ops rule")
        'fused sgd'
        >>> implementation({}, SGD(), "demo", "ops rule")
        'ops rule'
        >>> implementation({SGD: "fused sgd"}, Adam(), "demo")
        Traceback (most recent call last):
        ...
        unitrain._errors.ConfigError: the demo backend does not implement Adam; it implements SGD. Choose one of those, or use a backend that runs any optimizer (numpy, torch, jax, tensorflow)
    """  # noqa: E501
    found = table.get(type(optimizer))
    if found is not None:
        return found
    name = type(optimizer).__name__
    if generic is None:
        known = ", ".join(sorted(cls.__name__ for cls in table))
        raise ConfigError(
            f"the {backend} backend does not implement {name}; it implements {known}. Choose "
            "one of those, or use a backend that runs any optimizer (numpy, torch, jax, "
            "tensorflow)"
        )
    if written_in_ops(optimizer):
        return generic
    raise ConfigError(
        f"the {backend} backend cannot run {name}: it defines only a numpy reference_update, "
        f"and the {backend} backend runs an optimizer's update(param, grad, slots, lr, step) "
        "written in unitrain.ops. Write that method (the numpy reference then derives from "
        "it), or train on the numpy backend"
    )


def written_in_ops(optimizer: AbstractOptimizer) -> bool:
    """Whether ``optimizer`` has its :meth:`~AbstractOptimizer.update` in ops, so that every
    backend can run it.

    Examples:
        >>> from unitrain.optim import SGD
        >>> written_in_ops(SGD())
        True
    """
    return type(optimizer).update is not AbstractOptimizer.update


def bias_correction(beta: float, step: Any, like: Array, *, root: bool = False) -> Any:
    """``1 - beta**step`` (its square root when ``root``), Adam's correction of a moment that
    started at zero, as ``-expm1(step * log(beta))``.

    A host int ``step`` gives a Python float computed in float64. A backend's integer scalar
    (a device counter, traced under ``jax.jit`` or ``tf.function``) gives a scalar computed in
    float32 (float64 for float64 ``like``) and handed on in ``like``'s dtype: within 3.3e-7
    relative of the float64 value for every step up to 200,000, where ``1 - beta**step`` from a
    float32 ``beta`` is 2e-5 off for ``beta = 0.999``, and no step needs the host.

    Examples:
        >>> round(bias_correction(0.9, 2, None), 12)
        0.19
    """
    log_beta = math.log(beta) if beta > 0 else -math.inf  # -expm1(-inf) = 1 = 1 - 0**step
    if isinstance(step, numbers.Integral):
        value = -math.expm1(int(step) * log_beta)
        return math.sqrt(value) if root else value
    low = ops.dtype(like)
    work = "float64" if low == "float64" else "float32"
    value = -ops.expm1(ops.cast(step, work) * log_beta)
    value = ops.sqrt(value) if root else value
    return ops.cast(value, low) if low != work else value


def init_state(
    optimizer: AbstractOptimizer, params: Mapping[str, np.ndarray], dtype: Any = None
) -> dict[str, np.ndarray]:
    """Return the zero optimizer state for ``params`` under canonical names.

    Every slot starts at zero (a momentum buffer of zero gives exactly torch's "buffer =
    gradient on the first step"), and ``step`` is an int64 scalar counting updates applied.

    Examples:
        >>> from unitrain.optim import Adam
        >>> sorted(init_state(Adam(), {"w": np.ones(2)}))
        ['step', 'w.exp_avg', 'w.exp_avg_sq']
    """
    state: dict[str, np.ndarray] = {"step": np.zeros((), np.int64)}
    for name, value in params.items():
        for slot in optimizer.state_slots:
            state[f"{name}.{slot}"] = np.zeros(value.shape, dtype or value.dtype)
    return state


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """Return the L2 norm of all gradients together, in float64."""
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


def clip_by_global_norm(
    grads: MutableMapping[str, np.ndarray], max_norm: float
) -> tuple[MutableMapping[str, np.ndarray], float]:
    """Scale ``grads`` in place so their global norm is at most ``max_norm``.

    The coefficient is ``max_norm / (norm + 1e-6)``, applied only when below one, exactly as
    ``torch.nn.utils.clip_grad_norm_`` computes it. Returns the grads and the norm before
    clipping.
    """
    norm = global_norm(grads)
    coefficient = max_norm / (norm + CLIP_EPSILON)
    if coefficient < 1.0:
        for name, g in grads.items():
            grads[name] = g * g.dtype.type(coefficient)
    return grads, norm


def apply_update(
    optimizer: AbstractOptimizer,
    params: MutableMapping[str, np.ndarray],
    grads: Mapping[str, np.ndarray],
    state: MutableMapping[str, np.ndarray],
    lr: float,
) -> None:
    """Apply one update at ``lr`` to ``params`` and ``state`` in place (the reference rule).

    Counts the update in ``state["step"]`` and runs the optimizer's
    :meth:`~AbstractOptimizer.reference_update` on every parameter, with its group's options
    and ``lr`` times its group's ``lr_scale`` (:func:`parameter_groups`; layer types in the
    groups must have been resolved by :func:`for_model`).
    """
    step = int(state["step"]) + 1
    state["step"] = np.asarray(step, np.int64)
    for group in parameter_groups(optimizer, params):
        rule, group_lr = group.optimizer, lr * group.lr_scale
        for name in group.names:
            slots = {slot: state[f"{name}.{slot}"] for slot in optimizer.state_slots}
            params[name], updated = rule.reference_update(
                params[name], grads[name], slots, group_lr, step
            )
            for slot, value in updated.items():
                state[f"{name}.{slot}"] = value


# Hyperparameter checks, shared by the optimizer families. Each raises ConfigError naming the
# optimizer, the field and the value, and returns the value as a plain Python type so that
# to_dict emits JSON types.


def set_fields(obj: object, **values: object) -> None:
    """Store checked, normalised values on a frozen dataclass (only from ``__post_init__``)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


def _real(owner: str, name: str, value: object) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{owner}: {name} must be a real number, got {name}={value!r}")


def check_non_negative(owner: str, name: str, value: object) -> float:
    """Return a finite real ``value >= 0`` as a float, else raise ConfigError."""
    number = _real(owner, name, value)
    if 0.0 <= number < math.inf:
        return number
    raise ConfigError(f"{owner}: {name} must be a finite number >= 0, got {name}={value!r}")


def check_fraction(owner: str, name: str, value: object) -> float:
    """Return a decay factor in ``[0, 1)`` as a float, else raise ConfigError."""
    number = _real(owner, name, value)
    if 0.0 <= number < 1.0:
        return number
    raise ConfigError(f"{owner}: {name} must be in [0, 1), got {name}={value!r}")


def check_bool(owner: str, name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise ConfigError."""
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{owner}: {name} must be a bool, got {name}={value!r}")
