"""What a recipe given as data may name: registered types, and paths inside the run folder.

A TOML recipe or a ``--set`` assignment is data, so it names only registered types: the
built-in ones, and those an installed package registers in the entry-point group of the part's
kind, for example in the package's ``pyproject.toml``::

    [project.entry-points."unitrain.callbacks"]
    stop_early = "my_package.callbacks:StopEarly"

    [project.entry-points."unitrain.data"]
    my_data = "my_package.data:MyData"

Naming any other class as ``"package.module:Class"`` imports a module and calls into it, so it
is refused, before anything is imported, unless imports are allowed (``--allow-imports``,
``load_recipe(..., allow_imports=True)``). Models, optimizers, schedules and metrics are looked
up in closed registries and never import anything. Logger and checkpoint paths stay inside
the run folder (relative, no ``..``) unless ``--allow-absolute-paths`` allows them elsewhere.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Any

from unitrain._errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUPS",
    "PATH_FIELDS",
    "check_recipe_data",
    "entry_point_types",
    "imported_type",
]

#: The entry-point group in which an installed package registers types of each part kind.
ENTRY_POINT_GROUPS = {"callback": "unitrain.callbacks", "data": "unitrain.data"}

#: Callback arguments that name where a logger or checkpoint writes.
PATH_FIELDS = ("path", "log_dir", "dirpath")


def entry_point_types(group: str) -> dict[str, str]:
    """Types installed packages register in ``group``: name -> ``"package.module:Class"``."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}


def _check_import_allowed(name: str, kind: str, registered: Mapping[str, str]) -> None:
    """Refuse a ``package.module:Class`` type that no installed package registered."""
    if name in registered or name in registered.values():
        return  # the package's own entry point vouches for it
    group = ENTRY_POINT_GROUPS[kind]
    raise ConfigError(
        f"{kind} type {name!r} is not a registered type, and naming 'package.module:Class' "
        "would import and run code; a recipe given as data (TOML or --set) names registered "
        "types only. If you trust that code, pass --allow-imports (load_recipe(..., "
        f"allow_imports=True)), register the class in the {group!r} entry-point group, or "
        "write a Python recipe, which is code"
    )


def imported_type(name: str, kind: str, *, built_in: Iterable[str], allow_imports: bool) -> Any:
    """The class a type that is not built in names: an entry point's, or ``module:Class``.

    Args:
        name: the ``type`` given (a built-in name was looked up by the caller already).
        kind: ``"callback"`` or ``"data"``: picks the entry-point group and names the error.
        built_in: the kind's built-in names, listed when ``name`` is unknown.
        allow_imports: import an unregistered ``"package.module:Class"`` as asked.

    Raises:
        ConfigError: the type is unknown, is an unregistered ``module:Class`` while imports
            are not allowed (checked before anything is imported), or cannot be imported.
    """
    group = ENTRY_POINT_GROUPS[kind]
    registered = entry_point_types(group)
    target = registered.get(name, name)
    if ":" not in target:
        raise ConfigError(
            f"unknown {kind} type {name!r}; built in: {sorted(built_in)}; registered through "
            f"the {group!r} entry points: {sorted(registered)}. A class of your own is named "
            "'package.module:Class' (with --allow-imports) or registered as such an entry point"
        )
    if not allow_imports:
        _check_import_allowed(name, kind, registered)
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{kind} type {name!r} cannot be imported: {error}") from None


def _check_path(value: Any, where: str) -> None:
    if not isinstance(value, str):
        return  # None means the default; any other kind is the part's own error to give
    parts = PurePath(value)
    if parts.anchor or ".." in parts.parts:
        raise ConfigError(
            f"{where} = {value!r}: a path in a recipe given as data must stay inside the run "
            "folder (relative, without '..'); pass --allow-absolute-paths (load_recipe(..., "
            "allow_absolute_paths=True)) to write elsewhere"
        )


def _types(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(kind, type)`` of each part whose type may be imported: the data and the callbacks."""
    callbacks = data.get("callbacks")
    tables = [("data", data.get("data"))]
    tables += [("callback", c) for c in (callbacks if isinstance(callbacks, list) else [])]
    return [(kind, table.get("type")) for kind, table in tables if isinstance(table, Mapping)]


def _paths(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(where, value)`` of each path the recipe writes to, and of its name (its folder)."""
    paths: list[tuple[str, Any]] = [("name", data.get("name"))]
    config = data.get("config")
    if isinstance(config, Mapping):
        paths.append(("config.checkpoint_dir", config.get("checkpoint_dir")))
    callbacks = data.get("callbacks")
    for index, callback in enumerate(callbacks if isinstance(callbacks, list) else []):
        if isinstance(callback, Mapping):
            paths += [(f"callbacks.{index}.{f}", callback.get(f)) for f in PATH_FIELDS]
    return paths


def check_recipe_data(
    data: Mapping[str, Any],
    *,
    allow_imports: bool,
    allow_absolute_paths: bool,
    before: Mapping[str, Any] | None = None,
) -> None:
    """Refuse what a recipe given as data may not do, before any of its parts is built.

    Args:
        data: the recipe's tables, as :func:`unitrain.recipes.recipe_to_dict` writes them.
        allow_imports: let an unregistered ``"package.module:Class"`` type through.
        allow_absolute_paths: let logger and checkpoint paths, and the run's name, point
            outside the run folder.
        before: the same recipe before ``--set`` changed it. Its types and paths need no
            flag again: they came from code (a Python recipe) or passed this check already.
            Only a type counts as a known type, only a path as a known path.

    Raises:
        ConfigError: a type would import code, or a path leaves the run folder.
    """
    known_types = {name for _, name in _types(before or {})}
    known_paths = {value for _, value in _paths(before or {})}
    for kind, name in _types(data):
        if allow_imports or not isinstance(name, str) or ":" not in name:
            continue
        if name not in known_types:
            _check_import_allowed(name, kind, entry_point_types(ENTRY_POINT_GROUPS[kind]))
    if allow_absolute_paths:
        return
    for where, value in _paths(data):
        if value not in known_paths:
            _check_path(value, where)
