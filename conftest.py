"""What this repository's own test run leaves out of the package folder.

- ``unitrain/conformance/test_kit.py``: the kit's entry point for ``pytest --pyargs
  unitrain.conformance --unitrain-backend ...``, not a test of this repository (the kit's
  tests here run it through ``tests/test_conformance*.py``), except in such a run;
- the old module paths kept for compatibility (:mod:`unitrain._moved`): importing one warns,
  which this run turns into an error; ``tests/test_moved_paths.py`` tests them;
- an adapter whose framework is not installed, as ``pytest.importorskip`` would.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from unitrain._moved import MOVED

ROOT = Path(__file__).resolve().parent
ADAPTERS = ROOT / "unitrain" / "backends"

KIT_ENTRY = ROOT / "unitrain" / "conformance" / "test_kit.py"

collect_ignore = [f"{old.replace('.', '/')}.py" for old in MOVED]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out the kit's entry point (unless this is the kit's own ``--pyargs`` run) and
    ``unitrain/backends/<framework>/`` when ``<framework>`` is not installed."""
    if collection_path == KIT_ENTRY:
        return not config.option.pyargs
    if collection_path.parent == ADAPTERS and collection_path.is_dir():
        name = collection_path.name
        if name not in ("numpy", "__pycache__") and importlib.util.find_spec(name) is None:
            return True
    return None
