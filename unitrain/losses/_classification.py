"""Losses over logits: cross-entropy (class labels), binary cross-entropy, KL divergence.

Each is torch's definition, written once in :mod:`unitrain.ops`; where torch and Keras
differ, the docstring says which one it follows.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, ClassVar, final

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError, DataError
from unitrain.losses._base import (
    AbstractLoss,
    mean_per_example,
    spread_weights,
    targets_like,
    weighted_mean,
)
from unitrain.ops import Array

__all__ = ["BinaryCrossEntropyWithLogits", "CrossEntropy", "KLDivergence"]


@final
@dataclasses.dataclass(frozen=True)
class CrossEntropy(AbstractLoss, type_name="cross_entropy"):
    """Softmax cross-entropy of logits against integer class labels (``torch.nn.CrossEntropyLoss``).

    The outputs' last axis holds the classes: logits ``(N, C)`` with labels ``(N,)``, or a
    sequence model's ``(N, L, V)`` with labels ``(N, L)``, every position counting as an
    example does. Per position the value is torch's ``reduction="none"``:
    ``(1 - s) * w[y] * -log p[y] + (s / C) * sum_c w[c] * -log p[c]`` with ``s`` the label
    smoothing and ``w`` the class weights (all ones without), 0 where the label is
    ``ignore_index``. The batch's loss is torch's weighted mean: the values' sum over the sum
    of ``w[y]`` of the positions not ignored (their count without class weights). A label
    outside ``[0, C)`` (other than ``ignore_index``) makes the loss NaN, which skips the
    update, on the backends that do not refuse it first.

    Args:
        label_smoothing: ``s`` in [0, 1].
        ignore_index: a label that contributes nothing (padding tokens), or None.
        class_weights: one weight per class, or None.

    Examples:
        >>> import numpy as np
        >>> loss = CrossEntropy(ignore_index=-1)
        >>> logits = np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))
        >>> round(float(loss.reference(logits, np.array([1, -1]))), 6)  # log 2
        0.693147
    """

    label_smoothing: float = 0.0
    ignore_index: int | None = None
    class_weights: tuple[float, ...] | None = None
    takes_labels: ClassVar[bool] = True

    def __post_init__(self) -> None:
        smoothing = self.label_smoothing
        if not _real(smoothing) or not 0.0 <= smoothing <= 1.0:
            raise ConfigError(
                "CrossEntropy: label_smoothing must be in [0, 1], got "
                f"label_smoothing={smoothing!r}"
            )
        index = self.ignore_index
        if index is not None and not (isinstance(index, numbers.Integral) and _plain(index)):
            raise ConfigError(
                f"CrossEntropy: ignore_index must be an int or None, got ignore_index={index!r}"
            )
        weights = self.class_weights
        if weights is not None:
            values = tuple(weights) if isinstance(weights, list | tuple) else None
            if not values or not all(_real(w) and 0.0 <= w < math.inf for w in values):
                raise ConfigError(
                    "CrossEntropy: class_weights must be a non-empty list of finite numbers "
                    f">= 0, one per class, got class_weights={weights!r}"
                )
            object.__setattr__(self, "class_weights", tuple(float(w) for w in values))
        object.__setattr__(self, "label_smoothing", float(smoothing))
        object.__setattr__(self, "ignore_index", None if index is None else int(index))

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """torch's ``reduction="none"`` value of each position (see the class)."""
        classes = self._classes(outputs)
        labels, kept, wrong = self._labels(outputs, targets, classes)
        log_probs = ops.log_softmax(outputs, -1)
        picked = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), -1)
        value = -ops.squeeze(picked, -1)
        weights = self._weights(outputs)
        if weights is not None:
            value = value * ops.take(weights, labels, 0)
        if self.label_smoothing:
            every = log_probs if weights is None else log_probs * weights
            smooth = -ops.sum(every, -1)
            value = (1.0 - self.label_smoothing) * value + (self.label_smoothing / classes) * smooth
        zero = ops.zeros_like(value)
        value = ops.where(kept, value, zero)
        return ops.where(wrong, zero + math.nan, value)

    def reduce(self, values: Array, outputs: Array, targets: Array) -> Array:
        """The weighted mean: the values' sum over the weights of the positions kept."""
        if self.ignore_index is None and self.class_weights is None:
            return ops.mean(values)
        labels, kept, _ = self._labels(outputs, targets, self._classes(outputs))
        ones = ops.ones_like(ops.cast(labels, ops.dtype(values)))
        weights = self._weights(outputs)
        counted = ones if weights is None else ops.take(weights, labels, 0)
        return ops.sum(values) / ops.sum(ops.where(kept, counted, ops.zeros_like(counted)))

    def weighted(self, outputs: Array, targets: Array, sample_weight: Array) -> Array:
        """With sample weights ``s``: ``sum(s * values) / sum(s * w[y])`` over the positions
        kept, so the class weights and the ignored positions count as in :meth:`reduce`."""
        values = self.per_example(outputs, targets)
        if self.ignore_index is None and self.class_weights is None:
            return weighted_mean(values, sample_weight)
        labels, kept, _ = self._labels(outputs, targets, self._classes(outputs))
        ones = ops.ones_like(ops.cast(labels, ops.dtype(values)))
        weights = self._weights(outputs)
        counted = ones if weights is None else ops.take(weights, labels, 0)
        counted = ops.where(kept, counted, ops.zeros_like(counted))
        weight = spread_weights(sample_weight, values)
        return ops.sum(weight * values) / ops.sum(weight * counted)

    def check_targets(self, targets: np.ndarray, outputs: tuple[int, ...], name: str) -> None:
        """Integer labels, one per position, in ``[0, C)`` or equal to ``ignore_index``."""
        from unitrain.data import check_targets

        targets = np.asarray(targets)
        if targets.dtype.kind not in "iu":
            ignoring = (
                ""
                if self.ignore_index is None
                else f" (ignore_index={self.ignore_index} is compared with integer labels)"
            )
            raise DataError(
                f"{name} targets must be integer class labels for cross-entropy{ignoring}, "
                f"got dtype {targets.dtype}"
            )
        if self.ignore_index is not None:
            targets = np.where(targets == self.ignore_index, 0, targets)
        check_targets(targets, outputs, "cross_entropy", name)

    def check_classes(self, classes: int) -> int:
        """``classes``, the size of the outputs' last axis; a ConfigError unless the class
        weights have one entry per class."""
        if self.class_weights is not None and len(self.class_weights) != classes:
            raise ConfigError(
                f"CrossEntropy: class_weights has {len(self.class_weights)} entries, but the "
                f"outputs have {classes} classes; give one weight per class"
            )
        return classes

    def _classes(self, outputs: Array) -> int:
        return self.check_classes(int(ops.shape(outputs)[-1]))

    def _labels(self, outputs: Array, targets: Array, classes: int) -> tuple[Array, Any, Any]:
        """``(labels safe to index with, positions kept, labels out of range)``: one label
        per position of the outputs, ignored and wrong ones read as class 0."""
        kind = ops.dtype(targets)
        if not kind.startswith(("int", "uint")):
            raise DataError(
                f"CrossEntropy takes integer class labels, got targets of dtype {kind}"
                + ("" if self.ignore_index is None else " with an ignore_index")
            )
        labels = ops.reshape(targets, ops.shape(outputs)[:-1])
        inside = ops.logical_and(ops.greater(labels, -1), ops.less(labels, classes))
        if self.ignore_index is None:
            kept, wrong = inside, ops.logical_not(inside)
        else:
            counted = ops.logical_not(ops.equal(labels, self.ignore_index))
            kept = ops.logical_and(inside, counted)
            wrong = ops.logical_and(ops.logical_not(inside), counted)
        return ops.where(kept, labels, ops.zeros_like(labels)), kept, wrong

    def _weights(self, outputs: Array) -> Array | None:
        if self.class_weights is None:
            return None
        return ops.asarray(np.asarray(self.class_weights), ops.dtype(outputs))


