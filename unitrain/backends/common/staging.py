"""Batches staged on the device one ahead of the step that uses them.

A device copy issued before the current step is dispatched overlaps that step, where a copy
issued by the step itself runs in line with it. Every adapter's prefetch is this loop around
its own way of staging one batch (``jax.device_put``, an eager TensorFlow copy, a CUDA copy
on a side stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["one_ahead"]

In = TypeVar("In")
Out = TypeVar("Out")


def one_ahead(items: Iterable[In], stage: Callable[[In], Out]) -> Iterator[Out]:
    """``stage(item)`` for each item, in order, each staged before the previous one is
    yielded: while the consumer works on item ``k``, item ``k + 1``'s staging is under way.

    >>> staged = []
    >>> for value in one_ahead(range(3), lambda i: staged.append(i) or i):
    ...     print(value, staged)
    0 [0, 1]
    1 [0, 1, 2]
    2 [0, 1, 2]
    """
    iterator = iter(items)
    for first in iterator:
        staged = stage(first)
        break
    else:
        return
    for upcoming in iterator:
        current, staged = staged, stage(upcoming)
        yield current
    yield staged
