"""SIGKILL at random moments, in the middle of checkpoint writes too, then resume "latest".

Each trial runs ``unitrain train`` (the default recipe, on CPU) in a subprocess as a user
would, with ``UNITRAIN_CHECKPOINT_WRITE_DELAY`` making the writer pause after each file so
that a good share of the kills land inside a checkpoint write. It kills the process with
SIGKILL at a uniformly random moment of its training time (or, for every second kill of a
trial, at a random moment of a checkpoint write), then checks, after every kill:

- every checkpoint that ``list_checkpoints`` reports verifies (0 corrupt checkpoints), and
  is bit-identical to the checkpoint of the same name of an uninterrupted run;
- ``metrics.jsonl`` holds every epoch line written before the newest checkpoint (a kill loses
  at most the line in flight), and every complete line equals the uninterrupted run's.

Then it resumes with ``--resume latest`` (taking over the dead run's stale lock) until the run
completes, and the final checkpoints and metrics must be bit-identical to the uninterrupted
run's. ``pytest -m harness`` does 5 kills per backend in one trial (each resumed run is killed
again, and the last one finishes; a run that ends before its kill time starts a new trial);
``pytest -m slow tests/training/test_kill_resume.py`` does independent trials of one kill and one
resume each until ``UNITRAIN_KILL_TRIALS`` (default 50) kills have landed, every second one
aimed inside a checkpoint write. Both assert that some kills did land inside a write.
``UNITRAIN_HARDENING_REPORT=<dir>`` writes each test's figures there as JSON.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _backends import backends

from unitrain.checkpoint import list_checkpoints, load_checkpoint, verify_checkpoint

EPOCHS = 4
WRITE_DELAY = 0.04  # seconds after each of the 5 files of a checkpoint
TIMEOUT = 300


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        PYTHONHASHSEED="0",
        PYTHONUNBUFFERED="1",  # the "training" line arrives when printed
        OMP_NUM_THREADS="1",  # torch with two threads on two busy cores crawls
        TF_CPP_MIN_LOG_LEVEL="2",
        UNITRAIN_CHECKPOINT_WRITE_DELAY=str(WRITE_DELAY),
    )
    return env


def launch(backend: str, out: Path) -> tuple[subprocess.Popen[str], float]:
    """Start ``unitrain train --resume latest``; return it once it prints that it trains."""
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", backend]
    command += ["--device", "cpu", "--epochs", str(EPOCHS), "--out", str(out)]
    command += ["--resume", "latest"]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "stderr.log", "ab") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment()
        )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], TIMEOUT)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("unitrain: training"):
        process.kill()
        drain(process)
        raise AssertionError(f"{command} did not start: {(out / 'stderr.log').read_text()}")
    return process, time.time()  # wall clock, to compare with the files' modification times


def drain(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    with process.stdout:
        process.stdout.read()
    return process.wait(TIMEOUT)


def finish(process: subprocess.Popen[str], out: Path) -> None:
    """Wait for a run that is not killed; it must succeed."""
    assert drain(process) == 0, (out / "stderr.log").read_text()[-3000:]


def kill_at(process: subprocess.Popen[str], started: float, delay: float) -> bool:
    """SIGKILL ``process`` ``delay`` seconds after ``started``; False if it ended first."""
    time.sleep(max(0.0, started + delay - time.time()))
    process.send_signal(signal.SIGKILL)
    return drain(process) == -signal.SIGKILL


def kill_in_a_write(process: subprocess.Popen[str], directory: Path, delay: float) -> bool:
    """SIGKILL ``process`` ``delay`` seconds after a checkpoint write starts; False if it ended
    first. A write starts with a hidden ``.{name}.tmp-{pid}-*`` staging directory; one with
    another pid is a killed run's leftover, which the new run deletes soon after it starts."""
    staging = f".tmp-{process.pid}-"
    while process.poll() is None:
        names = os.listdir(directory) if directory.exists() else []
        if any(staging in name and not name.startswith(".unitrain.lock") for name in names):
            time.sleep(delay)
            break
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    code = drain(process)
    assert code in (0, -signal.SIGKILL), code
    return code == -signal.SIGKILL


# -- what a run leaves behind ------------------------------------------------------------------


def stable_trainer_state(info: dict[str, Any]) -> dict[str, Any]:
    """trainer.json without what legitimately differs between two identical runs."""
    info = json.loads(json.dumps(info))
    for row in info.get("history", []):
        row.pop("seconds", None)
    # The metrics file's length depends on how many digits each line's "seconds" has.
    info.get("callbacks", {}).get("JSONLLogger", {}).pop("offset", None)
    info.get("config", {}).pop("checkpoint_dir", None)
    # Each run draws its own id; a killed run's resumptions keep its id and generation, and
    # the generation (0) and parent (none) are compared: the run never branched.
    info.get("run", {}).pop("id", None)
    return info


