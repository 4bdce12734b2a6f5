"""What this repository's own test run leaves out of the package folder.

- ``unitrain/conformance/test_kit.py``: the kit's entry point for ``pytest --pyargs
  unitrain.conformance --unitrain-backend ...``, not a test of this repository (the kit's
  tests here run it through ``tests/conformance/test_conformance*.py``), except in such a run;
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


@pytest.fixture(autouse=True)
def _sigint_handler_put_back():
    """Every test starts with the SIGINT handler the previous one started with.

    The Ctrl-C tests need Python's own handler (and their subprocesses inherit an ignored
    SIGINT). One full run saw three of them fail after a test in the same worker had left
    another handler installed; the test that did is not known yet, so the handler is put back
    after each test instead of letting one test's leftover fail unrelated ones.
    """
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)
