"""The pytest plugin (entry point ``pytest11: unitrain``): options, a marker, the report.

It does nothing unless asked. ``pytest --pyargs unitrain.conformance --unitrain-backend X``
collects the kit's one test function (``unitrain/conformance/test_kit.py``), parametrized
with one item per check; pytest-xdist spreads the items over workers, and the controller
gathers their records into the JSON report (``--unitrain-report``) and prints the verdict
table.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest

_PROPERTY = "unitrain_conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--unitrain-*`` options."""
    group = parser.getgroup("unitrain", "unitrain conformance kit")
    group.addoption(
        "--unitrain-backend",
        action="append",
        default=[],
        help="backend to certify: a name, pkg.module:Class, or a comma-separated list "
        "(repeatable; default $UNITRAIN_BACKEND)",
    )
    group.addoption("--unitrain-device", default="all", choices=("cpu", "gpu", "all"))
    group.addoption("--unitrain-dtype", action="append", default=None, help="dtype to check")
    group.addoption(
        "--unitrain-report",
        default=None,
        help="write the JSON report here (one file per backend: NAME is inserted before the "
        "suffix when several backends run)",
    )
    group.addoption("--unitrain-hypothesis-profile", default="ci", choices=("ci", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; when the kit is asked for, enter conformance mode early.

    Under pytest-xdist each worker then runs its frameworks on one thread: the kit's models
    are tiny, and workers x threads oversubscribe the cores (2-3x slower on two cores).
    """
    config.addinivalue_line(
        "markers", "unitrain_conformance: an item of the unitrain conformance kit"
    )
    if requested_backends(config, environment=False):
        from unitrain.conformance._runner import enter_conformance_mode

        enter_conformance_mode(single_thread=hasattr(config, "workerinput"))


def requested_backends(config: pytest.Config, *, environment: bool = True) -> list[str]:
    """The backends named by ``--unitrain-backend`` (else, with ``environment``, by
    ``UNITRAIN_BACKEND``; only when the kit's own test module is collected)."""
    names: list[str] = []
    given = config.getoption("unitrain_backend", default=None) or []
    fallback = [os.environ.get("UNITRAIN_BACKEND", "")] if environment else []
    for value in given or fallback:
        names.extend(part.strip() for part in value.split(",") if part.strip())
    return names


@functools.cache
def _resolved(name: str) -> Any:
    """The backend class of ``name``, resolved once per session (entry points, devices)."""
    from unitrain.conformance._runner import resolve_backend

    return resolve_backend(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the kit's test function with one item per planned check."""
    if "unitrain_check" not in metafunc.fixturenames:
        return
    from unitrain.conformance._runner import plan

    config = metafunc.config
    params = []
    for name in requested_backends(config):
        backend = _resolved(name)
        planned, _ = plan(
            backend,
            device=config.getoption("unitrain_device"),
            dtypes=config.getoption("unitrain_dtype"),
            keyword=None,
        )
        for item in planned:
            params.append(
                pytest.param(
                    (name, item), id=f"{name}:{item.id}", marks=pytest.mark.unitrain_conformance
                )
            )
    metafunc.parametrize("unitrain_check", params)


def execute(request: pytest.FixtureRequest, name: str, item: Any) -> None:
    """Run one planned check as a pytest item and translate its status."""
    from unitrain.conformance._runner import run_planned

    backend = _resolved(name)
    result = run_planned(
        backend, item, hypothesis_profile=request.config.getoption("unitrain_hypothesis_profile")
    )
    record = {"target": name, **result.to_dict()}
    request.node.user_properties.append((_PROPERTY, json.dumps(record)))
    if result.status == "failed":
        pytest.fail(result.reason, pytrace=False)
    if result.status == "skipped":
        pytest.skip(result.reason)
    if result.status == "xfailed":
        pytest.xfail(result.reason)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect records (on the controller too, where xdist forwards the reports)."""
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    for key, value in report.user_properties:
        if key == _PROPERTY:
            _collected.append(json.loads(str(value)))


_collected: list[dict[str, Any]] = []


def _reports() -> list[Any]:
    from unitrain.conformance._report import Report
    from unitrain.conformance._runner import CheckResult

    by_target: dict[str, list[dict[str, Any]]] = {}
    for record in _collected:
        by_target.setdefault(record["target"], []).append(record)
    reports = []
    for target, records in by_target.items():
        results = []
        for record in sorted(records, key=lambda r: r["id"]):
            fields = {k: v for k, v in record.items() if k != "target"}
            fields["notes"] = tuple(fields["notes"])
            results.append(CheckResult(**fields))
        reports.append(Report(_resolved(target), results))
    return reports


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print each backend's verdict table and write the JSON reports."""
    if hasattr(config, "workerinput") or not _collected:
        return
    reports = _reports()
    target = config.getoption("unitrain_report")
    for report in reports:
        terminalreporter.section(f"unitrain conformance: {report.backend.name}")
        terminalreporter.write_line(report.table())
        if target:
            path = Path(target)
            if len(reports) > 1:
                path = path.with_name(f"{path.stem}.{report.backend.name}{path.suffix}")
            terminalreporter.write_line(f"report: {report.write(path)}")
