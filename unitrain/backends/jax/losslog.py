"""Per-update losses kept in a device buffer that the jitted update writes into.

Returning each update's loss as an output of its own costs a fresh device buffer per call,
and reading many of them back costs a conversion each. Instead the fused update writes its
loss into slot ``cursor`` of a float32 buffer of :data:`SIZE` slots carried (and donated) in
the device state, advances the cursor modulo :data:`SIZE`, and returns nothing extra. On the
W2 benchmark step (32-64-10 MLP) that is ~2.5 µs of ~30.

The host mirrors the cursor, so it knows which slot an update wrote without reading the
device, and hands out a :class:`LossRef` (page, slot) per update. A page is the buffer's
contents between two wraps: when the host cursor comes back to zero, the buffer in the state
is *sealed* (kept, no longer donated) and a fresh one takes its place, so no slot is ever
written twice and a reference stays valid for as long as it is held. Reading any number of
references costs one transfer per page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

__all__ = ["SIZE", "LossLog", "LossRef"]

#: Slots per page: the device buffer is 1 KiB; a sealed page is held (then as host memory)
#: only while references to it are.
SIZE = 256


class _Page:
    """One buffer's worth of slots; ``sealed`` holds the device buffer once it is full."""

    __slots__ = ("_host", "sealed")

    def __init__(self) -> None:
        self.sealed: Any = None
        self._host: np.ndarray | None = None

    def host(self) -> np.ndarray:
        if self._host is None:
            self._host, self.sealed = np.asarray(self.sealed), None
        return self._host


class LossRef(tuple[Any, ...]):
    """The training loss of one update, read on demand: ``float(ref)``, ``numpy.asarray(ref)``.

    Reading waits for that update (and those before it) to finish, like reading a device array.
    A ``(log, page, slot)`` tuple underneath: built in C, one is made per update.
    """

    __slots__ = ()

    def __float__(self) -> float:
        return float(self[0].read([self])[0])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self[0].read([self])[0], dtype=dtype)

    def __repr__(self) -> str:
        return f"LossRef({float(self)!r})"


class LossLog:
    """The host side of the log: hands out references and reads them back.

    Args:
        live: returns the buffer now in the device state (the current page's contents).
        fresh: returns a new zeroed device buffer of :data:`SIZE` float32 slots.
    """

    def __init__(self, live: Callable[[], Any], fresh: Callable[[], Any]) -> None:
        self._live, self._fresh = live, fresh
        self._page = _Page()
        #: The slot the next update writes; :data:`SIZE` when the page is full.
        self.cursor = 0

    def turn_page(self) -> Any:
        """Seal the full current page; return the fresh buffer to put in the state instead."""
        self._page.sealed = self._live()
        self._page, self.cursor = _Page(), 0
        return self._fresh()

    def next_ref(self) -> LossRef:
        """The reference to slot :attr:`cursor`, which the update just made wrote."""
        ref = LossRef((self, self._page, self.cursor))
        self.cursor += 1
        return ref

    def read(self, refs: Iterable[LossRef]) -> list[np.float32]:
        """The values of ``refs``: one transfer for the current page, one per sealed page."""
        live: np.ndarray | None = None
        values = []
        for _, page, index in refs:
            if page is self._page:
                if live is None:
                    live = np.asarray(self._live())
                values.append(live[index])
            else:
                values.append(page.host()[index])
        return values

    def read_values(self, values: list[Any], on_cpu: bool) -> list[Any]:
        """Many values on the host, in order: :class:`LossRef` s from this log, one transfer
        per page; other device values one by one on the CPU (~0.5 µs each, where
        ``jax.device_get``'s batched path costs ~4 µs), and in one batched ``device_get`` on
        an accelerator."""
        refs = [v for v in values if type(v) is LossRef]
        if len(refs) == len(values):
            return self.read(refs)
        read: Iterator[Any] = iter(self.read(refs))
        others = [v for v in values if type(v) is not LossRef]
        converted = iter([np.asarray(v) for v in others] if on_cpu else jax.device_get(others))
        return [next(read if type(v) is LossRef else converted) for v in values]
