"""The report: one record per check, a summary, warnings, the JSON form and the table.

The JSON document (``REPORT_SCHEMA`` describes it) is::

    {"schema_version": 1, "summary": {...}, "checks": [record, ...]}

where each record is :meth:`CheckResult.to_dict`. The summary holds counts by status and by
family, each family's worst error per dtype (a float64 error and a float32 one are held to
bars 1e6 apart, so one number for both would hide the float64 row), the tolerance table
used, every override the backend declared (xfails, tolerances, its own callbacks), the
checks that ran on simulated workers, warnings such as stale xfails, and the verdict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import unitrain
from unitrain.conformance._context import BackendUnderTest
from unitrain.conformance._registry import FAMILIES, all_checks, key_matches_any
from unitrain.conformance._runner import STATUSES, CheckResult
from unitrain.conformance._tolerances import TOLERANCES

__all__ = ["REPORT_SCHEMA", "Report", "stale_xfail_warnings"]

_NUMBER_OR_NULL = {"type": ["number", "null"]}

#: JSON Schema (draft 2020-12) of the report document.
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema_version", "summary", "checks"],
    "properties": {
        "schema_version": {"const": 1},
        "summary": {
            "type": "object",
            "required": [
                "backend",
                "target",
                "backend_versions",
                "unitrain_version",
                "verdict",
                "total",
                "counts",
                "families",
                "tolerances",
                "overrides",
                "warnings",
                "notes",
                "environment",
                "hypothesis_profile",
            ],
            "properties": {
                "verdict": {"enum": ["conforms", "does not conform", "nothing checked"]},
                "total": {"type": "integer", "minimum": 0},
                "counts": {
                    "type": "object",
                    "required": list(STATUSES),
                    "additionalProperties": {"type": "integer", "minimum": 0},
                },
                "families": {"type": "object"},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [f.name for f in dataclasses.fields(CheckResult)],
                "additionalProperties": False,
                "properties": {
                    "id": {
                        "type": "string",
                        "pattern": r"^[a-z_]+::[a-z0-9_]+\[[a-z]+-[a-z0-9]+\]$",
                    },
                    "family": {"enum": list(FAMILIES)},
                    "check": {"type": "string"},
                    "backend": {"type": "string"},
                    "backend_versions": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                    },
                    "unitrain_version": {"type": "string"},
                    "device": {"type": "string"},
                    "dtype": {"type": "string"},
                    "status": {"enum": list(STATUSES)},
                    "reason": {"type": "string"},
                    "likely_cause": {"type": "string"},
                    "simulated": {"type": "boolean"},
                    "max_abs_error": _NUMBER_OR_NULL,
                    "max_rel_error": _NUMBER_OR_NULL,
                    "tolerance": _NUMBER_OR_NULL,
                    "tolerance_kind": {"type": ["string", "null"]},
                    "tolerance_override": {"type": "boolean"},
                    "duration_s": {"type": "number", "minimum": 0},
                    "notes": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def stale_xfail_warnings(backend: BackendUnderTest, results: Sequence[CheckResult]) -> list[str]:
    """Warnings for declared xfails that match no check, or whose checks passed."""
    caps = backend.capabilities
    known = [
        check.id(device, dtype)
        for check in all_checks()
        for device in caps.devices
        for dtype in caps.dtypes
    ]
    bases = [check.base_id for check in all_checks()]
    found = []
    for key in backend.xfails:
        if not key_matches_any(key, known, bases):
            found.append(f"stale xfail {key!r}: it matches no check id")
    for result in results:
        if result.status == "xpassed":
            found.append(f"{result.id}: {result.reason}")
    return found


@dataclasses.dataclass
class Report:
    """Everything one kit run found about one backend."""

    backend: BackendUnderTest
    results: list[CheckResult]
    notes: list[str] = dataclasses.field(default_factory=list)
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hypothesis_profile: str = "ci"

    @property
    def warnings(self) -> list[str]:
        """Stale xfails (declared but matching nothing, or passing)."""
        return stale_xfail_warnings(self.backend, self.results)

    @property
    def failed(self) -> list[CheckResult]:
        """The failed records."""
        return [r for r in self.results if r.status == "failed"]

    def counts(self, results: Iterable[CheckResult] | None = None) -> dict[str, int]:
        """Records per status."""
        counts = dict.fromkeys(STATUSES, 0)
        for result in self.results if results is None else results:
            counts[result.status] += 1
        return counts

    def verdict(self) -> str:
        """``conforms``, ``does not conform`` or ``nothing checked``."""
        if self.failed:
            return "does not conform"
        ran = [r for r in self.results if r.status in ("passed", "xfailed", "xpassed")]
        return "conforms" if ran else "nothing checked"

    def verdict_line(self) -> str:
        """The verdict as one line that is never read as full agreement when it is not.

        A backend that conforms only thanks to declared known failures says how many:
        ``conforms, with 15 declared deviations``.

        Examples:
            >>> from unitrain.conformance._runner import CheckResult
            >>> known = CheckResult("a::b[cpu-float32]", "a", "b", "x", {}, "0", "cpu",
            ...                     "float32", "xfailed", "declared")
            >>> Report(BackendUnderTest(None, "x", "x", None), [known] * 2).verdict_line()
            'conforms, with 2 declared deviations'
        """
        verdict, known = self.verdict(), self.counts()["xfailed"]
        if verdict != "conforms" or not known:
            return verdict
        return f"conforms, with {known} declared deviation{'' if known == 1 else 's'}"

    def family_rows(self) -> list[dict[str, Any]]:
        """Per family: counts and, per dtype, the worst numeric error relative to its
        tolerance (``worst``: dtype -> ``{"error", "tolerance", "id"}``)."""
        rows = []
        for family in FAMILIES:
            members = [r for r in self.results if r.family == family]
            if not members:
                continue
            worst: dict[str, dict[str, Any]] = {}
            for dtype in dict.fromkeys(r.dtype for r in members):
                # Known failures are excluded: their errors are expected to exceed the bar.
                numeric = [
                    r
                    for r in members
                    if r.dtype == dtype
                    and r.max_rel_error is not None
                    and r.tolerance
                    and r.status != "xfailed"
                ]
                found = max(numeric, key=_error_ratio, default=None)
                if found is not None:
                    worst[dtype] = {
                        "error": found.max_rel_error,
                        "tolerance": found.tolerance,
                        "id": found.id,
                    }
            rows.append({"family": family, **self.counts(members), "worst": worst})
        return rows

    @property
    def simulated(self) -> list[CheckResult]:
        """The records whose backend side ran on simulated workers."""
        return [r for r in self.results if r.simulated and r.status != "skipped"]

    def summary(self) -> dict[str, Any]:
        """The summary object of the JSON report."""
        versions: dict[str, str] = {}
        for result in self.results:
            versions.update(result.backend_versions)
        return {
            "backend": self.backend.name,
            "target": self.backend.target,
            "backend_versions": versions,
            "unitrain_version": unitrain.__version__,
            "verdict": self.verdict(),
            "verdict_line": self.verdict_line(),
            "total": len(self.results),
            "counts": self.counts(),
            "families": {row.pop("family"): row for row in self.family_rows()},
            "capabilities": dataclasses.asdict(self.backend.capabilities),
            "tolerances": {k: dataclasses.asdict(v) for k, v in TOLERANCES.items()},
            "overrides": {
                "xfails": dict(self.backend.xfails),
                "tolerances": {k: dict(v) for k, v in self.backend.tolerances.items()},
                "callbacks": {k: _qualname(v) for k, v in self.backend.callbacks.items()},
            },
            "simulated": [r.id for r in self.simulated],
            "warnings": self.warnings,
            "notes": list(self.notes),
            "environment": dict(self.environment),
            "hypothesis_profile": self.hypothesis_profile,
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON document."""
        return {
            "schema_version": 1,
            "summary": self.summary(),
            "checks": [r.to_dict() for r in self.results],
        }

    def write(self, path: str | Path) -> Path:
        """Write the JSON document to ``path``."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=True) + "\n")
        return target

    def table(self, *, verbose: bool = False) -> str:
        """The human-readable verdict: a table by family (the worst error over its tolerance
        in a column per dtype), then what did not pass and what ran on simulated workers."""
        dtypes = list(dict.fromkeys(r.dtype for r in self.results))
        header = (
            "family",
            *STATUSES,
            *(f"worst {dtype} / tol" for dtype in dtypes),
        )
        rows: list[tuple[str, ...]] = [header]
        for family_row in self.family_rows():
            worst = []
            for dtype in dtypes:
                found = family_row["worst"].get(dtype)
                worst.append(
                    "-" if found is None else f"{found['error']:.2g} / {found['tolerance']:.2g}"
                )
            rows.append((family_row["family"], *(str(family_row[s]) for s in STATUSES), *worst))
        total = self.counts()
        rows.append(("total", *(str(total[s]) for s in STATUSES), *("" for _ in dtypes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [
            f"unitrain conformance: backend {self.backend.name!r} ({self.backend.target}), "
            f"unitrain {unitrain.__version__}"
        ]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
            lines.append("  ".join(cells).rstrip())
            if i == 0 or i == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        shown = [
            r for r in self.results if r.status != "passed" and (verbose or r.status != "skipped")
        ]
        skipped = [r for r in self.results if r.status == "skipped"]
        if shown or self.simulated:
            lines.append("")
        for result in shown:
            lines.append(f"{result.status.upper():8s} {result.id}: {result.reason}")
        for result in self.simulated:
            note = next((n for n in result.notes if n.startswith("simulated")), "")
            lines.append(f"SIMULATED {result.id} ({result.status}): {note}")
        if skipped and not verbose:
            reasons = sorted({r.reason for r in skipped})
            lines.append(f"SKIPPED  {len(skipped)} checks: " + "; ".join(reasons))
        for note in self.notes:
            lines.append(f"NOTE     {note}")
        for warning in self.warnings:
            lines.append(f"WARNING  {warning}")
        lines.append("")
        lines.append(f"verdict: {self.verdict_line()}")
        return "\n".join(lines)


def _error_ratio(result: CheckResult) -> float:
    """How far past its tolerance a numeric result came (``result`` has both numbers)."""
    assert result.max_rel_error is not None and result.tolerance
    return result.max_rel_error / result.tolerance


def _qualname(value: Any) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
