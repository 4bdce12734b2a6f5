"""Which backend's ops the portable functions of :mod:`unitrain.ops` call right now.

An adapter runs portable code (a layer's forward, a loss) inside ``using(its ops module)``;
the choice lives in a :class:`contextvars.ContextVar`, so two backends in one process (the kit
comparing one against the reference, ``unitrain compare``) and threads never see each other's.
Tracing under ``jax.jit`` or ``tf.function`` happens inside the adapter's call, so traced code
sees the right module too.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from unitrain._errors import ConfigError

__all__ = ["active", "current", "enter", "leave", "using"]

_OUTSIDE_MESSAGE = (
    "unitrain.ops was called outside a backend: portable code runs inside the backend that "
    "calls it (a layer's forward, a loss); to call ops yourself, wrap the calls in "
    "`with unitrain.ops.using('numpy'):` (or 'torch', 'jax', 'tensorflow', or a backend's ops "
    "module)"
)


class _Outside:
    """The ops "module" outside a backend: looking up any function on it is the error that
    says how to choose one. A default that fails on use, rather than None checked on every
    call, keeps :func:`current` a plain ``ContextVar.get`` on the hot path."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and hasattr probes get the usual answer
            raise AttributeError(name)
        raise ConfigError(_OUTSIDE_MESSAGE)


_OUTSIDE: Any = _Outside()
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("unitrain_ops", default=_OUTSIDE)

#: The ops module in use, or a stand-in whose every function raises the error :func:`active`
#: raises: what the contract's functions call (a C-level call, no Python frame of its own).
current = _ACTIVE.get


def active() -> ModuleType:
    """The ops module in use; an error that says how to choose one when none is."""
    module = _ACTIVE.get()
    if module is _OUTSIDE:
        raise ConfigError(_OUTSIDE_MESSAGE)
    result: ModuleType = module
    return result


def resolve(backend: str | ModuleType | Any) -> ModuleType:
    """An ops module from a backend's name (as ``get_backend`` takes it), an ops module, or a
    backend class whose ``ops`` attribute is its ops module."""
    if isinstance(backend, ModuleType):
        return backend
    if isinstance(backend, str):
        return _by_name(backend)
    module = getattr(backend, "ops", None)
    if isinstance(module, ModuleType):
        return module
    raise ConfigError(
        f"{backend!r} offers no ops module; pass a backend name, an ops module or a backend "
        "class whose `ops` attribute is its ops module"
    )


def enter(module: ModuleType) -> contextvars.Token[Any]:
    """Make ``module`` the active ops until :func:`leave` (for an adapter's hot path, where
    :func:`using`'s context manager would cost a microsecond or two per call)."""
    return _ACTIVE.set(module)


def leave(token: contextvars.Token[Any]) -> None:
    """Undo the :func:`enter` that gave ``token``."""
    _ACTIVE.reset(token)


@functools.cache
def _by_name(name: str) -> ModuleType:
    """The ops module of the backend called ``name``, looked up once: finding a backend by
    name reads the installed packages' entry points (milliseconds)."""
    from unitrain.backends.registry import get_backend

    return resolve(get_backend(name))


@contextlib.contextmanager
def using(backend: str | ModuleType | Any) -> Iterator[ModuleType]:
    """Run the portable ops of this block on ``backend`` (name, module or backend class).

    Examples:
        >>> import numpy as np
        >>> from unitrain import ops
        >>> with ops.using("numpy"):
        ...     print(ops.sum(ops.exp(np.zeros(3))))
        3.0
    """
    token = _ACTIVE.set(resolve(backend))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)
