"""The loss base class, the type-name registry, JSON round-tripping and the old names.

A loss is data: a final frozen dataclass that names its parameters and its value once, in
:mod:`unitrain.ops`, as one value per example (:meth:`AbstractLoss.per_example`) and the
reduction of those values to the batch's loss (:meth:`AbstractLoss.reduce`). Every backend
runs that code unless it keeps a faster native form held to it by the kit, and the numpy
backend running it in float64 is the reference (:meth:`AbstractLoss.reference`).
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain._fields import TypeRegistry
from unitrain.ops import Array

__all__ = [
    "AbstractLoss",
    "loss_from_dict",
    "loss_types",
    "mean_per_example",
    "resolve_loss",
    "takes_labels",
    "spread_weights",
    "targets_like",
    "weighted_mean",
]

_REGISTRY: TypeRegistry[AbstractLoss] = TypeRegistry("loss")


class AbstractLoss(abc.ABC):
    """A loss's parameters, its value per example and the reduction to the batch's loss.

    Subclasses are final frozen dataclasses that name themselves in the class statement,
    ``class MSE(AbstractLoss, type_name="mse")``, which registers them for
    :func:`loss_from_dict` and :func:`resolve_loss`. They implement :meth:`per_example` in
    :mod:`unitrain.ops`; :meth:`reduce` is the mean unless they say otherwise. Calling a loss,
    ``loss(outputs, targets)``, gives the batch's loss in the running backend's ops.
    """

    type_name: ClassVar[str]
    #: Whether the targets are integer class labels: a backend sends them as integers and
    #: reports ``accuracy`` beside the loss in ``evaluate``.
    takes_labels: ClassVar[bool] = False

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            _REGISTRY.register(cls, type_name)

    @abc.abstractmethod
    def per_example(self, outputs: Array, targets: Array) -> Array:
        """One value per example (per position of a sequence), written in :mod:`unitrain.ops`.

        Args:
            outputs: the model's outputs, examples on the first axis, in float32 under mixed
                precision (the backends hand the loss float32 outputs).
            targets: the batch's targets as the backend holds them: integers for a loss that
                :attr:`takes_labels`, else floats in the outputs' dtype or as given.

        Returns:
            The values :meth:`reduce` turns into the batch's loss: shape ``(N,)``, or
            ``(N, L)`` for a loss of one value per position.
        """

    def reduce(self, values: Array, outputs: Array, targets: Array) -> Array:
        """The batch's loss from :meth:`per_example`'s ``values``: their mean, unless the loss
        weights its positions (then it says how)."""
        return ops.mean(values)

    def __call__(self, outputs: Array, targets: Array) -> Array:
        """The batch's loss: :meth:`reduce` of :meth:`per_example`, in the running ops."""
        return self.reduce(self.per_example(outputs, targets), outputs, targets)

    def weighted(self, outputs: Array, targets: Array, sample_weight: Array) -> Array:
        """The batch's loss with one weight per example: ``sum(w * l) / sum(w)`` of the values
        :meth:`per_example` gives (a loss that weights its positions says how it combines)."""
        return weighted_mean(self.per_example(outputs, targets), sample_weight)

    def reference(self, outputs: Any, targets: Any, *, per_example: bool = False) -> np.ndarray:
        """The loss (or with ``per_example``, its values per example) in float64, run by the
        numpy backend's ops: the oracle every backend is held to.

        Examples:
            >>> from unitrain.losses import MSE
            >>> float(MSE().reference(np.array([[1.0], [3.0]]), np.array([[0.0], [0.0]])))
            5.0
        """
        outputs = np.asarray(outputs, np.float64)
        targets = np.asarray(targets)
        if targets.dtype.kind == "f":
            targets = targets.astype(np.float64)
        with ops.using("numpy"):
            values = self.per_example(outputs, targets)
            result = values if per_example else self.reduce(values, outputs, targets)
        return np.asarray(result)

    def check_targets(self, targets: np.ndarray, outputs: tuple[int, ...], name: str) -> None:
        """Raise :class:`~unitrain.DataError` unless ``targets`` fit one example's ``outputs``
        shape (on the host; the numpy backend checks every batch). Nothing by default."""
        del targets, outputs, name  # a loss without a host check accepts what ops accept

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"type": type_name, **parameters}`` with JSON types only."""
        out: dict[str, Any] = {"type": self.type_name}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            if field.init:
                value = getattr(self, field.name)
                out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_json(self) -> str:
        """Return :meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), allow_nan=False)


