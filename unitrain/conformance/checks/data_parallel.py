"""data_parallel: N workers train like one worker with the global batch, and resume anywhere.

Only a backend that declares ``data_parallel`` is checked; any other is skipped with that
reason (two workers simulated in one process would pass while testing no engine at all). It
runs :mod:`unitrain.conformance._workers` on two workers through its own launcher
(``launch_command``); one without a launcher but with a ``launched_strategy()`` that answers
in process is run in process; one that offers neither fails, as it cannot have a second
worker. A run whose strategy turns out to be the core's simulated workers
(:class:`unitrain.backends.strategy.SimulatedWorkers`, the oracle's mode) is marked
*simulated* in its record and in the report's table. A launcher that exits 0 although a
worker did not finish fails, with the workers' own tracebacks. Against one worker with the
global batch:

- final weights agree within the ``step`` tolerance: float32 sums of slice gradients round
  differently from one batch's sum (about 1 ulp per update; the engines measured in issue
  13 differ by 6e-8 to 9e-8 after 20 steps), float64 agrees to 1e-12; the LR of every
  epoch, the epochs run and the early-stopping decision are identical;
- only rank 0 wrote: the log has one line per epoch, every checkpoint is valid;
- the same worker count resumes bit-identically; one worker resumes the two-worker
  checkpoint and ends as an uninterrupted one-worker run does (within tolerance);
- with dropout, two workers draw the masks two simulated workers draw (each slice keyed by
  its place in the oracle's order), so the final weights agree within the same tolerance; every
  worker numbering its slices from 0 repeats worker 0's masks and fails by orders of magnitude.

A loss that is each replica's mean under an engine that sums replicas (TF's trap), or a
second average on top of the engine's (JAX ``shard_map``'s), doubles or halves every
gradient: both fail the first comparison by orders of magnitude.

One process over several local devices (``LocalDevices`` of JAX and TensorFlow: one worker to the
Trainer, each batch split over the devices inside the step) is checked the same way against one
device, when the backend offers it (:class:`unitrain.backends.strategy.LocalDeviceParallel`): in a
fresh process, since devices must often exist before the framework starts, with the backend's
``local_devices_environment`` and its strategy made first thing. Dropout is not compared there: such
a strategy may draw one worker's masks (JAX) or N workers' (TensorFlow).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from unitrain.backends.strategy import DataParallel, LocalDeviceParallel
from unitrain.checkpoint import list_checkpoints, load_checkpoint
from unitrain.conformance import _workers
from unitrain.conformance._context import Context
from unitrain.conformance._registry import check
from unitrain.conformance._runner import importable

WORKERS = 2
#: Two workers run the experiment in every dtype in 10-30 s on a busy 2-core CPU; a hang
#: ends here.
LAUNCH_TIMEOUT_S = 240


def _run_workers(ctx: Context, out: Path) -> Path:
    """The experiment on two workers (launched or in process); its directory."""
    launcher = getattr(ctx.backend.factory, "launch_command", None)
    if launcher is not None:
        runs = launched(ctx, "workers", [*launcher(WORKERS)], [], {}, f"{WORKERS} workers")
    else:
        probe = ctx.make(_workers_model())
        ctx.require(
            isinstance(probe, DataParallel),
            "the backend declares capability 'data_parallel' but offers neither "
            "launch_command(workers) nor launched_strategy(): the kit cannot start a second "
            "worker",
            "a capability declared without the methods it stands for",
        )
        _workers.experiment(ctx.backend.factory, ctx.dtype, out)
        runs = out
    _name_simulated(ctx, runs)
    return runs


def _name_simulated(ctx: Context, runs: Path) -> None:
    """Mark the check simulated when the workers' strategy was the core's simulated one."""
    outcome = _workers.read_result(runs / "a")[1]
    if outcome.get("simulated"):
        ctx.simulated = True
        ctx.notes.append(
            f"simulated: the {outcome['world_size']} workers were {outcome['strategy']} in one "
            "process (the core's SimulatedWorkers), so no engine's reduction was tested"
        )


def _run_local_devices(ctx: Context) -> Path:
    """The experiment in a fresh process on the backend's local-devices strategy."""
    factory = ctx.backend.factory
    if not isinstance(factory, LocalDeviceParallel):
        ctx.skip(
            "the backend offers no one-process strategy over local devices (the optional "
            "local_devices_environment and local_devices_strategy of LocalDeviceParallel)"
        )
    # mypy does not narrow a Callable by the isinstance check of a Protocol above
    environment = factory.local_devices_environment(WORKERS)  # type: ignore[attr-defined]
    arguments = [f"--local-devices={WORKERS}"]
    label = f"one process on {WORKERS} local devices"
    return launched(ctx, "local", [sys.executable], arguments, environment, label)


