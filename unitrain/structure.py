"""Structured batches: inputs, targets and outputs that are arrays, tuples or dicts of arrays.

A batch is ``(inputs, targets)`` or ``(inputs, targets, sample_weight)``; inputs, targets and
a model's outputs may each be one array or a tuple or dict of them, nested (a pytree). Every
leaf holds examples on its first axis. A list is one array, as ``numpy.asarray`` reads it (so
``[[0.0, 1.0], ...]`` stays the data it always was). These helpers walk structures the way
``jax.tree_util`` and ``tf.nest`` do: tuples in order, dicts by sorted key, so "the first
leaf" is the same on every backend. They import no framework: a leaf may be a numpy
array or any framework's tensor (``len`` and slicing are all they use of it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from unitrain._errors import DataError

__all__ = [
    "batch_weight",
    "first_leaf",
    "is_plain_pair",
    "is_structured",
    "leaves",
    "map_leaves",
    "num_examples",
    "STRUCTURES",
    "slice_rows",
    "split_batch",
]


#: What holds several arrays. A check of these two builtins costs tens of nanoseconds, where one
#: against the ``Mapping`` ABC costs a microsecond: the plain path tests every batch.
STRUCTURES = (tuple, dict)


def is_structured(tree: Any) -> bool:
    """Whether ``tree`` is a tuple or dict (of arrays) rather than one array."""
    return isinstance(tree, STRUCTURES)


def is_plain_pair(batch: Any) -> bool:
    """Whether ``batch`` is the plain ``(x, y)``: two parts, each one array. Every fast path
    (a backend's conversion, its device prefetch, a worker's slice) tests batches with this."""
    return len(batch) == 2 and not (is_structured(batch[0]) or is_structured(batch[1]))


def leaves(tree: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of ``tree`` with its path (``"[0]"``, ``"['mask']"``), dicts by sorted key.

    Examples:
        >>> [path for path, _ in leaves({"b": 1, "a": (2, 3)})]
        ["['a'][0]", "['a'][1]", "['b']"]
    """
    if isinstance(tree, dict):
        for key in sorted(tree):
            yield from leaves(tree[key], f"{path}[{key!r}]")
    elif isinstance(tree, tuple):
        for index, item in enumerate(tree):
            yield from leaves(item, f"{path}[{index}]")
    else:
        yield path, tree


def map_leaves(function: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``function`` applied to every leaf; dicts stay dicts, tuples tuples."""
    if isinstance(tree, dict):
        return {key: map_leaves(function, value) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(map_leaves(function, item) for item in tree)
    return function(tree)


def first_leaf(tree: Any) -> Any:
    """The first leaf of ``tree`` (element 0 of a tuple, the smallest key of a dict).

    Raises:
        DataError: ``tree`` holds no array.
    """
    if not isinstance(tree, STRUCTURES):
        return tree
    for _, leaf in leaves(tree):
        return leaf
    raise DataError(f"an empty structure {tree!r} holds no array; give it at least one")


def num_examples(batch: Any) -> int:
    """The number of examples of a batch: the length of its inputs' first leaf."""
    inputs = batch[0]
    return len(first_leaf(inputs) if isinstance(inputs, STRUCTURES) else inputs)


def batch_weight(batch: Any) -> float:
    """How much a batch counts in an update's mean: its sample weights' sum when it has
    them, else its number of examples."""
    if len(batch) == 3 and batch[2] is not None:
        import numpy as np  # only weighted batches pay for it

        return float(np.sum(np.asarray(batch[2], np.float64)))
    return num_examples(batch)


def slice_rows(tree: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of every leaf of ``tree`` (numpy arrays or framework tensors)."""
    if not is_structured(tree):
        return tree[start:stop]
    return map_leaves(lambda leaf: leaf[start:stop], tree)


def split_batch(batch: Any) -> tuple[Any, Any, Any]:
    """``(inputs, targets, sample_weight)`` of a batch of two or three parts (weight None).

    Raises:
        DataError: the batch is not a tuple of two or three parts.
    """
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        return batch[0], batch[1], batch[2] if len(batch) == 3 else None
    raise DataError(
        "a batch is (inputs, targets) or (inputs, targets, sample_weight), got "
        f"{type(batch).__name__}"
        + (f" of {len(batch)} parts" if isinstance(batch, (tuple, list)) else "")
        + "; yield one of those from the loader"
    )