def snapshot(checkpoint: Path) -> dict[str, Any]:
    loaded = load_checkpoint(checkpoint)
    tensors = {}
    for part in ("model", "optimizer", "callbacks"):
        for name, array in getattr(loaded, part).items():
            tensors[f"{part}.{name}"] = (array.dtype.str, array.shape, array.tobytes())
    return {"tensors": tensors, "trainer": stable_trainer_state(loaded.trainer)}


def differences(got: Any, expected: Any, prefix: str = "") -> list[str]:
    """The paths at which two snapshots (or metric rows) differ, for a readable failure."""
    if isinstance(got, dict) and isinstance(expected, dict):
        found = []
        for key in sorted(set(got) | set(expected), key=str):
            if key not in got or key not in expected:
                found.append(f"{prefix}{key} (present in one only)")
            else:
                found += differences(got[key], expected[key], f"{prefix}{key}.")
        return found
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return [
            d
            for i, (a, b) in enumerate(zip(got, expected))
            for d in differences(a, b, f"{prefix}{i}.")
        ]
    return [] if got == expected else [f"{prefix[:-1]}: {got!r:.60} != {expected!r:.60}"]


def metric_lines(out: Path) -> tuple[list[dict[str, Any]], str]:
    """Complete lines of metrics.jsonl (without "seconds") and the partial last line, if any."""
    file = out / "metrics.jsonl"
    text = file.read_text(encoding="utf-8") if file.exists() else ""
    *complete, partial = text.split("\n")
    rows = [json.loads(line) for line in complete]
    assert len({row.pop("run_id") for row in rows}) <= 1, "a killed run resumed as another run"
    for row in rows:
        row.pop("seconds")
    return rows, partial


class Reference:
    """The uninterrupted run: its checkpoints, metric lines and training time.

    The training time ends when the last checkpoint's files are written, not when the process
    exits: the interpreter's and the framework's shutdown took more than half of the run's
    2.2 s on torch, and kill times drawn over that tail killed finished runs, which left
    nothing to resume and no write to aim at (a CI run's five trials then ended one kill
    each, none inside a write).
    """

    def __init__(self, backend: str, out: Path) -> None:
        process, started = launch(backend, out)
        finish(process, out)
        directory = out / "checkpoints"
        last = list_checkpoints(directory)[-1]
        self.seconds = max(file.stat().st_mtime for file in last.iterdir()) - started
        self.checkpoints = {p.name: snapshot(p) for p in list_checkpoints(directory)}
        self.metrics, partial = metric_lines(out)
        assert partial == "" and len(self.metrics) == EPOCHS
        assert sorted(self.checkpoints)[-1] == "epoch=0004-step=000180"


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    """Built lazily, one backend at a time, so a worker builds only those it tests."""

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, backend: str) -> Reference:
            self[backend] = Reference(backend, tmp_path_factory.mktemp(f"reference-{backend}"))
            return self[backend]

    return Lazy()


def check_after_kill(out: Path, reference: Reference, report: dict[str, Any]) -> int:
    """No checkpoint is corrupt or differs from the reference; no finished line is lost.

    Returns:
        The epochs done by the newest checkpoint, where a resume continues.
    """
    directory = out / "checkpoints"
    newest_epoch = 0
    for checkpoint in list_checkpoints(directory):
        verify_checkpoint(checkpoint)  # a CheckpointError here fails the test
        name = checkpoint.name
        if name.startswith("."):  # a copy displaced by a replacement the kill interrupted
            name = name[1:].split(".old-")[0]
        got = snapshot(checkpoint)
        if name in reference.checkpoints:
            found = differences(got, reference.checkpoints[name])
            assert not found, f"{checkpoint} differs from the reference: {found[:5]}"
        newest_epoch = max(newest_epoch, got["trainer"]["epoch"])
    names = os.listdir(directory) if directory.exists() else []
    hidden = [name for name in names if not name.startswith(".unitrain.lock")]
    if any(kind in name for name in hidden for kind in (".tmp-", ".old-", ".del-")):
        report["kills_inside_a_write"] += 1  # staging, replacing or deleting a checkpoint
    rows, partial = metric_lines(out)
    found = differences(rows, reference.metrics[: len(rows)])
    assert not found, f"metrics.jsonl differs from the reference: {found[:5]}"
    # The logger writes an epoch's line before that epoch's checkpoint is saved.
    assert len(rows) >= newest_epoch, f"{newest_epoch - len(rows)} finished metrics lines lost"
    report["partial_metric_lines"] += partial != ""
    return newest_epoch


