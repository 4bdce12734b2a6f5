"""Run unitrain's benchmarks; print a markdown table and write the results as JSON.

    python benchmarks/run.py --quick          # every method and workload, under 5 minutes
    python benchmarks/run.py                  # longer segments, 10 repeats
    python benchmarks/run.py --workloads W2 --methods torch/native,torch/unitrain --no-system

See benchmarks/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # the root, not benchmarks/

from benchmarks import checkpoint_bench, report, system
from benchmarks._harness import ROOT, child_env, measure_speed
from benchmarks.methods import METHODS
from benchmarks.workloads import WORKLOADS

RESULTS = ROOT / "benchmarks" / "results"
MEMORY_PAIRS = [(f"{b}/unitrain", f"{b}/native") for b in ("torch", "jax", "tensorflow")]


def _versions() -> dict[str, str]:
    versions = {}
    for package in (
        "numpy",
        "torch",
        "jax",
        "jaxlib",
        "optax",
        "tensorflow-cpu",
        "keras",
        "lightning",
        "safetensors",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="unitrain benchmarks")
    parser.add_argument("--quick", action="store_true", help="shorter segments (under 5 minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (>= 5)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument("--no-system", action="store_true", help="skip import time and memory")
    parser.add_argument("--no-checkpoint", action="store_true", help="skip checkpoint and resume")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (5 if args.quick else 10)
    if args.repeats < 5:
        parser.error(f"--repeats must be at least 5, got {args.repeats}")
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.methods = [m for m in args.methods.split(",") if m]
    for name, known in (("workload", WORKLOADS), ("method", METHODS)):
        unknown = set(getattr(args, f"{name}s")) - set(known)
        if unknown:
            parser.error(f"unknown {name}(s) {sorted(unknown)}; choose from {list(known)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "quick": args.quick,
            "repeats": args.repeats,
            "warmup_epochs": 2,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "versions": _versions(),
            "load_before": _load(),
        }
    }
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if not args.no_system:
        log("import time ...")
        results["system"] = {"import": system.measure_import_time()}
    log_dir = Path(tempfile.mkdtemp(prefix="unitrain-bench-logs-"))
    log(f"speed (worker logs in {log_dir}) ...")
    results["speed"] = measure_speed(
        args.methods, args.workloads, repeats=args.repeats, quick=args.quick, log_dir=log_dir
    )
    if not args.no_system:
        pairs = [p for p in MEMORY_PAIRS if p[0] in args.methods and p[1] in args.methods]
        log("peak memory ...")
        results["system"]["memory"] = system.measure_memory(pairs, "W1", 3 if args.quick else 6)
    if not args.no_checkpoint:
        log("checkpoint and resume ...")
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.checkpoint_bench", "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**child_env("torch"), **checkpoint_bench.STEADY_MEMORY_ENV},
        )
        if completed.returncode == 0:
            results["checkpoint"] = json.loads(completed.stdout.splitlines()[-1])
        else:
            results["checkpoint"] = {"error": completed.stderr[-2000:]}
            log(f"checkpoint benchmark failed:\n{completed.stderr[-2000:]}")
    results["meta"]["load_after"] = _load()
    results["meta"]["seconds"] = time.perf_counter() - started
    results["targets"] = [{**vars(t), "met": t.met} for t in report.targets(results)]
    text = report.markdown(results)
    print(text)
    path = args.json
    if path is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS / f"{'quick' if args.quick else 'full'}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    log(f"wrote {path} after {results['meta']['seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
