"""Objectives: losses that read the whole batch and every output of the model.

A built-in loss compares one output array with one target array. An :class:`Objective` is
handed all of the model's outputs (one array, a tuple or a dict of them) and the whole batch
(inputs, targets and sample weights, each possibly a tuple or dict), so it can combine several
outputs, read an attention mask among the inputs, or weigh two targets. Loss terms that layers
report with ``scope.add_loss`` are added to whichever loss the run uses by
:func:`batch_loss`, the one function every backend computes a batch's loss with outside its
plain ``(x, y)`` path.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError, DataError
from unitrain.losses._base import AbstractLoss, weighted_mean
from unitrain.ops import Array
from unitrain.structure import is_structured, map_leaves

__all__ = ["BatchView", "Fields", "Objective", "batch_loss"]


class Fields(dict[str, Any]):
    """A dict of a batch's arrays (inputs, targets or outputs) whose missing key is a clear
    :class:`~unitrain.DataError` naming the keys there are, instead of a bare ``KeyError``."""

    def __init__(self, items: Mapping[str, Any], what: str) -> None:
        super().__init__(items)
        self.what = what

    def __missing__(self, key: str) -> Any:
        raise DataError(
            f"the objective reads {self.what}[{key!r}], but {self.what} has only the keys "
            f"{sorted(self)}; add {key!r} to the data (or the model's outputs) or read one of "
            "those"
        )


class BatchView(NamedTuple):
    """What an :class:`Objective` reads of a batch, as the running backend's arrays."""

    #: The model's inputs: an array, a tuple or a dict (a :class:`Fields`) of arrays.
    inputs: Any
    #: The targets, likewise.
    targets: Any
    #: One weight per example, or None.
    sample_weight: Any = None


def _view(tree: Any, what: str) -> Any:
    return Fields(tree, what) if isinstance(tree, dict) else tree


class Objective(AbstractLoss):
    """A loss over every output of the model and the whole batch, written in ops.

    Subclass it as a final frozen dataclass with a type name, like any loss, and write
    :meth:`per_example` over ``outputs`` (what the model returns: an array, a tuple or a
    dict) and ``batch`` (a :class:`BatchView`: ``batch.inputs``, ``batch.targets``,
    ``batch.sample_weight``). The batch's loss is :meth:`reduce` of those values: the mean, or
    with sample weights the weighted mean ``sum(w * l) / sum(w)``. Loss terms that layers
    reported (``scope.add_loss``) are added after. Reading a key a dict does not have is a
    :class:`~unitrain.DataError` naming the keys it has.

    Accuracy and the Trainer's metrics compare the first output with the first target
    (element 0 of a tuple, the smallest key of a dict: the order ``jax.tree_util`` and
    ``tf.nest`` flatten in); set ``takes_labels = True`` for accuracy to be reported.
    """

    #: The backends hand this loss the whole batch, not ``(outputs, targets)``.
    reads_batch: ClassVar[bool] = True

    @abc.abstractmethod
    def per_example(self, outputs: Any, batch: BatchView) -> Array:
        """One value per example, in :mod:`unitrain.ops`, from all outputs and the batch."""

    def reduce(self, values: Array, outputs: Any, batch: BatchView) -> Array:
        """The mean of ``values``, weighted by ``batch.sample_weight`` when there is one."""
        if batch.sample_weight is None:
            return ops.mean(values)
        return weighted_mean(values, batch.sample_weight)

    def __call__(self, outputs: Any, batch: BatchView) -> Array:
        """The batch's loss: :meth:`reduce` of :meth:`per_example`, in the running ops."""
        return self.reduce(self.per_example(outputs, batch), outputs, batch)

    def reference(self, outputs: Any, targets: Any, *, per_example: bool = False) -> np.ndarray:
        """The loss (or its values per example) in float64 on the numpy backend's ops: the
        oracle. ``targets`` is the whole batch, a :class:`BatchView` of numpy arrays."""
        batch = BatchView(
            *(None if part is None else map_leaves(_float64, part) for part in targets)
        )
        outputs = _view(map_leaves(_float64, outputs), "outputs")
        view = BatchView(
            _view(batch.inputs, "inputs"), _view(batch.targets, "targets"), batch.sample_weight
        )
        with ops.using("numpy"):
            values = self.per_example(outputs, view)
            result = values if per_example else self.reduce(values, outputs, view)
        return np.asarray(result)


def _float64(leaf: Any) -> np.ndarray:
    array = np.asarray(leaf)
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def batch_loss(
    loss: AbstractLoss,
    outputs: Any,
    inputs: Any,
    targets: Any,
    sample_weight: Any = None,
    terms: Sequence[Any] = (),
) -> Array:
    """A batch's loss as every backend computes it for structured batches, in the running ops:
    ``loss`` (an :class:`Objective` reads everything, a built-in loss one output and one
    target, weighted by ``sample_weight`` when given) plus the reported ``terms``.

    Raises:
        ConfigError: ``loss`` is a native callable, which knows nothing of the batch's
            structure, its weights or the reported terms.
        DataError: a built-in loss given several outputs or several targets.
    """
    if not isinstance(loss, AbstractLoss):
        raise ConfigError(
            "a structured batch, sample weights or loss terms reported by layers need a "
            f"unitrain.losses loss written in ops, got the native callable {loss!r}; write it "
            "as a unitrain.losses.Objective (over the outputs and the whole batch), which runs "
            "on every backend"
        )
    if getattr(loss, "reads_batch", False):
        view = BatchView(_view(inputs, "inputs"), _view(targets, "targets"), sample_weight)
        value = loss(_view(outputs, "outputs"), view)
    else:
        for what, tree in (("outputs", outputs), ("targets", targets)):
            if is_structured(tree):
                raise DataError(
                    f"{type(loss).__name__} compares one output with one target, but the "
                    f"{what} are a {type(tree).__name__} of {len(tree)}; write a "
                    "unitrain.losses.Objective that says how to combine them"
                )
        if sample_weight is None:
            value = loss(outputs, targets)
        else:
            value = loss.weighted(outputs, targets, sample_weight)
    for term in terms:
        value = value + ops.cast(term, ops.dtype(value))
    return value
