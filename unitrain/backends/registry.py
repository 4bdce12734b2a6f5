"""Find a backend by name, by ``package.module:Class``, or through the entry-point group.

The built-in backends are registered in the ``unitrain.backends`` entry-point group exactly as
a third party's would be. The table below only repeats them for a source checkout that was
never pip-installed (no entry-point metadata), and to name the pip extra of each framework.
Nothing here imports a framework until a backend is actually requested.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import importlib.util
import os
from typing import Any

from unitrain._errors import BackendNotFoundError, ConfigError, MissingFrameworkError

__all__ = [
    "BackendInfo",
    "DEFAULT_ORDER",
    "ENTRY_POINT_GROUP",
    "default_backend_name",
    "get_backend",
    "list_backends",
]

ENTRY_POINT_GROUP = "unitrain.backends"

#: name -> (target, module that must be importable, pip extra)
_BUILTIN: dict[str, tuple[str, str, str]] = {
    "numpy": ("unitrain.backends.numpy:NumpyBackend", "numpy", ""),
    "torch": ("unitrain.backends.torch:TorchBackend", "torch", "torch"),
    "jax": ("unitrain.backends.jax:JaxBackend", "jax", "jax"),
    "tensorflow": ("unitrain.backends.tensorflow:TensorFlowBackend", "tensorflow", "tensorflow"),
}

#: Without --backend or UNITRAIN_BACKEND, the first installed of these is used.
DEFAULT_ORDER = ("torch", "jax", "tensorflow", "numpy")


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """One registered backend: where it lives and whether its framework is installed."""

    name: str
    target: str
    installed: bool
    framework_version: str | None


def _entry_points() -> dict[str, str]:
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {ep.name: ep.value for ep in found}


def _targets() -> dict[str, str]:
    targets = {name: target for name, (target, _, _) in _BUILTIN.items()}
    targets.update(_entry_points())
    return targets


def _framework_installed(name: str) -> bool:
    return name not in _BUILTIN or importlib.util.find_spec(_BUILTIN[name][1]) is not None


def _framework_version(name: str) -> str | None:
    if name not in _BUILTIN:
        return None
    module = _BUILTIN[name][1]
    try:
        return importlib.metadata.version("tensorflow-cpu" if module == "tensorflow" else module)
    except importlib.metadata.PackageNotFoundError:
        try:
            return importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            return None


def list_backends() -> list[BackendInfo]:
    """Every backend known by name, built in or registered through entry points."""
    return [
        BackendInfo(name, target, _framework_installed(name), _framework_version(name))
        for name, target in sorted(_targets().items())
    ]


def default_backend_name() -> str:
    """``UNITRAIN_BACKEND`` if set, else the first installed of :data:`DEFAULT_ORDER`."""
    chosen = os.environ.get("UNITRAIN_BACKEND", "").strip()
    if chosen:
        return chosen
    return next(name for name in DEFAULT_ORDER if _framework_installed(name))


def _load_target(target: str, label: str) -> Any:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"backend {label!r} must look like 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        for name, (_, framework, extra) in _BUILTIN.items():
            if missing == framework and extra:
                raise MissingFrameworkError(
                    f"the {name!r} backend needs {framework}, which is not installed; "
                    f"install it with: pip install 'unitrain[{extra}]'"
                ) from None
        raise BackendNotFoundError(
            f"cannot import module {module_name!r} for backend {label!r}: {error}"
        ) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise BackendNotFoundError(
            f"module {module_name!r} has no attribute {attribute!r} (backend {label!r})"
        ) from None


def get_backend(spec: str | type | None = None) -> type:
    """Return the backend class named by ``spec``.

    Args:
        spec: a registered name (``"torch"``), ``"package.module:Class"``, a class, or None for
            :func:`default_backend_name`.

    Returns:
        The backend class; build it with ``cls(model, BackendOptions(...))``.

    Raises:
        BackendNotFoundError: no such backend (the message lists the known ones and the
            closest name).
        MissingFrameworkError: the backend's framework is missing (the message names the pip
            extra).
    """
    if isinstance(spec, type):
        return spec
    name = default_backend_name() if spec is None else spec
    if not isinstance(name, str) or not name:
        raise BackendNotFoundError(f"a backend is named by a non-empty string, got {spec!r}")
    if ":" in name:
        return _load_target(name, name)
    targets = _targets()
    if name not in targets:
        close = difflib.get_close_matches(name, targets, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise BackendNotFoundError(
            f"unknown backend {name!r}; known backends: {', '.join(sorted(targets))}.{hint} "
            "A third-party backend can also be named as 'package.module:Class'."
        )
    return _load_target(targets[name], name)
