"""The type names the contract's signatures use (every backend's ops module imports them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: An array of the running backend (a numpy array, a torch tensor, a jax array, ...).
Array = Any
#: An axis, several axes, or None for all of them.
Axis = int | tuple[int, ...] | None
#: An int for every spatial axis alike, or one per spatial axis.
Pairish = int | Sequence[int]