def check_final(out: Path, reference: Reference) -> None:
    got = {p.name: snapshot(p) for p in list_checkpoints(out / "checkpoints")}
    assert sorted(got) == sorted(reference.checkpoints)
    for name, value in reference.checkpoints.items():
        found = differences(got[name], value)
        assert not found, f"{name} is not bit-identical to the uninterrupted run's: {found[:5]}"
    rows, partial = metric_lines(out)
    assert partial == "" and not differences(rows, reference.metrics), differences(
        rows, reference.metrics
    )[:5]
    # The last run took over the lock and deleted what killed saves and removals left.
    hidden = [n for n in os.listdir(out / "checkpoints") if n.startswith(".")]
    assert not [n for n in hidden if ".unitrain.lock" in n or ".tmp-" in n or ".del-" in n]
    assert all(n[1:].split(".old-")[0] not in os.listdir(out / "checkpoints") for n in hidden)


def run_trial(
    backend: str,
    out: Path,
    reference: Reference,
    kills: int,
    rng: np.random.Generator,
    first_in_a_write: bool = False,
) -> dict[str, Any]:
    """Kill ``kills`` successive runs at random moments, then let the last one finish.

    Every other kill time is uniform over the training time the run has left (the
    uninterrupted run's, scaled by the share of epochs the newest checkpoint has not done);
    the others come at a uniform moment of the first checkpoint write the run starts
    (``first_in_a_write`` starts with one of those).
    """
    report = {"kills": 0, "kills_inside_a_write": 0, "partial_metric_lines": 0}
    done = 0
    while report["kills"] < kills:
        process, started = launch(backend, out)
        left = reference.seconds * (EPOCHS - done) / EPOCHS
        if (report["kills"] + first_in_a_write) % 2:
            write = 5 * WRITE_DELAY  # five files, a pause after each
            killed = kill_in_a_write(process, out / "checkpoints", float(rng.uniform(0, write)))
        else:
            killed = kill_at(process, started, float(rng.uniform(0.0, 0.9 * left)))
        if not killed:
            break  # it finished before the kill: the run is complete
        report["kills"] += 1
        done = check_after_kill(out, reference, report)
    process, _ = launch(backend, out)
    finish(process, out)
    check_final(out, reference)
    return report


def write_report(name: str, figures: dict[str, Any]) -> None:
    directory = os.environ.get("UNITRAIN_HARDENING_REPORT")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(figures, indent=2))


def _seed() -> int:
    return int(os.environ.get("UNITRAIN_KILL_SEED") or np.random.SeedSequence().entropy % 2**32)


@pytest.mark.harness  # CI: TensorFlow ~70 s, torch ~55, JAX ~45, numpy ~20
@pytest.mark.parametrize("backend", backends())
def test_five_sigkills_in_a_row_then_resume_is_bit_identical(backend, tmp_path, references):
    seed = _seed()
    rng = np.random.default_rng(seed)
    totals = {"trials": 0, "kills": 0, "kills_inside_a_write": 0}
    # A run that ends before its kill time ends its trial early (rarely): start another.
    # Every trial's checkpoints verify and its finished run is bit-identical to the
    # uninterrupted one, or run_trial fails; what is left to assert is that the kills
    # happened, and that some of them landed inside a checkpoint write (every second kill
    # is aimed there), which is the case the atomic writes exist for.
    # Up to ten trials: on a loaded machine a run can outpace its kill time more than once.
    while totals["kills"] < 5 and totals["trials"] < 10:
        out = tmp_path / f"trial{totals['trials']}"
        report = run_trial(backend, out, references[backend], 5 - totals["kills"], rng)
        totals["trials"] += 1
        for key in ("kills", "kills_inside_a_write"):
            totals[key] += report[key]
    write_report(f"kill-ci-{backend}", {"seed": seed, **totals})
    assert totals["kills"] >= 5, f"seed {seed}: {totals}"
    assert totals["kills_inside_a_write"] >= 1, f"seed {seed}: no kill hit a write: {totals}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends())
def test_many_sigkill_trials_are_bit_identical(backend, tmp_path, references):
    trials = int(os.environ.get("UNITRAIN_KILL_TRIALS", "50"))
    seed = _seed()
    rng = np.random.default_rng(seed)
    totals = {"trials": 0, "kills": 0, "kills_inside_a_write": 0, "partial_metric_lines": 0}
    started = time.perf_counter()
    # run_trial fails on a checkpoint that does not verify or a finished run that is not
    # bit-identical to the uninterrupted one; the counts say what the trials exercised.
    while totals["kills"] < trials and totals["trials"] < 2 * trials:
        out = tmp_path / f"trial{totals['trials']}"
        aim = totals["trials"] % 2 == 1  # every second trial kills inside a checkpoint write
        report = run_trial(backend, out, references[backend], 1, rng, first_in_a_write=aim)
        totals["trials"] += 1
        for key in ("kills", "kills_inside_a_write", "partial_metric_lines"):
            totals[key] += report[key]
    totals["seconds"] = round(time.perf_counter() - started, 1)
    write_report(f"kill-slow-{backend}", {"seed": seed, **totals})
    assert totals["kills"] >= trials, f"seed {seed}: {totals}"
    assert totals["kills_inside_a_write"] >= max(1, trials // 4), f"seed {seed}: {totals}"
