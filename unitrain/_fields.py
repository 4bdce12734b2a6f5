"""The type registry shared by optimizers, schedules and layers: dataclasses that name
themselves in their class statement and are rebuilt from ``{"type": name, **fields}``."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from unitrain._errors import ConfigError

__all__ = ["TypeRegistry", "check_fields", "did_you_mean"]

_T = TypeVar("_T")


class TypeRegistry(Generic[_T]):
    """One family's classes by type name (``"sgd"``, ``"cosine_decay"``, ``"conv2d"``).

    A family's base class calls :meth:`register` from ``__init_subclass__``, and its
    ``from_dict`` calls :meth:`lookup` for the class and the checked fields.

    Args:
        family: how messages name the family's types (``"optimizer"``, ...).
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._types: dict[str, type[_T]] = {}

    def register(self, cls: type[_T], type_name: str) -> None:
        """Record ``cls`` under ``type_name`` and set its ``type_name`` attribute."""
        if type_name in self._types:
            raise TypeError(f"{self.family} type name {type_name!r} is already taken")
        cls.type_name = type_name  # type: ignore[attr-defined]
        self._types[type_name] = cls

    def types(self) -> dict[str, type[_T]]:
        """The registered classes by type name (a copy)."""
        return dict(self._types)

    def lookup(self, data: Any, caller: str) -> tuple[type[_T], dict[str, Any]]:
        """The class ``data["type"]`` names and ``data``'s other entries, both checked.

        Raises:
            ConfigError: ``data`` is not a dict, its type is unknown, or a field is missing
                or unknown (``caller`` names the function in the first message).
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{caller}: expected a dict with a 'type' key, got {data!r}")
        name = data.get("type")
        if not isinstance(name, str) or name not in self._types:
            known = ", ".join(sorted(self._types))
            raise ConfigError(f"unknown {self.family} type {name!r}; known types: {known}")
        cls = self._types[name]
        check_fields(cls, data, f"{self.family} type {name!r}")
        return cls, {key: value for key, value in data.items() if key != "type"}


def check_fields(cls: type, data: Mapping[str, Any], what: str) -> None:
    """Raise :class:`ConfigError` unless ``data`` (less its ``"type"``) fits ``cls``'s fields.

    Args:
        cls: the dataclass to be built.
        data: ``{"type": name, **fields}``.
        what: how the message names the type, e.g. ``"schedule type 'constant'"``.

    Examples:
        >>> @dataclasses.dataclass
        ... class Point:
        ...     x: int
        ...     y: int = 0
        >>> check_fields(Point, {"type": "point", "x": 1}, "type 'point'")
        >>> check_fields(Point, {"type": "point", "z": 1}, "type 'point'")
        Traceback (most recent call last):
        ...
        unitrain._errors.ConfigError: type 'point' has no field(s) z; its fields are: x, y
    """
    fields = [f for f in dataclasses.fields(cls) if f.init]
    allowed = {f.name for f in fields}
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    given = set(data) - {"type"}
    expected = ", ".join(f.name for f in fields)
    if unknown := sorted(given - allowed):
        raise ConfigError(
            f"{what} has no field(s) {', '.join(unknown)}; its fields are: {expected}"
            + did_you_mean(unknown[0], [f.name for f in fields])
        )
    if missing := sorted(required - given):
        raise ConfigError(
            f"{what} is missing field(s) {', '.join(missing)}; its fields are: {expected}"
        )


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """A hint naming the choice closest to a misspelt ``name``, or ``""`` when none is close.

    A list of twenty field names makes the reader search for the one they meant; the closest
    one, named, is what they almost always meant (``epoch`` for ``epochs``).

    Examples:
        >>> did_you_mean("epoch", ["batch_size", "epochs", "seed"])
        " (did you mean 'epochs'?)"
        >>> did_you_mean("xyz", ["batch_size", "epochs"])
        ''
    """
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
