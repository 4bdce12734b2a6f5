"""The kit's two entry functions, :func:`run` and :func:`check_backend`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from unitrain.conformance._report import Report
from unitrain.conformance._runner import (
    CheckResult,
    enter_conformance_mode,
    plan,
    resolve_backend,
    run_all,
)

__all__ = ["check_backend", "check_layer", "run"]


def run(
    backend: Any,
    *,
    device: str = "all",
    dtypes: Iterable[str] | None = None,
    keyword: str | None = None,
    hypothesis_profile: str = "ci",
    progress: Callable[[CheckResult], None] | None = None,
    layer: Any = None,
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
        layer: check this user layer instead of the backend (``"pkg.module:Name"`` or the
            object: a layer class with ``conformance_cases()``, or a function returning the
            cases); see :mod:`unitrain.conformance._user_layers`.

    Returns:
        The report; ``report.failed`` lists failures, ``report.write(path)`` saves JSON.
    """
    environment = enter_conformance_mode()
    under_test = resolve_backend(backend)
    checks = None
    if layer is not None:
        from unitrain.conformance._user_layers import user_layer_checks

        checks = user_layer_checks(layer)
    planned, notes = plan(under_test, device=device, dtypes=dtypes, keyword=keyword, checks=checks)
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


def check_layer(layer: Any, backend: Any = "numpy", **options: Any) -> list[CheckResult]:
    """Certify a user layer on ``backend``: its output, gradients, state and checkpoint
    hand-off against the float64 reference, in every dtype the backend declares.

    For a user's own test suite::

        results = check_layer("mypkg.layers:DyT", backend="torch")
        assert not [r for r in results if r.status == "failed"], results

    Args:
        layer: ``"pkg.module:Name"`` or the object: a layer class with a
            ``conformance_cases()`` method returning ``[(id, layer, input_shape), ...]``, or
            a function returning that list.
        backend: as for :func:`run`.
        **options: as for :func:`run` (``device``, ``dtypes``, ``keyword``, ...).

    Raises:
        ConfigError: the target names no cases, or a layer's forward calls a framework.
    """
    return run(backend, layer=layer, **options).results