#: Launched runs by (kind, backend target, device), kept until the process exits.
_LAUNCHED: dict[tuple[str, str, str], Path] = {}


def launched(  # also the sharded family's
    ctx: Context,
    kind: str,
    prefix: list[str],
    arguments: list[str],
    environment: dict[str, str],
    label: str,
) -> Path:
    """``prefix -m unitrain.conformance._workers`` run once for every dtype (starting a
    framework takes seconds); this dtype's directory."""
    key = (kind, ctx.backend.target, ctx.device)
    reason = importable(ctx.backend.target)
    if reason is not None:
        ctx.require(False, reason)
    if key not in _LAUNCHED:
        out = Path(tempfile.mkdtemp(prefix=f"unitrain-data-parallel-{kind}-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        dtypes = ",".join(ctx.backend.capabilities.dtypes)
        command = [*prefix, "-m", "unitrain.conformance._workers", *arguments]
        command += [ctx.backend.target, dtypes, str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **environment}
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env
            )
        except subprocess.TimeoutExpired:
            ctx.require(
                False,
                f"{label} did not finish in {LAUNCH_TIMEOUT_S} s",
                "a worker waiting for another that died or never started (a collective, a "
                "rendezvous)",
            )
        expected = 1 if kind.startswith("local") else WORKERS  # else one process a worker
        failures = _unfinished(out, dtypes.split(","), expected)
        if done.returncode != 0:
            ctx.require(False, _launch_failure(label, done, failures, out), _WORKER_FAILED)
        if failures:
            likely = "a launcher that exits 0 although a worker failed or never ran"
            ctx.require(False, _launch_failure(label, done, failures, out), likely)
        _LAUNCHED[key] = out
    return _LAUNCHED[key] / ctx.dtype


_WORKER_FAILED = "a worker that failed: its error is quoted above"
_ERROR = re.compile(r"(Error|Exception|Signal \d+|exitcode)\b")


def _unfinished(out: Path, dtypes: list[str], workers: int) -> list[str]:
    """``"float32: worker 1 of 2"``-like entries for every worker that did not finish."""
    missing = []
    for dtype in dtypes:
        ranks = sorted(set(range(workers)) - _workers.finished_ranks(out / dtype))
        if ranks:
            names = ", ".join(str(r) for r in ranks)
            missing.append(f"{dtype}: worker{'s' if len(ranks) > 1 else ''} {names} of {workers}")
    return missing


def _launch_failure(
    label: str, done: subprocess.CompletedProcess[str], failures: list[str], out: Path
) -> str:
    """What went wrong with a launch: the exit status, which workers did not finish, and the
    workers' own tracebacks (they say more than a launcher's summary), else its output."""
    if done.returncode != 0:
        head = f"{label} failed (exit {done.returncode})"
    else:  # a launcher that reports success for workers that died or never ran
        head = f"{label} exited 0, but not every worker finished ({'; '.join(failures)})"
    tracebacks = _workers.worker_errors(out)
    if tracebacks:
        detail = "\n".join(text.strip().splitlines()[-1] for text in tracebacks)
        detail = f"the workers' errors:\n{detail}\n{tracebacks[0].strip()[-1500:]}"
    else:
        errors = [line for line in done.stderr.splitlines() if _ERROR.search(line)]
        output = "\n".join(errors[-6:]) or (done.stderr + done.stdout)[-1500:]
        detail = f"the launcher's output:\n{output.strip() or '(none)'}"
    return f"{head}; {detail}"


def _workers_model() -> Any:
    from unitrain.models import MLP

    return MLP((6, 16, 3), activation="tanh")


def _history(outcome: dict[str, Any]) -> list[tuple[int, int, float]]:
    return [(row["epoch"], row["step"], row["lr"]) for row in outcome["history"]]


def against_one(ctx: Context, runs: Path, single: Path, spread: str, one: str) -> tuple[Any, ...]:
    """Hold run ``a`` of ``runs`` to run ``a`` of ``single`` (final state within tolerance,
    the same epochs, steps and LRs) and its resumed run ``b`` to run ``a`` bit for bit.

    Returns:
        Run ``a``'s outcome, and the single run's final state and outcome.
    """
    state, outcome = _workers.read_result(runs / "a")
    reference, reference_outcome = _workers.read_result(single / "a")
    ctx.compare(f"final state, {spread} vs {one}", state, reference, "step")
    ctx.require_equal(
        "epochs, steps and LRs (early stopping)", _history(outcome), _history(reference_outcome)
    )
    resumed, resumed_outcome = _workers.read_result(runs / "b")
    ctx.require_identical(f"{spread} resumed on as many vs uninterrupted", resumed, state)
    ctx.require_equal("resumed history", _history(resumed_outcome), _history(outcome))
    return outcome, reference, reference_outcome


@check(
    "data_parallel",
    "workers_match_global_batch",
    requires=("data_parallel",),
    guards="gradients summed or averaged once too often over workers (per-replica mean loss, "
    "a pmean on shard_map's sum), a second writer, a resume that depends on the worker count",
)
def workers_match_global_batch(ctx: Context) -> None:
    """2 workers x batch slices equal 1 worker x global batch; rank 0 alone writes; resume."""
    if ctx.device != "cpu":
        ctx.skip("the kit launches data-parallel workers on the CPU only")
    parallel, single = _run_workers(ctx, ctx.path("workers")), ctx.path("single")
    _workers.experiment(ctx.backend.factory, ctx.dtype, single, strategy=1)
    outcome, reference, reference_outcome = against_one(
        ctx, parallel, single, f"{WORKERS} workers", "1 with the global batch"
    )
    ctx.require_equal("workers that took part", outcome["world_size"], WORKERS)

    lines = (parallel / "a" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ctx.require_equal("log lines (one writer)", len(lines), len(outcome["history"]))
    for path in list_checkpoints(parallel / "a" / "checkpoints"):
        load_checkpoint(path)  # raises on a torn or doubly written checkpoint

    checkpoint = _workers.resume_point(parallel / "a")
    one = _workers.train(ctx.backend.factory, ctx.dtype, ctx.path("one"), 1, resume=checkpoint)
    ctx.compare(
        "2-worker checkpoint resumed on 1 worker vs 1 worker throughout",
        one.backend.state_dict(),
        reference,
        "step",
    )
    ctx.require_equal(
        "position after resuming on 1 worker",
        (one.state.epoch, one.state.step),
        (reference_outcome["epoch"], reference_outcome["step"]),
    )


@check(
    "data_parallel",
    "workers_draw_the_oracles_dropout",
    requires=("data_parallel",),
    guards="every worker drawing the same dropout masks (each numbering its slices from 0), "
    "masks keyed by anything but the slice's place in the simulated workers' order",
)
def workers_draw_the_oracles_dropout(ctx: Context) -> None:
    """With dropout, 2 workers end where 2 simulated workers do: distinct masks per worker."""
    if ctx.device != "cpu":
        ctx.skip("the kit launches data-parallel workers on the CPU only")
    parallel = _run_workers(ctx, ctx.path("workers"))
    state, outcome = _workers.read_result(parallel / "c")
    oracle = _workers.train(
        ctx.backend.factory, ctx.dtype, ctx.path("simulated"), WORKERS, dropout=_workers.DROPOUT
    )
    ctx.compare(
        f"final state with dropout {_workers.DROPOUT}, 2 workers vs 2 simulated workers",
        state,
        oracle.backend.state_dict(),
        "step",
    )
    ctx.require_equal(
        "epochs, steps and LRs with dropout (early stopping)",
        _history(outcome),
        _history({"history": oracle.history}),
    )


@check(
    "data_parallel",
    "local_devices_match_global_batch",
    requires=("data_parallel",),
    guards="replicas of one process whose gradients are averaged where the engine sums them "
    "(MirroredStrategy with each replica's mean loss) or summed twice, a resume that depends "
    "on the device count",
)
def local_devices_match_global_batch(ctx: Context) -> None:
    """One process on 2 local devices equals 1 device with the same batch; resume exact."""
    if ctx.device != "cpu":
        ctx.skip("the kit splits the CPU into local devices only")
    spread, single = _run_local_devices(ctx), ctx.path("single")
    _workers.experiment(ctx.backend.factory, ctx.dtype, single, 1, local_devices=True)
    against_one(ctx, spread, single, f"{WORKERS} local devices", "1")
