"""Runs methods in child processes, interleaved, and turns their timings into statistics.

One long-lived child per method (:mod:`benchmarks._worker`) imports its framework once. For
each workload every child first trains its warm-up epochs (compilation and tracing happen
there, all children at once, untimed); then, round after round, the children run one timed
segment each, one at a time, in a fresh random order per round. Slow drift of the machine's
load therefore hits every method alike, and the median over rounds discards the rounds that
another process disturbed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._worker import THREAD_ENV
from benchmarks.methods import METHODS, Method
from benchmarks.workloads import WORKLOADS, Workload

__all__ = [
    "ROOT",
    "WorkerError",
    "WorkerProcess",
    "child_env",
    "measure_speed",
    "summarize",
]

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a child may take to import its framework, or to compile and warm up.
START_TIMEOUT = 600.0


class WorkerError(RuntimeError):
    """A child failed, exited or timed out; the message ends with its stderr."""


def child_env(backend: str) -> dict[str, str]:
    """The environment of a child: pinned threads, the Keras backend, no coverage hooks."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("COV_CORE_", "COVERAGE_", "PYTEST_"))
    }
    env.update(THREAD_ENV)
    env["KERAS_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONHASHSEED"] = "0"
    return env


class WorkerProcess:
    """One child running one method, spoken to in JSON lines."""

    def __init__(self, method: Method, log_dir: Path) -> None:
        self.method = method
        self.log_path = log_dir / f"{method.name.replace('/', '.')}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._worker", method.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            env=child_env(method.backend),
        )
        self._buffer = b""

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(command).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise self._error("exited") from None

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next event; an ``error`` event or a dead child raises :class:`WorkerError`."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(f"sent nothing for {timeout:.0f} s")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._error("exited")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        event = json.loads(line)
        if event.get("event") == "error":
            raise WorkerError(f"{self.method.name} failed:\n{event.get('message', '')}")
        return event

    def _error(self, what: str) -> WorkerError:
        self._log.flush()
        tail = self.log_path.read_text(errors="replace")[-2000:]
        return WorkerError(f"{self.method.name} {what}; its stderr ends with:\n{tail}")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send(cmd="exit")
                self.process.wait(timeout=30)
            except (WorkerError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._log.close()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_speed(
    method_names: Iterable[str],
    workload_names: Iterable[str],
    *,
    repeats: int,
    quick: bool,
    log_dir: Path,
    warmup_epochs: int = 2,
    seed: int = 0,
    progress: Callable[[str], None] = _log,
) -> dict[str, Any]:
    """Time every method on every workload (see the module doc); returns raw per-round data.

    Returns:
        ``{"workloads": {name: {"methods": {method: {"seconds": [...], "us_per_step": [...],
        "losses": [...]}}, ...}}, "failures": [...]}``; rounds are in the order they ran.
    """
    if repeats < 5:
        raise ValueError(f"at least 5 repeats are needed for a median, got {repeats=}")
    methods = [METHODS[name] for name in method_names]
    workloads = [WORKLOADS[name] for name in workload_names]
    failures: list[dict[str, str]] = []
    started = time.perf_counter()
    workers = [WorkerProcess(method, log_dir) for method in methods]
    try:
        ready = []
        for worker in workers:
            try:
                event = worker.receive(START_TIMEOUT)
                progress(f"  {worker.method.name}: ready after {event['seconds']:.1f} s")
                ready.append(worker)
            except WorkerError as error:
                failures.append({"method": worker.method.name, "error": str(error)})
                progress(f"  {worker.method.name}: FAILED to start")
        results: dict[str, Any] = {}
        for index, workload in enumerate(workloads):
            results[workload.name] = _measure_workload(
                ready, workload, repeats, quick, warmup_epochs, seed + index, failures, progress
            )
    finally:
        for worker in workers:
            worker.close()
    return {
        "workloads": results,
        "failures": failures,
        "seconds": time.perf_counter() - started,
        "repeats": repeats,
        "warmup_epochs": warmup_epochs,
    }


def _measure_workload(
    workers: list[WorkerProcess],
    workload: Workload,
    repeats: int,
    quick: bool,
    warmup_epochs: int,
    seed: int,
    failures: list[dict[str, str]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    segment_epochs = workload.segment_epochs(quick)
    steps = segment_epochs * workload.steps_per_epoch
    data: dict[str, dict[str, Any]] = {}

    def fail(worker: WorkerProcess, error: WorkerError) -> None:
        failures.append(
            {"method": worker.method.name, "workload": workload.name, "error": str(error)}
        )
        progress(f"  {workload.name} {worker.method.name}: FAILED ({str(error).splitlines()[0]})")
        active.remove(worker)

    active = list(workers)
    progress(f"{workload.name}: warming up {len(active)} methods")
    for worker in active:
        worker.send(
            cmd="run",
            workload=workload.name,
            warmup=warmup_epochs,
            segment_epochs=segment_epochs,
            segments=repeats,
        )
    for worker in list(active):
        try:
            event = worker.receive(START_TIMEOUT)
            data[worker.method.name] = {
                "seconds": [],
                "cpu_seconds": [],
                "losses": [event.get("loss")],
            }
        except WorkerError as error:
            fail(worker, error)
    rng = np.random.default_rng(seed)
    for round_index in range(repeats):
        order = [active[i] for i in rng.permutation(len(active))]
        for worker in order:
            try:
                worker.send(cmd="go")
                event = worker.receive(START_TIMEOUT)
            except WorkerError as error:
                fail(worker, error)
                data.pop(worker.method.name, None)
                continue
            data[worker.method.name]["seconds"].append(event["seconds"])
            data[worker.method.name]["cpu_seconds"].append(event["cpu_seconds"])
            data[worker.method.name]["losses"].append(event.get("loss"))
        progress(f"{workload.name}: round {round_index + 1}/{repeats} done")
    for worker in list(active):
        try:
            worker.send(cmd="finish")
            worker.receive(START_TIMEOUT)
        except WorkerError as error:
            fail(worker, error)
            data.pop(worker.method.name, None)
    for entry in data.values():
        entry["us_per_step"] = [s / steps * 1e6 for s in entry["seconds"]]
        entry["cpu_us_per_step"] = [s / steps * 1e6 for s in entry["cpu_seconds"]]
    return {
        "description": workload.describe(),
        "steps_per_segment": steps,
        "methods": data,
    }


@dataclasses.dataclass(frozen=True)
class Summary:
    """Statistics of one method on one workload."""

    median: float
    min: float
    max: float
    ratio: float | None  # median / the baseline's median, same run
    paired_ratio: float | None  # median over rounds of (this round / baseline's same round)
    baseline: str | None


def summarize(raw: dict[str, Any]) -> dict[str, dict[str, Summary]]:
    """``{workload: {method: Summary}}`` from :func:`measure_speed`'s output."""
    summaries: dict[str, dict[str, Summary]] = {}
    for workload, entry in raw["workloads"].items():
        methods = entry["methods"]
        table: dict[str, Summary] = {}
        for name, data in methods.items():
            times = data["us_per_step"]
            baseline = METHODS[name].baseline if name in METHODS else None
            ratio = paired = None
            if baseline in methods:
                base = methods[baseline]["us_per_step"]
                ratio = statistics.median(times) / statistics.median(base)
                paired = statistics.median(t / b for t, b in zip(times, base))
            table[name] = Summary(
                statistics.median(times), min(times), max(times), ratio, paired, baseline
            )
        summaries[workload] = table
    return summaries


def ratio_between(raw: dict[str, Any], workload: str, method: str, other: str) -> float | None:
    """median(method) / median(other) on ``workload``, or None if either is missing."""
    methods = raw["workloads"].get(workload, {}).get("methods", {})
    if method not in methods or other not in methods:
        return None
    return statistics.median(methods[method]["us_per_step"]) / statistics.median(
        methods[other]["us_per_step"]
    )
