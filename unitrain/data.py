"""Batches from numpy arrays with a shuffle order that is a function of ``(seed, epoch)``.

Because the order of epoch ``e`` depends on nothing but ``(seed, e)``, a resumed run reaches
any position ``(epoch, batch)`` directly: it computes that epoch's permutation and slices from
the batch it stopped at, without replaying a single batch. Native loaders (a torch
``DataLoader``, a ``tf.data.Dataset``, any re-iterable) are accepted too; resuming one
mid-epoch skips batches by iterating, which is exact only if the loader's order is itself
reproducible, and unitrain says so in a warning.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from unitrain._errors import ConfigError, DataError
from unitrain.structure import is_structured, leaves, map_leaves, split_batch

if TYPE_CHECKING:
    from unitrain.models import AbstractLayer

__all__ = [
    "ArrayLoader",
    "BatchSource",
    "IterableSource",
    "as_batch_source",
    "check_arrays",
    "check_source",
    "check_structured",
    "check_targets",
]

#: ``(inputs, targets)`` or ``(inputs, targets, sample_weight)``; inputs and targets may each
#: be an array or a tuple or dict of arrays (see :mod:`unitrain.structure`).
Batch = tuple[Any, ...]


@runtime_checkable
class BatchSource(Protocol):  # pragma: no mutate block (isinstance reads its attributes)
    """What the Trainer iterates: the batches of one epoch, from any batch within it."""

    #: Whether ``batches(epoch, start)`` reproduces exactly the batches of an uninterrupted run.
    exact_resume: bool

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Yield the batches of ``epoch`` beginning with batch number ``start``."""
        ...

    def __len__(self) -> int:
        """Number of batches per epoch."""
        ...


def check_arrays(
    inputs: np.ndarray,
    targets: np.ndarray,
    *,
    in_features: int | None = None,
    num_classes: int | None = None,
    model: AbstractLayer | None = None,
    loss: Any = None,
    name: str = "data",
) -> None:
    """Raise :class:`DataError` if the arrays cannot be trained on, saying what to fix.

    Args:
        inputs: array whose first axis indexes examples.
        targets: labels or regression targets, same first axis.
        in_features: expected size of an input's last axis, when the model is known.
        num_classes: for classification, labels must be ints in ``[0, num_classes)``.
        model: a portable model (:mod:`unitrain.models`): the inputs must fit it (shape,
            token ids) and, for ``loss``, the targets its outputs (see :func:`check_targets`).
        loss: the loss the targets are for, ``"cross_entropy"`` or ``"mse"``; any other
            (a native loss) leaves the targets unchecked.
        name: what to call the data in messages (``"train_data"``, ``"val_data"``).
    """
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    if inputs.ndim == 0 or len(inputs) == 0:
        raise DataError(f"{name} is empty: it has no examples; pass at least one example")
    if len(inputs) != len(targets):
        raise DataError(
            f"{name} is ragged: {len(inputs)} inputs but {len(targets)} targets; "
            "inputs and targets must have the same length"
        )
    for label, array in (("inputs", inputs), ("targets", targets)):
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise DataError(f"{name} {label} contain {bad} NaN or infinite values; clean them")
    _check_fits_model(inputs, targets, in_features, num_classes, model, loss, name)


def _check_structured_fits_model(
    inputs: Any, targets: Any, model: AbstractLayer | None, loss: Any, name: str
) -> None:
    """What depends on the model in a structured batch: the inputs fit it, and plain targets
    fit a loss's check when the outputs are one array."""
    if model is None:
        return
    model.check_input(inputs)
    if is_structured(targets) or not callable(getattr(loss, "check_targets", None)):
        return
    shape = model.output_shape(map_leaves(lambda leaf: tuple(leaf.shape[1:]), inputs))
    if not is_structured(shape) and not getattr(loss, "reads_batch", False):
        loss.check_targets(targets, shape, name)


def _check_fits_model(
    inputs: np.ndarray,
    targets: np.ndarray,
    in_features: int | None,
    num_classes: int | None,
    model: AbstractLayer | None,
    loss: Any,
    name: str,
) -> None:
    """The part of :func:`check_arrays` that depends on the model: inputs, labels, targets."""
    if in_features is not None and (inputs.ndim < 2 or inputs.shape[-1] != in_features):
        raise DataError(
            f"{name} has inputs of shape {inputs.shape[1:]}, but the model expects "
            f"{in_features} features per example"
        )
    if num_classes is not None:
        _check_labels(targets, num_classes, name)
    if model is not None:
        model.check_input(inputs)  # the shape every layer reads, and token ids in range
        if isinstance(loss, str) and loss in _TARGET_CHECKS:
            check_targets(targets, model.output_shape(inputs.shape[1:]), loss, name)
        elif callable(getattr(loss, "check_targets", None)):  # a unitrain.losses loss
            loss.check_targets(targets, model.output_shape(inputs.shape[1:]), name)