def loss_types() -> dict[str, type[AbstractLoss]]:
    """Return the registered loss classes by type name (a copy).

    Examples:
        >>> loss_types()["cross_entropy"].__name__
        'CrossEntropy'
    """
    return _REGISTRY.types()


def loss_from_dict(data: Mapping[str, Any]) -> AbstractLoss:
    """Rebuild a loss from :meth:`AbstractLoss.to_dict` output.

    Args:
        data: ``{"type": name, **parameters}``, as recipes store it.

    Raises:
        ConfigError: the type is unknown, a field is missing or unknown, or a value is bad.

    Examples:
        >>> from unitrain.losses import Huber
        >>> loss_from_dict(Huber(delta=0.5).to_dict())
        Huber(delta=0.5)
    """
    cls, fields = _REGISTRY.lookup(data, "loss_from_dict")
    return cls(**fields)


def resolve_loss(loss: Any) -> Any:
    """The loss a backend computes: a :class:`AbstractLoss` as it is, a type name (the old
    strings ``"cross_entropy"`` and ``"mse"`` among them) as that loss with its defaults, a
    ``{"type": ...}`` table through :func:`loss_from_dict`, a native callable as it is.

    Raises:
        ConfigError: an unknown name, or anything else.

    Examples:
        >>> resolve_loss("cross_entropy")
        CrossEntropy(label_smoothing=0.0, ignore_index=None, class_weights=None)
        >>> resolve_loss("hinge")  # the known types follow, losses of your own among them
        Traceback (most recent call last):
        ...
        unitrain._errors.ConfigError: unknown loss type 'hinge'; known types: ...
    """
    if isinstance(loss, AbstractLoss):
        return loss
    if isinstance(loss, str):
        return loss_from_dict({"type": loss})
    if isinstance(loss, Mapping):
        return loss_from_dict(loss)
    if callable(loss):
        return loss
    raise ConfigError(
        f"loss must be a unitrain.losses loss, its type name ('cross_entropy', 'mse', ...) or "
        f"a native callable, got {loss!r}"
    )


def takes_labels(loss: Any) -> bool:
    """Whether ``loss`` (as :func:`resolve_loss` gives it) takes integer class labels; a
    native callable does not say, so its targets pass as they are."""
    return isinstance(loss, AbstractLoss) and loss.takes_labels


def mean_per_example(values: Array) -> Array:
    """``values`` averaged over every axis but the first: one value per example."""
    rank = len(ops.shape(values))
    return values if rank == 1 else ops.mean(values, tuple(range(1, rank)))


def targets_like(targets: Array, outputs: Array) -> Array:
    """``targets`` in the outputs' dtype and shape (a ``(N,)`` target for ``(N, 1)``)."""
    return ops.reshape(ops.cast(targets, ops.dtype(outputs)), ops.shape(outputs))


def spread_weights(sample_weight: Array, values: Array) -> Array:
    """One weight per example broadcast over ``values``' positions, in their dtype."""
    shape = ops.shape(values)
    weight = ops.cast(sample_weight, ops.dtype(values))
    if len(shape) > 1:
        weight = ops.reshape(weight, (shape[0],) + (1,) * (len(shape) - 1)) * ops.ones_like(values)
    return weight


def weighted_mean(values: Array, sample_weight: Array) -> Array:
    """``sum(w * l) / sum(w)`` over every value, each example's weight spread over its
    positions (a ``(N, L)`` loss counts every position of example ``i`` with ``w[i]``)."""
    weight = spread_weights(sample_weight, values)
    return ops.sum(weight * values) / ops.sum(weight)
