"""Data-parallel figures of issue 13: digits on 2 workers vs 1, resume, SIGKILL, W1 throughput.

``python benchmarks/data_parallel.py digits --backend torch --out /tmp/dp`` trains the digits
recipe (``unitrain train``) for 10 epochs on 2 workers and on 1, and prints the final
weights' relative difference and both early-stopping outcomes; resumes the 2-worker
checkpoint after epoch 8 on 2 workers (must be bit-identical) and on 1 worker (against the
1-worker run); kills one worker of a third run with SIGKILL after its first checkpoint,
checks every checkpoint left behind, resumes with ``--resume latest`` and compares.

``python benchmarks/data_parallel.py throughput --backend torch`` trains W1
(:mod:`benchmarks.workloads`) on 1 and then 2 single-threaded workers in the same run and
prints examples per second of each (timed after a first, warm-up epoch); then, with every
part of a step timed to completion (which slows JAX, whose calls otherwise overlap), where a
step's time goes on 1 and on 2 workers: forward and backward, the gradient all-reduce, the
rest of the update, and the Trainer around them.

``python benchmarks/data_parallel.py local-devices --backend tensorflow`` trains the digits
recipe for 10 epochs on ``LocalDevices(2)`` (two logical CPUs, or for JAX two host devices)
and on one device in one process, and prints the final weights' relative difference, both
early-stopping outcomes and both times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: One thread per worker in every framework, so N workers use N cores.
SINGLE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "PYTHONWARNINGS": "ignore",
}


def _train(backend: str, workers: int, out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", backend]
    command += ["--device", "cpu", "--workers", str(workers), "--out", str(out), *extra]
    env = {**os.environ, **SINGLE_THREAD}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _final(out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from unitrain.checkpoint import list_checkpoints, load_checkpoint

    checkpoint = load_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    return checkpoint.model, checkpoint.trainer


def _relative(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    diff = np.sqrt(sum(float(np.sum((a[k] - b[k]) ** 2.0)) for k in b))
    return diff / np.sqrt(sum(float(np.sum(b[k] ** 2.0)) for k in b))


def _identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in b)


def _outcome(info: dict[str, Any]) -> str:
    return f"epoch {info['epoch']}, step {info['step']}, stopped early {info['stop_training']}"


def _checkpoint_after(out: Path, epoch: int) -> Path:
    from unitrain.checkpoint import list_checkpoints

    for path in list_checkpoints(out / "checkpoints"):
        info = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
        if info["epoch"] == epoch and info["batch"] == 0:
            return path
    raise SystemExit(f"no checkpoint after epoch {epoch} in {out}")


def _descendant_with(root: int, marker: str) -> int | None:
    """A process under ``root`` with the environment entry ``marker`` (``RANK=1``), or, for a
    marker ending in ``=``, an entry of that name containing ``'"index": 1}'`` (TF_CONFIG)."""
    pending, seen = [root], set()
    while pending:
        pid = pending.pop()
        seen.add(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        entries = [entry.decode(errors="replace") for entry in environ]
        if pid != root and any(_matches(entry, marker) for entry in entries):
            return pid
        pending += [int(c) for c in children if int(c) not in seen]
    return None


def _matches(entry: str, marker: str) -> bool:
    if marker.endswith("="):
        return entry.startswith(marker) and '"index": 1}' in entry
    return entry == marker


def _rank_one_marker(backend: str) -> str:
    return {"torch": "RANK=1", "jax": "UNITRAIN_RANK=1"}.get(backend, "TF_CONFIG=")


def _kill_one_worker(backend: str, out: Path) -> tuple[int, str]:
    """Start 2 workers, SIGKILL rank 1 once a checkpoint exists; the launcher's status/error."""
    command = [sys.executable, "-m", "unitrain.cli", "train", "--backend", backend]
    command += ["--device", "cpu", "--workers", "2", "--out", str(out)]
    job = subprocess.Popen(
        command,
        env={**os.environ, **SINGLE_THREAD},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = _rank_one_marker(backend)
    victim = None
    while job.poll() is None and victim is None:
        if any((out / "checkpoints").glob("epoch=*")):
            victim = _descendant_with(job.pid, marker)
        time.sleep(0.05)
    if victim is not None:
        os.kill(victim, signal.SIGKILL)
    _, stderr = job.communicate(timeout=300)
    lines = [line for line in stderr.splitlines() if "worker" in line or "rank" in line]
    return job.returncode, "\n".join(lines[-4:])


def digits(backend: str, out: Path) -> None:
    """Print the digits figures for ``backend``; see the module doc."""
    shutil.rmtree(out, ignore_errors=True)
    report: dict[str, Any] = {"backend": backend}
    for workers in (2, 1):
        done = _train(backend, workers, out / f"w{workers}")
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
    two, two_info = _final(out / "w2")
    one, one_info = _final(out / "w1")
    report["2 vs 1 workers: final weights relative difference"] = _relative(two, one)
    report["2 workers"] = _outcome(two_info)
    report["1 worker"] = _outcome(one_info)
    decisions = [(i["epoch"], i["stop_training"], len(i["history"])) for i in (two_info, one_info)]
    report["same early-stopping decisions"] = decisions[0] == decisions[1]
    resume_epoch = two_info["epoch"] - 2
    checkpoint = _checkpoint_after(out / "w2", resume_epoch)
    for workers in (2, 1):
        target = out / f"resume-2to{workers}"
        done = _train(backend, workers, target, "--resume", str(checkpoint))
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        resumed, info = _final(target)
        key = f"resume 2->{workers} from epoch {resume_epoch}"
        if workers == 2:
            report[f"{key}: bit-identical to uninterrupted 2 workers"] = _identical(resumed, two)
        else:
            report[f"{key}: relative difference to 1 worker throughout"] = _relative(resumed, one)
        report[f"{key}: ends at"] = _outcome(info)
    kill_and_resume(backend, out, report)
    print(json.dumps(report, indent=2))


def kill_and_resume(backend: str, out: Path, report: dict[str, Any]) -> None:
    """SIGKILL worker 1 of a 2-worker run, check its checkpoints, resume, compare."""
    two, _ = _final(out / "w2")
    killed = out / "killed"
    shutil.rmtree(killed, ignore_errors=True)
    status, message = _kill_one_worker(backend, killed)
    report["SIGKILL of worker 1: launcher status"] = status
    report["SIGKILL of worker 1: error"] = message
    from unitrain.checkpoint import list_checkpoints, load_checkpoint

    left = list_checkpoints(killed / "checkpoints")
    for path in left:
        load_checkpoint(path)  # raises on any damaged checkpoint
    report["SIGKILL: valid checkpoints left"] = [p.name for p in left]
    done = _train(backend, 2, killed, "--resume", "latest")
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    resumed, _ = _final(killed)
    report["SIGKILL then --resume latest: bit-identical to uninterrupted"] = _identical(
        resumed, two
    )


def _stopping(trainer: Any) -> tuple[int, bool]:
    """The epochs run and whether early stopping ended them."""
    return trainer.state.epoch, trainer.state.stop_training


def local_devices(backend: str) -> None:
    """Digits for 10 epochs on ``LocalDevices(2)`` and on one device; print the figures."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # before JAX starts
    from importlib import import_module

    from unitrain.recipes import default_trainer

    # Made first: TensorFlow splits its CPU only before its runtime starts.
    devices = import_module(f"unitrain.backends.{backend}").LocalDevices(2)
    runs, seconds = {}, {}
    for name, strategy in (("2 devices", devices), ("1 device", None)):
        trainer, train, val = default_trainer(
            backend=backend, device="cpu", epochs=10, strategy=strategy, progress=False
        )
        started = time.perf_counter()
        trainer.fit(train, val)
        seconds[name] = round(time.perf_counter() - started, 2)
        runs[name] = trainer
    two, one = (runs[name] for name in ("2 devices", "1 device"))
    weights = [
        {k: v for k, v in run.backend.state_dict().items() if k.startswith("model.")}
        for run in (two, one)
    ]
    report = {
        "backend": backend,
        "2 vs 1 device: final weights relative difference": _relative(*weights),
        "2 devices": f"epoch {two.state.epoch}, step {two.state.step}, "
        f"stopped early {two.state.stop_training}",
        "1 device": f"epoch {one.state.epoch}, step {one.state.step}, "
        f"stopped early {one.state.stop_training}",
        "same early-stopping decisions": _stopping(two) == _stopping(one),
        "seconds to train": seconds,
    }
    print(json.dumps(report, indent=2))


def _w1_worker(epochs: int, profile: bool = False) -> None:
    """Train W1 on the workers this process belongs to; rank 0 prints examples per second."""
    from benchmarks.step_timers import StepTimers
    from benchmarks.workloads import LEARNING_RATE, MOMENTUM, WORKLOADS, make_data
    from unitrain import Trainer, TrainerConfig, models, schedules
    from unitrain.optim import SGD

    workload = WORKLOADS["W1"]
    x, y = make_data(workload)
    times: list[float] = []
    timers: StepTimers | None = None

    class Clock:
        def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
            times.append(time.perf_counter())
            if timers is not None and epoch == 1:  # the first epoch compiles and warms up
                timers.seconds.clear()

        def on_train_end(self, trainer: Any) -> None:
            times.append(time.perf_counter())

    backend = os.environ["UNITRAIN_BENCH_BACKEND"]
    trainer = Trainer(
        models.MLP(workload.sizes),
        backend=backend,
        optimizer=SGD(momentum=MOMENTUM),
        schedule=schedules.Constant(LEARNING_RATE),
        callbacks=[Clock()],
        config=TrainerConfig(
            epochs=epochs, batch_size=workload.batch_size, device="cpu", log_every_n_steps=32
        ),
    )
    if profile:
        timers = StepTimers(trainer.backend)
        timers.attach(trainer)
    trainer.fit((x, y))
    if trainer.strategy.is_main:
        seconds = times[-1] - times[1]  # after the first epoch: compilation and warm-up
        rate = (epochs - 1) * workload.num_examples / seconds
        result: dict[str, Any] = {"workers": trainer.strategy.world_size, "examples_per_s": rate}
        if timers is not None:
            steps = (epochs - 1) * workload.steps_per_epoch
            result["ms per step"] = timers.report(seconds, steps)
        print(json.dumps(result))


def throughput(backend: str, epochs: int) -> None:
    """W1 examples per second on 1 and on 2 single-threaded workers, in this one run."""
    from unitrain.backends.registry import get_backend

    env = {**os.environ, **SINGLE_THREAD, "UNITRAIN_BENCH_BACKEND": backend}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    program = [__file__, "w1-worker", "--epochs", str(epochs)]

    def run(workers: int, *extra: str) -> dict[str, Any]:
        launcher = [sys.executable]
        if workers > 1:
            launcher = get_backend(backend).launch_command(workers)
        done = subprocess.run(
            [*launcher, *program, *extra], capture_output=True, text=True, env=env
        )
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        return json.loads([row for row in done.stdout.splitlines() if row.startswith("{")][-1])

    rates = {workers: run(workers)["examples_per_s"] for workers in (1, 2)}
    profiles = {workers: run(workers, "--profile")["ms per step"] for workers in (1, 2)}
    # The control: two independent one-worker runs at once, no communication. What they add
    # up to is what this machine gives two processes; the gap to it is the engine's cost.
    jobs = [
        subprocess.Popen([sys.executable, *program], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    together = sum(
        json.loads(job.communicate()[0].splitlines()[-1])["examples_per_s"] for job in jobs
    )
    print(
        json.dumps(
            {
                "backend": backend,
                "W1 examples/s": rates,
                "speed-up": rates[2] / rates[1],
                "two independent 1-worker runs at once, examples/s together": together,
                "ms per step, every part timed to completion (by workers)": profiles,
                "load average at the end": os.getloadavg(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "what", choices=("digits", "kill", "throughput", "local-devices", "w1-worker")
    )
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--out", default="/tmp/unitrain-data-parallel")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--profile", action="store_true", help="w1-worker: time each part")
    args = parser.parse_args()
    if args.what == "digits":
        digits(args.backend, Path(args.out) / args.backend)
    elif args.what == "kill":  # again, on the 2-worker run of an earlier ``digits``
        report: dict[str, Any] = {"backend": args.backend}
        kill_and_resume(args.backend, Path(args.out) / args.backend, report)
        print(json.dumps(report, indent=2))
    elif args.what == "throughput":
        throughput(args.backend, args.epochs)
    elif args.what == "local-devices":
        local_devices(args.backend)
    else:
        _w1_worker(args.epochs, args.profile)


if __name__ == "__main__":
    main()
