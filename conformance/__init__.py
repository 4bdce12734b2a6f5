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

from collections.abc import Callable, Iterable
from typing import Any

from unitrain.conformance._context import CheckFailed, CheckSkipped, Context
from unitrain.conformance._registry import FAMILIES, Check, all_checks, check
from unitrain.conformance._report import REPORT_SCHEMA, Report
from unitrain.conformance._runner import (
    CheckResult,
    enter_conformance_mode,
    plan,
    resolve_backend,
    run_all,
)
from unitrain.conformance._tolerances import TOLERANCES, Tolerance

__all__ = [
    "FAMILIES",
    "REPORT_SCHEMA",
    "TOLERANCES",
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "Context",
    "Report",
    "Tolerance",
    "all_checks",
    "check",
    "check_backend",
    "run",
]


def run(
    backend: Any,
    *,
    device: str = "all",
    dtypes: Iterable[str] | None = None,
    keyword: str | None = None,
    hypothesis_profile: str = "ci",
    progress: Callable[[CheckResult], None] | None = None,
) -> Report:
    """Run the kit on ``backend`` and return the full :class:`Report`.

    Args:
        backend: a registered name, ``"pkg.module:Class"``, a backend class, or a factory
            ``factory(model, options)``.
        device: ``"cpu"``, ``"gpu"``, or ``"all"`` (every declared device this machine has).
        dtypes: the dtypes to check (default: every dtype the backend declares).
        keyword: a pytest-style ``-k`` expression selecting check ids.
        hypothesis_profile: ``"ci"`` (derandomized, the default) or ``"dev"``.
        progress: called with each result as it is made.

    Returns:
        The report; ``report.failed`` lists failures, ``report.write(path)`` saves JSON.
    """
    environment = enter_conformance_mode()
    under_test = resolve_backend(backend)
    planned, notes = plan(under_test, device=device, dtypes=dtypes, keyword=keyword)
    results = run_all(under_test, planned, hypothesis_profile=hypothesis_profile, progress=progress)
    from unitrain.conformance._hypothesis import hypothesis_available

    if not hypothesis_available():
        notes.append(
            "hypothesis is not installed: property checks ran their explicit examples only"
        )
    return Report(under_test, results, notes, environment, hypothesis_profile)


def check_backend(backend_factory: Any, **options: Any) -> list[CheckResult]:
    """Run the kit on a backend and return one :class:`CheckResult` per check.

    The shape of scikit-learn's ``check_estimator(on_fail=None)``: nothing is raised, each
    record says ``status`` (``passed``, ``failed``, ``skipped``, ``xfailed``, ``xpassed``),
    ``reason``, the worst error and the tolerance used.

    Args:
        backend_factory: a name, ``"pkg.module:Class"``, a backend class, or a factory.
        **options: as for :func:`run` (``device``, ``dtypes``, ``keyword``, ...).

    Returns:
        The records, in check order.
    """
    return run(backend_factory, **options).results
