"""The wheel ships every package: pyproject's explicit package list names each folder."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Source folder -> the import name it is installed as (pyproject's package-dir mapping).
MAPPED = {
    "unitrain": "unitrain",
    "backends": "unitrain.backends",
    "conformance": "unitrain.conformance",
}


def test_every_package_folder_is_listed_in_pyproject():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found <= listed, f"packages missing from pyproject: {sorted(found - listed)}"
