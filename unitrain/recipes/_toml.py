"""TOML for recipe files: read with the standard library (``tomli`` before 3.11), written here.

Recipes hold only tables, arrays of tables, strings, numbers, booleans and lists of those, so
the writer is small. TOML has no null: a None value is left out (it must be the default).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["dumps", "loads", "value"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def loads(text: str, path: Path | None = None) -> dict[str, Any]:
    """Parse TOML text; a syntax error names the file and line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path or 'TOML'}: {error}") from None


def value(text: str) -> Any:
    """One TOML value (``3``, ``0.1``, ``true``, ``[1, 2]``, ``"x"``); other text is a string.

    Examples:
        >>> value("3"), value("[64, 128]"), value("cpu")
        (3, [64, 128], 'cpu')
    """
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def dumps(data: dict[str, Any]) -> str:
    """TOML text for ``data``; ``loads(dumps(data))`` equals ``data`` less its None values.

    Examples:
        >>> print(dumps({"name": "a", "model": {"sizes": [1, 2]}, "cb": [{"type": "x"}]}))
        name = "a"
        <BLANKLINE>
        [model]
        sizes = [1, 2]
        <BLANKLINE>
        [[cb]]
        type = "x"
        <BLANKLINE>
    """
    return "\n".join(_table(data, ())) + "\n"


def _table(data: dict[str, Any], prefix: tuple[str, ...]) -> list[str]:
    lines, tables, arrays = [], [], []
    for key, item in data.items():
        if item is None:
            continue
        if isinstance(item, dict):
            tables.append((key, item))
        elif isinstance(item, list) and item and all(isinstance(i, dict) for i in item):
            arrays.append((key, item))
        else:
            lines.append(f"{_key(key)} = {_value(item, (*prefix, key))}")
    for key, table in tables:
        lines += ["", f"[{_dotted((*prefix, key))}]", *_table(table, (*prefix, key))]
    for key, items in arrays:
        for item in items:
            lines += ["", f"[[{_dotted((*prefix, key))}]]", *_table(item, (*prefix, key))]
    return lines


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(part) for part in path)


def _value(item: Any, path: tuple[str, ...]) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if math.isnan(item):
            return "nan"
        if math.isinf(item):
            return "inf" if item > 0 else "-inf"
        return repr(item)
    if isinstance(item, str):
        return json.dumps(item)  # a JSON string is a valid TOML basic string
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(_value(i, path) for i in item) + "]"
    raise ConfigError(f"{_dotted(path)}: {item!r:.80} cannot be written as TOML")
