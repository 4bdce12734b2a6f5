"""Import time of ``unitrain`` and peak memory of a unitrain run against the native loop.

Both are measured in fresh processes: the import in ``python -c`` processes with the same
environment as the benchmark children, the memory as the peak resident set size
(``ru_maxrss``) of a child that trains one workload without pausing.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from benchmarks._harness import ROOT, child_env

__all__ = ["measure_import_time", "measure_memory"]

_IMPORT_PROBE = """
import sys, time
started = time.perf_counter()
import unitrain
seconds = time.perf_counter() - started
heavy = sorted(m for m in ("torch", "jax", "tensorflow", "keras") if m in sys.modules)
print(seconds, " ".join(heavy))
"""


def measure_import_time(repeats: int = 7) -> dict[str, Any]:
    """Seconds of ``import unitrain`` in fresh interpreters, and of the whole process.

    ``import_seconds`` is what unitrain controls (timed inside the process, numpy included);
    ``process_seconds`` adds the interpreter's own start-up and site hooks, for context.
    """
    env = child_env("torch")
    inside: list[float] = []
    whole: list[float] = []
    heavy: set[str] = set()
    for _ in range(max(repeats, 5)):
        started = time.perf_counter()
        output = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env=env,
        ).stdout.split()
        whole.append(time.perf_counter() - started)
        inside.append(float(output[0]))
        heavy.update(output[1:])
    return {
        "import_seconds": inside,
        "process_seconds": whole,
        "median_import_seconds": statistics.median(inside),
        "median_process_seconds": statistics.median(whole),
        "heavy_modules_imported": sorted(heavy),
    }


def measure_memory(pairs: Iterable[tuple[str, str]], workload: str, epochs: int) -> dict[str, Any]:
    """Peak RSS of each ``(method, baseline)`` pair trained ``epochs`` epochs on ``workload``."""
    results: dict[str, Any] = {}
    for method, baseline in pairs:
        runs = {name: _free_run(name, workload, epochs) for name in (baseline, method)}
        results[method] = {
            "baseline": baseline,
            "peak_rss_mib": runs[method]["peak_rss_mib"],
            "baseline_peak_rss_mib": runs[baseline]["peak_rss_mib"],
            "ratio": runs[method]["peak_rss_mib"] / runs[baseline]["peak_rss_mib"],
            "framework_rss_mib": runs[baseline]["framework_rss_mib"],
        }
    return {"workload": workload, "epochs": epochs, "methods": results}


def _free_run(method: str, workload: str, epochs: int) -> dict[str, Any]:
    backend = method.split("/")[0]
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks._worker", method, "--free", workload, str(epochs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(backend),
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{method} failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.splitlines()[-1])


def main() -> None:
    """``python -m benchmarks.system`` prints :func:`measure_import_time`'s result as JSON."""
    print(json.dumps(measure_import_time()))


if __name__ == "__main__":
    main()