def check_targets(
    targets: np.ndarray, outputs: tuple[int, ...], loss: str, name: str = "data"
) -> None:
    """Raise :class:`DataError` unless ``loss`` can compare ``targets`` with the outputs.

    Cross-entropy reads the outputs' last axis as classes: it needs integer labels in
    ``[0, classes)``, one per remaining position (one per example of ``(classes,)`` outputs,
    one per token of a sequence model's ``(length, classes)``). A negative label is refused
    too, where plain indexing would read ``-1`` as the last class. ``mse`` needs targets with
    as many values per example as the outputs have.

    Args:
        targets: labels or regression targets, examples on the first axis.
        outputs: the shape of one example's outputs (``model.output_shape(input_shape)``).
        loss: ``"cross_entropy"`` or ``"mse"``.
        name: what to call the data in messages.

    Examples:
        >>> check_targets(np.array([0, 2, 3]), (3,), "cross_entropy")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._errors.DataError: data has labels in [0, 3], but the model has 3 outputs; ...
        >>> check_targets(np.zeros((4, 2)), (3,), "mse")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._errors.DataError: data has targets of shape (2,) per example, but ...
    """
    _TARGET_CHECKS[loss](np.asarray(targets), tuple(outputs), name)


def _check_labels(targets: np.ndarray, num_classes: int, name: str) -> None:
    """Integer labels in ``[0, num_classes)``."""
    if targets.dtype.kind not in "iu":
        raise DataError(
            f"{name} targets must be integer class labels for cross-entropy, "
            f"got dtype {targets.dtype}"
        )
    if not targets.size:
        return
    low, high = int(targets.min()), int(targets.max())
    if low < 0 or high >= num_classes:
        raise DataError(
            f"{name} has labels in [{low}, {high}], but the model has {num_classes} "
            f"outputs; labels must be in [0, {num_classes - 1}]"
        )


def _check_class_labels(targets: np.ndarray, outputs: tuple[int, ...], name: str) -> None:
    if targets.dtype.kind in "iu" and _per_example(targets) != math.prod(outputs[:-1]):
        raise DataError(
            f"{name} has targets of shape {targets.shape[1:]} per example, but the model "
            f"gives outputs of shape {outputs} per example; cross-entropy needs one label "
            f"per position, of shape {outputs[:-1]}"
        )
    _check_labels(targets, outputs[-1], name)


def _check_regression_targets(targets: np.ndarray, outputs: tuple[int, ...], name: str) -> None:
    # The backends reshape the targets to the outputs' shape, so only the size must agree.
    if _per_example(targets) != math.prod(outputs):
        hint = (
            "; these look like class labels: use loss='cross_entropy', or one-hot float targets"
            if targets.dtype.kind in "iub"
            else ""
        )
        raise DataError(
            f"{name} has targets of shape {targets.shape[1:]} per example, but the model "
            f"gives outputs of shape {outputs} per example; mse needs targets of the "
            f"outputs' shape{hint}"
        )


def _per_example(targets: np.ndarray) -> int:
    return math.prod(targets.shape[1:])


#: The target check of each built-in loss (a native loss checks its own targets).
_TARGET_CHECKS = {"cross_entropy": _check_class_labels, "mse": _check_regression_targets}


