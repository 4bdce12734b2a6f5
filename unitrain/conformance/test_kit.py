"""The kit as pytest items: ``pytest --pyargs unitrain.conformance --unitrain-backend NAME``.

Collected only when asked for by path or ``--pyargs``; without ``--unitrain-backend`` (or
``UNITRAIN_BACKEND``) there is nothing to parametrize and pytest reports one skip.
"""

from __future__ import annotations

from typing import Any

import pytest


def test_conformance(request: pytest.FixtureRequest, unitrain_check: Any) -> None:
    """One conformance check of one backend on one device and dtype."""
    from unitrain.conformance.plugin import execute

    name, item = unitrain_check
    execute(request, name, item)
