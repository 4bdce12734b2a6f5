"""The conformance kit: certifies that a backend trains like the float64 numpy reference.

Three ways in, one registry of checks (ids ``family::check[device-dtype]``) behind them:

- ``unitrain conformance --backend NAME|pkg.module:Class`` prints a table and exits non-zero
  on any failure;
- ``pytest --pyargs unitrain.conformance --unitrain-backend NAME`` runs the same checks as
  pytest items (pytest-xdist spreads them);
- :func:`check_backend` returns one :class:`CheckResult` per check, for a third party's own
  test suite.

Importing this package imports no framework; the backend's framework is imported when the
backend is resolved.

Examples:
    >>> from unitrain.conformance import check_backend
    >>> results = check_backend("numpy", keyword="schedules::constant and float32")
    >>> [(r.id, r.status) for r in results]
    [('schedules::constant[cpu-float32]', 'passed')]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unitrain.conformance._api import check_backend, check_layer, run
    from unitrain.conformance._context import CheckFailed, CheckSkipped, Context
    from unitrain.conformance._registry import FAMILIES, Check, all_checks, check
    from unitrain.conformance._report import REPORT_SCHEMA, Report
    from unitrain.conformance._runner import CheckResult
    from unitrain.conformance._tolerances import TOLERANCES, Tolerance

# Loaded on first use (PEP 562): pytest imports the plugin module of this package at start-up,
# before coverage or any test runs, and that must not import the kit or the core with it.
_LAZY = {
    "check_backend": "unitrain.conformance._api",
    "check_layer": "unitrain.conformance._api",
    "run": "unitrain.conformance._api",
    "CheckFailed": "unitrain.conformance._context",
    "CheckSkipped": "unitrain.conformance._context",
    "Context": "unitrain.conformance._context",
    "FAMILIES": "unitrain.conformance._registry",
    "Check": "unitrain.conformance._registry",
    "all_checks": "unitrain.conformance._registry",
    "check": "unitrain.conformance._registry",
    "REPORT_SCHEMA": "unitrain.conformance._report",
    "Report": "unitrain.conformance._report",
    "CheckResult": "unitrain.conformance._runner",
    "TOLERANCES": "unitrain.conformance._tolerances",
    "Tolerance": "unitrain.conformance._tolerances",
}

__all__ = [
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "Context",
    "FAMILIES",
    "REPORT_SCHEMA",
    "Report",
    "TOLERANCES",
    "Tolerance",
    "all_checks",
    "check",
    "check_backend",
    "check_layer",
    "run",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'unitrain.conformance' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
