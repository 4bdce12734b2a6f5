"""Recipes: a whole training setup as one object, and the recipes that ship with unitrain.

:class:`Recipe` and the functions that load, write and override one are in ``_recipe``
(TOML reading in ``_toml``, what a TOML recipe may name in ``_trust``); the built-in digits
data and its Trainer in ``_builtin``; :mod:`unitrain.recipes.digits` is the recipe file that
``unitrain train digits`` runs.

The names below load on first use (PEP 562): the callbacks consult ``_trust`` while the
Trainer, which the built-in recipe imports, is itself importing the callbacks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unitrain.recipes._builtin import Digits, DigitsSplit, default_trainer, load_digits
    from unitrain.recipes._recipe import (
        Recipe,
        apply_overrides,
        load_recipe,
        recipe_from_dict,
        recipe_to_dict,
        recipe_to_toml,
    )

_BUILTIN = ("Digits", "DigitsSplit", "default_trainer", "load_digits")
_RECIPE = (
    "Recipe",
    "apply_overrides",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "recipe_to_toml",
)


def __getattr__(name: str) -> Any:
    if name in _BUILTIN:
        module = "unitrain.recipes._builtin"
    elif name in _RECIPE:
        module = "unitrain.recipes._recipe"
    else:
        raise AttributeError(f"module 'unitrain.recipes' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Digits",
    "DigitsSplit",
    "Recipe",
    "apply_overrides",
    "default_trainer",
    "load_digits",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "recipe_to_toml",
]