def check_structured(inputs: Any, targets: Any, sample_weight: Any, name: str = "data") -> int:
    """Raise :class:`DataError` unless every leaf of a structured batch is a numeric array of
    finite values with the same number of examples; return that number.

    Args:
        inputs: an array or a tuple or dict of arrays.
        targets: likewise.
        sample_weight: one finite weight >= 0 per example, or None.
        name: what to call the data in messages.

    Examples:
        >>> check_structured({"a": np.zeros((3, 2)), "b": np.zeros((2, 1))}, np.zeros(3),
        ...                  None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._errors.DataError: data is ragged: inputs['b'] has 2 examples, but ...
    """
    parts = [("inputs", inputs), ("targets", targets)]
    if sample_weight is not None:
        parts.append(("sample_weight", sample_weight))
    length, first = None, ""
    for label, part in parts:
        for path, leaf in leaves(part):
            where = f"{label}{path}"
            array = np.asarray(leaf)
            if array.dtype.kind not in "biuf":
                raise DataError(
                    f"{name} {where} holds dtype {array.dtype}, not numbers; every leaf of a "
                    "batch must be an array of numbers"
                )
            if array.ndim == 0:
                raise DataError(
                    f"{name} {where} is a scalar; every leaf needs the examples on its first axis"
                )
            if length is None:
                length, first = len(array), where
            elif len(array) != length:
                raise DataError(
                    f"{name} is ragged: {where} has {len(array)} examples, but {first} has "
                    f"{length}; every array of inputs, targets and sample_weight must have "
                    "the same length"
                )
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                bad = int(np.count_nonzero(~np.isfinite(array)))
                raise DataError(f"{name} {where} contains {bad} NaN or infinite values; clean it")
    if not length:
        raise DataError(f"{name} is empty: it has no examples; pass at least one example")
    if sample_weight is not None and (np.ndim(sample_weight) != 1 or np.min(sample_weight) < 0):
        raise DataError(
            f"{name} sample_weight must be one weight >= 0 per example, shape ({length},), got "
            f"shape {np.shape(sample_weight)} with minimum {np.min(sample_weight)}"
        )
    return length


def check_source(
    source: BatchSource,
    *,
    in_features: int | None = None,
    num_classes: int | None = None,
    model: AbstractLayer | None = None,
    loss: Any = None,
    name: str = "data",
) -> None:
    """Raise :class:`DataError` if ``source`` cannot be trained on, before any training.

    An :class:`ArrayLoader` checked its arrays whole when it was built (lengths, NaN and
    infinite values), so only what depends on the model is checked here, over all its
    examples: reading a large training set once more would cost as much as that first check.
    A native loader is checked on its first batch only: the usual mistakes (feature size,
    label range, an empty loader) show there, and reading one batch costs little where
    checking every batch would cost a host sync per step. Batches that are not a pair of
    host arrays (GPU tensors, dicts) are left to the backend. Other sources are not checked.
    The arguments are those of :func:`check_arrays`.

    Examples:
        >>> batches = [(np.zeros((2, 3)), np.array([0, 5]))]
        >>> check_source(IterableSource(batches), num_classes=4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unitrain._errors.DataError: the first batch of data has labels in [0, 5], but ...
    """
    if isinstance(source, ArrayLoader) and source.structured:
        _check_structured_fits_model(source.inputs, source.targets, model, loss, name)
    elif isinstance(source, ArrayLoader):
        inputs, targets = source.inputs, source.targets
        _check_fits_model(inputs, targets, in_features, num_classes, model, loss, name)
    elif isinstance(source, IterableSource):
        batch = next(iter(source.iterable), None)
        if batch is None:
            raise DataError(f"{name} yielded no batches; pass at least one example")
        if isinstance(batch, (tuple, list)) and len(batch) != 2:
            split_batch(batch)  # two or three parts, or a DataError saying so
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            return
        try:
            inputs, targets = np.asarray(batch[0]), np.asarray(batch[1])
        except (TypeError, ValueError, RuntimeError):  # device tensors, ragged lists
            return
        if inputs.dtype == object or targets.dtype == object:
            return
        check_arrays(
            inputs,
            targets,
            in_features=in_features,
            num_classes=num_classes,
            model=model,
            loss=loss,
            name=f"the first batch of {name}",
        )