@final
@dataclasses.dataclass(frozen=True)
class BinaryCrossEntropyWithLogits(AbstractLoss, type_name="binary_cross_entropy_with_logits"):
    """Sigmoid cross-entropy of logits against targets in [0, 1] of the outputs' shape
    (``torch.nn.BCEWithLogitsLoss``): ``softplus(x) - x * y`` per value, without overflow;
    each example's value is the mean over its outputs, the batch's loss their mean.

    Examples:
        >>> import numpy as np
        >>> loss = BinaryCrossEntropyWithLogits()
        >>> round(float(loss.reference(np.zeros((2, 1)), np.array([[1.0], [0.0]]))), 6)
        0.693147
    """

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """The mean over each example's outputs of ``softplus(x) - x * y``."""
        y = targets_like(targets, outputs)
        return mean_per_example(ops.softplus(outputs) - outputs * y)


@final
@dataclasses.dataclass(frozen=True)
class KLDivergence(AbstractLoss, type_name="kl_divergence"):
    """``KL(targets || softmax(outputs))``: targets are probabilities over the last axis, the
    outputs logits (log-probabilities work as they are: ``log_softmax`` leaves them
    unchanged).

    Per position ``sum_c t_c * (log t_c - log_softmax(x)_c)`` with ``0 * log 0 = 0``; the
    batch's loss is the mean over positions. That is torch's
    ``F.kl_div(F.log_softmax(x, -1), t, reduction="batchmean")`` for ``(N, C)`` outputs (the
    mathematical KL divergence; torch's ``"mean"`` divides by ``N * C`` as well), and Keras'
    ``KLDivergence`` given ``softmax(x)``.

    Examples:
        >>> import numpy as np
        >>> loss = KLDivergence()
        >>> float(loss.reference(np.log([[0.5, 0.5]]), np.array([[0.5, 0.5]])))
        0.0
    """

    def per_example(self, outputs: Array, targets: Array) -> Array:
        """``sum_c t_c * (log t_c - log q_c)`` over the last axis."""
        t = targets_like(targets, outputs)
        positive = ops.greater(t, 0.0)
        zero = ops.zeros_like(t)
        entropy_term = ops.where(positive, t * ops.log(ops.where(positive, t, zero + 1.0)), zero)
        return ops.sum(entropy_term - t * ops.log_softmax(outputs, -1), -1)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and _plain(value) and math.isfinite(value)


def _plain(value: Any) -> bool:
    return not isinstance(value, bool)
