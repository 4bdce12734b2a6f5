"""The field check shared by every type registry that rebuilds a dataclass from a dict."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from unitrain._errors import ConfigError

__all__ = ["check_fields"]


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
        )
    if missing := sorted(required - given):
        raise ConfigError(
            f"{what} is missing field(s) {', '.join(missing)}; its fields are: {expected}"
        )