class ArrayLoader:
    """Mini-batches of in-memory arrays, shuffled per epoch from ``(seed, epoch)``.

    Args:
        inputs: array of examples (first axis).
        targets: array of targets with the same first axis.
        batch_size: examples per batch.
        shuffle: permute the examples every epoch.
        seed: seed of the shuffle; the permutation of epoch ``e`` is a pure function of
            ``(seed, e)``.
        drop_last: drop the final batch when it would be smaller than ``batch_size``.
        name: what to call the data in error messages (``"train_data"``, ``"val_data"``).
        sample_weight: one weight >= 0 per example, or None; batches then are
            ``(inputs, targets, sample_weight)``.

    ``inputs`` and ``targets`` may each be an array or a tuple or dict of arrays (several
    inputs, an attention mask, several targets): every leaf holds the examples on its first
    axis, and every leaf is shuffled and sliced alike.

    Examples:
        >>> loader = ArrayLoader(np.arange(10.0)[:, None], np.arange(10), batch_size=4)
        >>> len(loader), [len(x) for x, _ in loader.batches(epoch=0)]
        (3, [4, 4, 2])
        >>> [y.tolist() for _, y in loader.batches(0, start=2)] == [
        ...     y.tolist() for _, y in list(loader.batches(0))[2:]]
        True
    """

    exact_resume = True

    def __init__(
        self,
        inputs: Any,
        targets: Any,
        batch_size: int = 32,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        name: str = "data",
        sample_weight: Any = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigError(
                f"ArrayLoader: batch_size must be a positive int, got batch_size={batch_size!r}"
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"ArrayLoader: seed must be an int >= 0, got seed={seed!r}")
        #: Whether inputs or targets are structures, or there are sample weights: batches
        #: are then sliced leaf by leaf (plain arrays keep the one-index path).
        self.structured = is_structured(inputs) or is_structured(targets)
        self.structured |= sample_weight is not None
        if self.structured:
            self.inputs, self.targets = (
                map_leaves(np.asarray, inputs),
                map_leaves(np.asarray, targets),
            )
            self.sample_weight = None if sample_weight is None else np.asarray(sample_weight)
            self.num_examples = check_structured(
                self.inputs, self.targets, self.sample_weight, name
            )
        else:
            self.inputs, self.targets = np.asarray(inputs), np.asarray(targets)
            self.sample_weight = None
            check_arrays(self.inputs, self.targets, name=name)
            self.num_examples = len(self.inputs)
        if drop_last and self.num_examples < batch_size:
            raise DataError(
                f"ArrayLoader: drop_last=True with {self.num_examples} examples and "
                f"batch_size={batch_size} leaves no batch; lower batch_size"
            )
        self.batch_size, self.shuffle, self.seed, self.drop_last = (
            batch_size,
            shuffle,
            seed,
            drop_last,
        )

    def __len__(self) -> int:
        full, rest = divmod(self.num_examples, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of example indices used in ``epoch``."""
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Yield the batches of ``epoch`` from batch number ``start`` on, in O(1) to seek."""
        order = self.order(epoch)
        for index in range(start, len(self)):
            chosen = order[index * self.batch_size : (index + 1) * self.batch_size]
            if not self.structured:
                yield self.inputs[chosen], self.targets[chosen]
                continue
            rows: tuple[Any, ...] = (self.inputs, self.targets)
            if self.sample_weight is not None:
                rows += (self.sample_weight,)
            yield tuple(map_leaves(operator.itemgetter(chosen), part) for part in rows)


class IterableSource:
    """Wraps a native loader (any re-iterable of ``(inputs, targets)`` batches).

    Resuming mid-epoch skips ``start`` batches by iterating them: exact only when the
    loader yields the same order every time it is iterated at the same epoch.
    """

    exact_resume = False

    def __init__(self, iterable: Iterable[Batch]) -> None:
        if isinstance(iterable, Iterator):
            raise DataError(
                "a one-shot iterator cannot be iterated once per epoch; pass a re-iterable "
                "(a list, a torch DataLoader, a tf.data.Dataset) or an ArrayLoader"
            )
        self.iterable = iterable

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            return 0

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Yield the loader's batches, skipping the first ``start`` (by iterating them)."""
        if start:
            warnings.warn(
                f"resuming a native loader at batch {start} of epoch {epoch} by skipping "
                "batches; the result equals an uninterrupted run only if the loader's order "
                "is reproducible. Use unitrain.data.ArrayLoader for exact, instant resume.",
                stacklevel=2,
            )
        for index, batch in enumerate(self.iterable):
            if index >= start:
                yield batch


def as_batch_source(
    data: Any, batch_size: int, seed: int, shuffle: bool, name: str = "data"
) -> BatchSource:
    """Turn what a user passes to ``fit`` into a :class:`BatchSource`.

    Accepts a :class:`BatchSource` (used as is), a tuple ``(inputs, targets)`` or
    ``(inputs, targets, sample_weight)`` of arrays (inputs and targets each an array or a
    tuple or dict of arrays; wrapped in an :class:`ArrayLoader`), or a re-iterable of
    batches. ``name`` is what error messages call the data.
    """
    if isinstance(data, BatchSource):
        return data
    if isinstance(data, tuple) and len(data) == 2:
        return ArrayLoader(data[0], data[1], batch_size, shuffle=shuffle, seed=seed, name=name)
    if isinstance(data, tuple) and len(data) == 3:  # with sample weights
        inputs, targets, weight = data
        return ArrayLoader(
            inputs, targets, batch_size, shuffle=shuffle, seed=seed, name=name, sample_weight=weight
        )
    if hasattr(data, "shape"):
        raise DataError(
            f"got one array of shape {data.shape} but no targets; pass (inputs, targets)"
        )
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
        return IterableSource(data)
    raise DataError(
        f"cannot train on {type(data).__name__}: pass (inputs, targets) arrays, an "
        "ArrayLoader, or a re-iterable of (inputs, targets) batches"
    )
