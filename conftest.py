"""Collects the doctests of backends/ and conformance/ under the names they are installed as.

pyproject maps those folders to ``unitrain.backends`` and ``unitrain.conformance``. pytest
would import a file there by its folder path, as a top-level ``backends`` or
``conformance`` package: a second copy of every module, whose classes are not the
installed ones. So their doctest collectors are pointed at the installed modules instead,
and nothing else is collected there (``conformance/test_kit.py`` is the kit's entry point
for ``pytest --pyargs unitrain.conformance --unitrain-backend ...``, not a test of this
repository). An adapter whose framework is not installed has its doctests left out, as
``pytest.importorskip`` would. A ``--pyargs`` run (the kit run as pytest) is left alone.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
#: Repository folder -> the package it is installed as.
INSTALLED = {"backends": "unitrain.backends", "conformance": "unitrain.conformance"}


def installed_name(file_path: Path) -> str | None:
    """``unitrain.backends.torch.core`` for ``backends/torch/core.py``; None outside them."""
    try:
        parts = file_path.resolve().relative_to(ROOT).with_suffix("").parts
    except ValueError:
        return None
    if len(parts) < 2 or parts[0] not in INSTALLED:
        return None
    tail = [p for p in parts[1:] if p != "__init__"]
    return ".".join([INSTALLED[parts[0]], *tail])


def framework_missing(name: str) -> bool:
    """Whether ``name`` is an adapter module whose framework is not installed."""
    parts = name.split(".")
    if parts[:2] != ["unitrain", "backends"] or len(parts) < 3 or parts[2] == "numpy":
        return False
    return importlib.util.find_spec(parts[2]) is None


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: Any) -> Generator[None, Any, Any]:
    collectors = yield
    name = installed_name(file_path)
    if name is None or file_path.suffix != ".py" or parent.config.option.pyargs:
        return collectors  # ``--pyargs unitrain.conformance`` is the kit's own run: as is
    if framework_missing(name):
        return []
    doctests = [c for c in collectors if type(c).__name__ == "DoctestModule"]
    for collector in doctests:
        collector.obj = importlib.import_module(name)
    return doctests
