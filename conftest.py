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


@pytest.fixture(autouse=True)
def _sigint_handler_put_back(request):
    """Every test starts with the SIGINT handler the previous one started with, at the C level
    too, and with SIGINT unblocked.

    The Ctrl-C tests need Python's own handler (and their subprocesses inherit an ignored or
    blocked SIGINT). Two full runs saw three of them fail after a test in the same worker had
    left SIGINT otherwise: once a Python handler, once a disposition set below Python (by
    native code: ``signal.getsignal`` still named Python's handler, and the signal never
    arrived). So the handler is installed again after every test, whatever Python's record
    says, and SIGINT unblocked; where the process's own status shows SIGINT ignored or blocked
    after a test, that test's id is appended to ``unitrain-sigint.log`` in the temporary
    folder, to find the code that does it.
    """
    import signal
    import tempfile

    before = signal.getsignal(signal.SIGINT)
    yield
    if _sigint_ignored_or_blocked():
        log = Path(tempfile.gettempdir()) / "unitrain-sigint.log"
        with log.open("a", encoding="utf-8") as file:
            file.write(f"{request.node.nodeid}\n")
    signal.signal(signal.SIGINT, before)  # always: native code may have changed it unseen
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _sigint_ignored_or_blocked() -> bool:
    """Whether the main thread ignores or blocks SIGINT, read from /proc (Linux); False
    where there is no /proc."""
    import threading

    status = Path(f"/proc/self/task/{threading.main_thread().native_id}/status")
    if not status.exists():
        return False
    for line in status.read_text().splitlines():
        if line.startswith(("SigIgn:", "SigBlk:")) and int(line.split(":")[1], 16) & 0b10:
            return True  # bit 1 is signal 2, SIGINT
    return False
