"""Preemption and restarts of launched workers: signals forwarded, no process left behind.

- SIGTERM to ``unitrain train --workers 2`` (torch DDP under torchrun) makes every worker
  stop at one step, rank 0 checkpoint it, all exit; the command exits 143, leaves no
  process and no lock, and ``--resume auto`` ends bit-identical to an uninterrupted run.
- ``torchrun --max-restarts=3`` with worker 1 killed (SIGKILL) on two attempts completes, and
  its final weights equal the uninterrupted run's: a restart resumes by itself.
- The first two are harnesses (``pytest -m harness``, CI's second stage);
  ``test_sigterm_at_random_moments`` (slow: CI does not run it) is the soak: SIGTERM at
  random moments (``UNITRAIN_PREEMPT_TRIALS``, default 100) with 1 and 2 workers.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from unitrain.checkpoint import list_checkpoints, load_checkpoint
from unitrain.training._lock import LOCK_NAME

pytest.importorskip("torch")

HERE = Path(__file__).parent
#: Kubernetes' default terminationGracePeriodSeconds: SIGKILL follows SIGTERM after it.
GRACE_S = 30.0


def train(out: Path, workers: int, *extra: str, backend: str = "torch") -> list[str]:
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", backend, "--quiet"]
    command += ["--out", str(out), "--epochs", "3", "--set", "callbacks.0.patience=100"]
    if workers > 1:
        command += ["--workers", str(workers)]
    return [*command, *extra]


def final_weights(out: Path) -> dict[str, np.ndarray]:
    newest = list_checkpoints(out / "checkpoints")[-1]
    checkpoint = load_checkpoint(newest)
    assert checkpoint.trainer["epoch"] == 3, newest
    return checkpoint.model


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def processes_of(out: Path) -> list[str]:
    """Command lines of live processes that name ``out`` (the run's workers, its launcher)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(out) in line:
                found.append(line)
    return found


def interrupt(command: list[str], out: Path, after: float | None) -> tuple[int, str, float]:
    """Run ``command``; SIGTERM it ``after`` seconds in (None: once a checkpoint exists).

    Returns its exit status, stderr, and the seconds from the signal to its exit."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    if after is None:
        deadline = time.monotonic() + 300
        while not list_checkpoints(out / "checkpoints") and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.05)
    else:
        time.sleep(after)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=GRACE_S + 30)
    return process.returncode, err, time.monotonic() - signalled


def check_stopped(out: Path, status: int, err: str, seconds: float) -> None:
    """A signalled run ended in time, said why, and left no lock and no process.

    -15 (killed by the signal) is allowed only before the interpreter reached unitrain's
    ``main``, which installs the handlers: nothing of the run exists yet then."""
    if status == -signal.SIGTERM:
        assert not (out / "checkpoints").exists(), "killed by SIGTERM after start-up"
        return
    assert status in (143, 0), err[-3000:]  # 0: it had finished before the signal
    assert seconds < GRACE_S, f"took {seconds:.1f}s to stop"
    if status == 143:
        assert "unitrain: SIGTERM" in err
    assert not (out / "checkpoints" / LOCK_NAME).exists()
    time.sleep(0.2)
    assert processes_of(out) == []


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp("whole2")
    subprocess.run(train(out, 2), check=True, capture_output=True)
    return final_weights(out)


@pytest.mark.harness  # ~40 s in CI, and ~20 s for the uninterrupted run both tests compare to
def test_sigterm_to_a_two_worker_run_stops_every_worker_and_resume_auto_equals(
    tmp_path, two_worker_run
):
    status, err, seconds = interrupt(train(tmp_path, 2), tmp_path, None)
    assert status == 143, err[-3000:]
    check_stopped(tmp_path, status, err, seconds)
    stopped = load_checkpoint(list_checkpoints(tmp_path / "checkpoints")[-1]).trainer
    assert stopped["step"] > 0 and stopped["epoch"] < 3
    subprocess.run(train(tmp_path, 2, "--resume", "auto"), check=True, capture_output=True)
    assert_same(final_weights(tmp_path), two_worker_run)


@pytest.mark.harness  # ~40 s in CI
def test_torchrun_max_restarts_with_a_worker_killed_twice_ends_as_the_whole_run(
    tmp_path, two_worker_run
):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", "--max_restarts=3", "-m", "unitrain.cli", "train"]
    command += [str(HERE / "_killed_twice.py"), "--backend", "torch", "--quiet"]
    command += ["--out", str(tmp_path), "--epochs", "3", "--set", "callbacks.0.patience=100"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("unitrain: training digits") == 3  # rank 0, once an attempt
    assert_same(final_weights(tmp_path), two_worker_run)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_at_random_moments(tmp_path, workers):
    trials = int(os.environ.get("UNITRAIN_PREEMPT_TRIALS", "100"))
    backend = "numpy" if workers == 1 else "torch"
    whole = tmp_path / "whole"
    started = time.monotonic()
    subprocess.run(train(whole, workers, backend=backend), check=True, capture_output=True)
    duration, reference = time.monotonic() - started, final_weights(whole)
    moments = random.Random(workers).sample(range(1000), trials)
    counts, slowest = {143: 0, 0: 0, -signal.SIGTERM: 0}, 0.0
    for trial, moment in enumerate(moments):
        out = tmp_path / f"t{trial}"
        # Start-up, training, saves and validation alike; the first run's duration includes
        # cold imports, so the moments span 0.8 of it to land mostly before the run ends.
        after = 0.8 * duration * moment / 1000
        status, err, seconds = interrupt(train(out, workers, backend=backend), out, after)
        check_stopped(out, status, err, seconds)
        counts[status] += 1
        slowest = max(slowest, seconds)
        print(f"trial {trial}: signal at {after:.2f}s, status {status}, {seconds:.2f}s", flush=True)
        if status != 0:
            again = train(out, workers, "--resume", "auto", backend=backend)
            resumed = subprocess.run(again, capture_output=True, text=True)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert_same(final_weights(out), reference)
    print(
        f"\n{workers} worker(s), {trials} signals: exit 143 {counts[143]}, finished before the "
        f"signal {counts[0]}, killed before start-up ended {counts[-signal.SIGTERM]}; "
        f"slowest exit {slowest:.2f}s after the signal (grace {GRACE_S:.0f}s)"
    )
