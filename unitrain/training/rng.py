"""Seeding and saving the global random generators that user code might draw from.

unitrain itself draws nothing from global state: data order comes from ``(seed, epoch)`` and
dropout from ``(seed, step, micro_batch)``. The global generators of Python and numpy (and
the backend's, through the backend) are still seeded and saved in checkpoints, because a
user's augmentation or callback may use them, and a resumed run must continue their streams.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = ["get_rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's and numpy's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)


def get_rng_state() -> dict[str, Any]:
    """The global generators' states as JSON-serialisable data."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy form is always a tuple with an array
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, np.uint32), position, has_gauss, cached))
