"""The one list of backends the tests run over; a missing framework is a visible skip."""

from __future__ import annotations

import importlib.util

import pytest

#: Every built-in backend with the module its framework is imported as.
FRAMEWORKS = {"numpy": "numpy", "torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}


def backend_param(name: str):
    """``name`` as a pytest param, skipped with a reason when its framework is not installed."""
    module = FRAMEWORKS[name]
    if importlib.util.find_spec(module) is None:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{module} is not installed"))
    return name


def backends(*names: str) -> list:
    """Params for ``names`` (default: all built-in backends)."""
    return [backend_param(n) for n in (names or tuple(FRAMEWORKS))]


def installed(*names: str) -> list[str]:
    """The names (default: all built-in backends) whose framework is installed, for tests
    that combine backends (pairs, cross-backend tables) rather than parametrize over one."""
    chosen = names or tuple(FRAMEWORKS)
    return [n for n in chosen if importlib.util.find_spec(FRAMEWORKS[n]) is not None]
