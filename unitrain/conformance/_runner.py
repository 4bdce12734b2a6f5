"""Resolving the backend under test, planning the device x dtype matrix, running checks.

Statuses follow pytest's words: ``passed``, ``failed``, ``skipped`` (a capability the backend
does not declare, or a device this machine lacks), ``xfailed`` (a failure the backend
declared as known, with its reason) and ``xpassed`` (a declared failure that passed: the
declaration is stale, and the report warns).
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import unitrain
from unitrain.backends.protocol import AvailableDevices, Capabilities
from unitrain.backends.registry import get_backend
from unitrain.conformance._context import BackendUnderTest, CheckFailed, CheckSkipped, Context
from unitrain.conformance._registry import Check, all_checks, keyword_matcher, xfail_reason
from unitrain.conformance._tolerances import TOLERANCES, tolerance_for

__all__ = [
    "CONFORMANCE_ENVIRONMENT",
    "CheckResult",
    "PlannedCheck",
    "enter_conformance_mode",
    "plan",
    "resolve_backend",
    "run_planned",
]

STATUSES = ("passed", "failed", "skipped", "xfailed", "xpassed")

#: Set (if unset) before any framework is imported: no TF32 on NVIDIA GPUs in any framework,
#: deterministic cuBLAS workspaces and TensorFlow ops. Backends are also built with
#: ``BackendOptions(deterministic=True)``.
CONFORMANCE_ENVIRONMENT = {
    "NVIDIA_TF32_OVERRIDE": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "TF_DETERMINISTIC_OPS": "1",
}


#: With ``single_thread``: one thread per framework, for parallel workers (pytest-xdist),
#: where every worker using every core makes the kit's tiny models 2-3x slower.
SINGLE_THREAD_ENVIRONMENT = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def enter_conformance_mode(single_thread: bool = False) -> dict[str, str]:
    """Set :data:`CONFORMANCE_ENVIRONMENT` where unset; return the values in force.

    Only variables not set already are set, and only frameworks imported afterwards see
    them; backends are also built with ``deterministic=True``, which covers the rest.

    Args:
        single_thread: also set :data:`SINGLE_THREAD_ENVIRONMENT` (parallel workers).
    """
    wanted = dict(CONFORMANCE_ENVIRONMENT)
    if single_thread:
        wanted.update(SINGLE_THREAD_ENVIRONMENT)
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check's verdict: one record of the JSON report.

    Attributes:
        id: ``family::check[device-dtype]``.
        family: the check's family.
        check: the check's name within the family.
        backend: the backend's name.
        backend_versions: what the backend's ``versions()`` reported.
        unitrain_version: the kit's version.
        device: ``"cpu"`` or ``"gpu"``.
        dtype: the parameter dtype.
        status: one of ``passed``, ``failed``, ``skipped``, ``xfailed``, ``xpassed``.
        reason: why it failed, was skipped or is a known failure ("" when it passed); a
            failed comparison ends with ``(likely: ...)``, its likely cause.
        likely_cause: for a failed comparison (or a known failure), its likely cause: the
            backend bugs the check fails on, as ``--list`` shows them, unless the check found
            a more precise one (a launcher that hid a worker's failure); "" otherwise, and
            for an error the backend raised, which names its own line.
        simulated: the check ran the backend's side of the comparison on simulated workers
            (the core's ``SimulatedWorkers`` in one process), not on an engine's workers, so
            its pass says nothing about the backend's own data-parallel training.
        max_abs_error: the largest elementwise error of the worst comparison, if numeric.
        max_rel_error: the relative error held to the tolerance, if numeric.
        tolerance: the tolerance used (0 for bit-exact comparisons).
        tolerance_kind: which row field (``"trajectory"``, ``"bit-exact"``, ...).
        tolerance_override: whether the backend overrode that tolerance.
        duration_s: wall time of the check.
        notes: anything else the check wants the reader to know.
    """

    id: str
    family: str
    check: str
    backend: str
    backend_versions: Mapping[str, str]
    unitrain_version: str
    device: str
    dtype: str
    status: str
    reason: str = ""
    likely_cause: str = ""
    simulated: bool = False
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    tolerance: float | None = None
    tolerance_kind: str | None = None
    tolerance_override: bool = False
    duration_s: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether this record is not a failure."""
        return self.status != "failed"

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        record = dataclasses.asdict(self)
        record["backend_versions"] = dict(self.backend_versions)
        record["notes"] = list(self.notes)
        return record


@dataclasses.dataclass(frozen=True)
class PlannedCheck:
    """A check bound to a device and dtype, or a record to emit without running."""

    check: Check
    device: str
    dtype: str
    skip_reason: str | None = None

    @property
    def id(self) -> str:
        """The stable id."""
        return self.check.id(self.device, self.dtype)


def import_target(backend: Any) -> str:
    """``"package.module:Qualified.Name"`` for a backend class or factory: how a fresh process
    (the data-parallel checks' workers) imports it again. A class defined in ``__main__`` or
    inside a function has no such name; it gets its bare name, and :func:`importable` says why.

    Examples:
        >>> from unitrain.backends.numpy import NumpyBackend
        >>> import_target(NumpyBackend)
        'unitrain.backends.numpy.backend:NumpyBackend'
    """
    module = getattr(backend, "__module__", None)
    qualname = getattr(backend, "__qualname__", None)
    if not module or not qualname:
        return repr(backend)
    return f"{module}:{qualname}"


def importable(target: str) -> str | None:
    """Why a fresh process cannot import the backend named ``target`` (None: it can)."""
    module, _, qualname = target.partition(":")
    if not qualname:
        return None  # a registered name
    if module == "__main__" or "<locals>" in qualname:
        where = "the script being run" if module == "__main__" else "a function"
        return (
            f"the backend {qualname.split('.')[-1]!r} is defined in {where}, so the worker "
            "processes of this check cannot import it; define it in an importable module and "
            "pass the class (or 'package.module:Class')"
        )
    return None


def resolve_backend(spec: Any) -> BackendUnderTest:
    """The backend under test from a name, ``"pkg.mod:Class"``, a class or a factory.

    A factory function ``factory(model, options)`` may carry the same attributes a class
    would (``name``, ``capabilities``, ``conformance_xfails``, ...); missing ones default.
    """
    target = spec if isinstance(spec, str) else import_target(spec)
    factory = get_backend(spec) if isinstance(spec, (str, type)) else spec
    if not callable(factory):
        raise TypeError(f"a backend is a name, 'pkg.mod:Class', a class or a factory, got {spec!r}")
    capabilities = getattr(factory, "capabilities", None)
    if not isinstance(capabilities, Capabilities):
        capabilities = Capabilities()
    available = factory.available_devices() if isinstance(factory, AvailableDevices) else None
    return BackendUnderTest(
        factory=factory,
        name=str(getattr(factory, "name", getattr(factory, "__name__", target))),
        target=target,
        capabilities=capabilities,
        xfails=dict(getattr(factory, "conformance_xfails", {}) or {}),
        tolerances=dict(getattr(factory, "conformance_tolerances", {}) or {}),
        callbacks=dict(getattr(factory, "conformance_callbacks", {}) or {}),
        available_devices=None if available is None else tuple(available),
    )


def plan(
    backend: BackendUnderTest,
    *,
    device: str = "all",
    dtypes: Iterable[str] | None = None,
    keyword: str | None = None,
    checks: Iterable[Check] | None = None,
) -> tuple[list[PlannedCheck], list[str]]:
    """The checks to run (or to report as skipped) and notes on what was left out.

    Args:
        backend: the backend under test.
        device: ``"cpu"``, ``"gpu"`` or ``"all"`` (every declared device this machine has).
        dtypes: dtypes to run; default every declared dtype the tolerance table knows.
        keyword: a ``-k`` expression over check ids.
        checks: the checks to plan (default: every registered check).

    Returns:
        ``(planned, notes)``.
    """
    declared = backend.capabilities.devices
    available = backend.available_devices if backend.available_devices is not None else declared
    notes: list[str] = []
    devices: list[tuple[str, str | None]] = []
    if device == "all":
        for name in declared:
            if name in available:
                devices.append((name, None))
            else:
                notes.append(f"device {name!r} is declared but not available on this machine")
    elif device not in declared:
        devices.append((device, f"the backend does not declare device {device!r}"))
    elif device not in available:
        devices.append((device, f"no {device} is available on this machine"))
    else:
        devices.append((device, None))
    wanted = list(dtypes) if dtypes is not None else list(backend.capabilities.dtypes)
    dtype_plan: list[tuple[str, str | None]] = []
    for dtype in wanted:
        if dtype not in TOLERANCES:
            notes.append(f"dtype {dtype!r} has no tolerance row; not checked")
        elif dtype not in backend.capabilities.dtypes:
            dtype_plan.append((dtype, f"the backend does not declare dtype {dtype!r}"))
        else:
            dtype_plan.append((dtype, None))
    match = keyword_matcher(keyword)
    planned = []
    for dev, dev_reason in devices:
        for dtype, dtype_reason in dtype_plan:
            for check in all_checks() if checks is None else checks:
                reason = dev_reason or dtype_reason or _missing_capability(backend, check)
                item = PlannedCheck(check, dev, dtype, reason)
                if match(item.id):
                    planned.append(item)
    return planned, notes


def _missing_capability(backend: BackendUnderTest, check: Check) -> str | None:
    for capability in ("portable_models", *check.requires):
        if not getattr(backend.capabilities, capability, False):
            return f"the backend does not declare capability {capability!r}"
    return None


_VERSIONS: dict[tuple[int, str], dict[str, str]] = {}


def backend_versions(backend: BackendUnderTest, device: str) -> dict[str, str]:
    """``versions()`` of a small instance on ``device`` (cached per backend and device)."""
    key = (id(backend.factory), device)
    if key not in _VERSIONS:
        from unitrain.conformance._probes import LINEAR_PROBE

        try:
            ctx = Context(backend, device, "float32", TOLERANCES["float32"])
            dtype = "float32" if "float32" in backend.capabilities.dtypes else None
            dtype = dtype or backend.capabilities.dtypes[0]
            instance = backend.factory(LINEAR_PROBE, ctx.options(dtype=dtype, loss="mse"))
            _VERSIONS[key] = {str(k): str(v) for k, v in instance.versions().items()}
        except Exception as error:  # reported, not raised: the checks will show the failure
            _VERSIONS[key] = {"error": f"{type(error).__name__}: {error}"}
    return _VERSIONS[key]


def run_planned(
    backend: BackendUnderTest,
    item: PlannedCheck,
    *,
    hypothesis_profile: str = "ci",
) -> CheckResult:
    """Run one planned check and return its record."""
    versions = backend_versions(backend, item.device) if item.skip_reason is None else {}
    base: dict[str, Any] = {
        "id": item.id,
        "family": item.check.family,
        "check": item.check.name,
        "backend": backend.name,
        "backend_versions": versions,
        "unitrain_version": unitrain.__version__,
        "device": item.device,
        "dtype": item.dtype,
    }
    if item.skip_reason is not None:
        return CheckResult(**base, status="skipped", reason=item.skip_reason)
    tolerance = tolerance_for(item.dtype, backend.tolerances)
    ctx = Context(backend, item.device, item.dtype, tolerance, hypothesis_profile)
    started = time.perf_counter()
    status, reason, likely = "passed", "", item.check.guards
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            item.check.function(ctx)
    except CheckSkipped as skipped:
        status, reason = "skipped", str(skipped)
    except CheckFailed as failure:
        status, reason = "failed", str(failure)
        likely = failure.likely or likely
    except Exception as error:
        # The error and its line are the cause: the check's guards name wrong numbers, which
        # a TypeError in a backend's call would only be misread as.
        where = traceback.extract_tb(error.__traceback__)[-1]
        status, likely = "failed", ""
        reason = f"raised {type(error).__name__}: {error} (at {where.filename}:{where.lineno})"
    finally:
        ctx.close()
    duration = time.perf_counter() - started
    likely = likely if status == "failed" else ""
    if likely:
        reason = f"{reason} (likely: {likely})"
    declared = xfail_reason(backend.xfails, item.id)
    if declared is not None and status == "failed":
        status, reason = "xfailed", f"known failure ({declared[1]}): {reason}"
    elif declared is not None and status == "passed":
        status = "xpassed"
        reason = f"stale xfail {declared[0]!r} ({declared[1]}): the check passed"
    worst = max(ctx.measurements, key=lambda m: m.ratio, default=None)
    overrides = backend.tolerances.get(item.dtype, {})
    return CheckResult(
        **base,
        status=status,
        reason=reason,
        likely_cause=likely,
        simulated=ctx.simulated,
        max_abs_error=None if worst is None else worst.max_abs_error,
        max_rel_error=None if worst is None else worst.max_rel_error,
        tolerance=None if worst is None else worst.tolerance,
        tolerance_kind=None if worst is None else worst.kind,
        tolerance_override=worst is not None and worst.kind in overrides,
        duration_s=round(duration, 4),
        notes=tuple(dict.fromkeys(ctx.notes)),
    )


def run_all(
    backend: BackendUnderTest,
    planned: Iterable[PlannedCheck],
    *,
    hypothesis_profile: str = "ci",
    progress: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every planned check in order."""
    results = []
    for item in planned:
        result = run_planned(backend, item, hypothesis_profile=hypothesis_profile)
        if progress is not None:
            progress(result)
        results.append(result)
    return results
